"""Planning decisions: caps, new partitions, retention gaps, recreated topics, lag."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.kafka.cluster import Watermarks
from cairn.pipeline import archive_run
from cairn.protocol.plan import (
    ArchiveElsewhere,
    OffsetAheadOfKafka,
    PartitionVanished,
    Plan,
    RetentionGap,
    Span,
    TopicRecreated,
    kafka_source_options,
    lag,
    plan,
)
from cairn.protocol.tokens import Gap
from cairn.storage.objects import Storage
from tests.unit.conftest import commit_next, make_token

NOW = datetime(2024, 5, 1, tzinfo=UTC)


def wm(**partitions: tuple[int, int]) -> dict[int, Watermarks]:
    return {int(p[1:]): Watermarks(*lh) for p, lh in partitions.items()}


def make(tok, partitions, cap=1000, start="earliest", accept_gaps=False) -> Plan:
    return plan("orders", tok, partitions, cap, start, accept_gaps)


def test_first_run_reads_from_earliest_up_to_the_high_watermark():
    p = make(None, wm(p0=(5, 50), p1=(0, 0)))

    assert p.ranges == {0: (5, 50), 1: (0, 0)}
    assert p.to_read == {0: (5, 50)}
    assert not p.empty and not p.capped and p.gaps == []
    assert p.next_offsets == {0: 50, 1: 0}


def test_first_run_from_latest_reads_nothing_but_records_the_position():
    p = make(None, wm(p0=(5, 50), p1=(0, 7)), start="latest")

    assert p.empty
    assert p.next_offsets == {0: 50, 1: 7}


def test_cap_bounds_each_partition_and_flags_more_waiting():
    p = make(make_token(3, {0: 10, 1: 0}), wm(p0=(0, 1000), p1=(0, 40)), cap=100)

    assert p.ranges == {0: (10, 110), 1: (0, 40)}
    assert p.capped
    assert p.next_offsets == {0: 110, 1: 40}


def test_range_ending_exactly_at_the_cap_is_not_capped():
    p = make(make_token(3, {0: 10}), wm(p0=(0, 110)), cap=100)

    assert p.ranges == {0: (10, 110)} and not p.capped


def test_nothing_new_is_an_empty_plan_keeping_the_position():
    p = make(make_token(3, {0: 50, 1: 7}), wm(p0=(0, 50), p1=(7, 7)))

    assert p.empty and not p.capped
    assert p.next_offsets == {0: 50, 1: 7}
    with pytest.raises(ValueError, match="'orders': nothing to read"):
        kafka_source_options({"orders": p.ranges})


@pytest.mark.parametrize("start", ["earliest", "latest"])
def test_a_partition_added_after_the_first_run_is_read_from_its_first_offset(start):
    """`latest` belongs to the topic's first run only (Kafka's own consumers apply it again)."""
    p = make(make_token(3, {0: 10}), wm(p0=(0, 10), p1=(0, 7)), start=start)

    assert p.ranges == {0: (10, 10), 1: (0, 7)}


def test_latest_with_no_token_but_rewound_files_is_not_a_first_run():
    """Every token of a `latest` topic deleted by hand: partitions resume where their archive
    began (its first rewound file), the others from Kafka's first offset; nothing is skipped."""
    rewound = {0: [Span(40, 49)]}
    p = plan("orders", None, wm(p0=(0, 60), p1=(5, 9)), 1000, "latest", False, rewound=rewound)

    assert p.ranges == {0: (40, 60), 1: (5, 9)} and not p.adopted


def test_rewound_files_kafka_still_holds_are_read_again_whole_however_small_the_cap():
    rewound = {0: [Span(10, 29), Span(30, 44)]}
    p = plan(
        "orders", make_token(3, {0: 10}), wm(p0=(0, 60)), 5, "earliest", False, rewound=rewound
    )

    assert p.ranges == {0: (10, 30)} and p.capped and not p.adopted


@pytest.mark.parametrize("accept_gaps", [False, True])
def test_rewound_files_past_retention_are_adopted_never_declared_a_gap(accept_gaps):
    """Kafka deleted offsets the archive still holds: those files are kept (with everything
    before them) and the run reads on from after them."""
    rewound = {0: [Span(10, 19), Span(20, 29), Span(30, 39)], 1: [Span(0, 4)]}
    token = make_token(3, {0: 10, 1: 0})

    p = plan(
        "orders", token, wm(p0=(25, 60), p1=(0, 8)), 100, "earliest", accept_gaps, rewound=rewound
    )

    assert p.adopted == {0: (10, 30)} and p.gaps == []
    assert p.ranges == {0: (30, 60), 1: (0, 8)}


def test_a_real_gap_after_adopted_files_is_still_a_gap():
    rewound = {0: [Span(10, 19)]}
    with pytest.raises(RetentionGap, match=r"offsets \[20, 25\)"):
        plan(
            "orders",
            make_token(3, {0: 10}),
            wm(p0=(25, 60)),
            100,
            "earliest",
            False,
            rewound=rewound,
        )


def test_a_compacted_topic_adopts_every_rewound_file_and_kept_files_too():
    rewound = {0: [Span(10, 19), Span(20, 29)]}
    token = make_token(3, {0: 10})
    compacted = plan(
        "orders", token, wm(p0=(0, 40)), 100, "earliest", False, rewound=rewound, compacted=True
    )
    kept = plan(
        "orders",
        token,
        wm(p0=(0, 40)),
        100,
        "earliest",
        False,
        rewound={0: [Span(10, 19, keep=True), Span(20, 29)]},
    )

    assert compacted.adopted == {0: (10, 30)} and compacted.ranges == {0: (30, 40)}
    assert kept.adopted == {0: (10, 20)} and kept.ranges == {0: (20, 40)}


def test_retention_gap_is_raised_naming_topic_partition_and_range():
    with pytest.raises(
        RetentionGap, match=r"'orders' partition 1: offsets \[10, 25\) were deleted"
    ):
        make(make_token(3, {0: 0, 1: 10}), wm(p0=(0, 5), p1=(25, 40)))


def test_accepted_retention_gap_skips_to_low_and_is_recorded():
    p = make(make_token(3, {0: 0, 1: 10}), wm(p0=(0, 5), p1=(25, 40)), accept_gaps=True)

    assert p.ranges == {0: (0, 5), 1: (25, 40)}
    assert p.gaps == [Gap(partition=1, from_offset=10, to_offset=25)]


def test_new_partition_that_already_lost_records_is_a_gap():
    with pytest.raises(RetentionGap, match=r"partition 1: offsets \[0, 3\)"):
        make(make_token(3, {0: 10}), wm(p0=(0, 10), p1=(3, 9)))

    p = make(make_token(3, {0: 10}), wm(p0=(0, 10), p1=(3, 9)), accept_gaps=True)
    assert p.ranges[1] == (3, 9)
    assert p.gaps == [Gap(partition=1, from_offset=0, to_offset=3)]


def test_token_ahead_of_kafka_explains_recreated_topic():
    with pytest.raises(OffsetAheadOfKafka) as err:
        make(make_token(3, {0: 500}), wm(p0=(0, 100)))

    message = str(err.value)
    assert "'orders' partition 0" in message and "500" in message and "100" in message
    assert "recreated" in message and "aside" in message


def test_a_topic_recreated_under_the_same_name_is_refused_naming_both_ids():
    token = make_token(3, {0: 10}, topic_id="id-old")
    args = ("orders", token, wm(p0=(0, 50)), 1000, "earliest", False)

    with pytest.raises(TopicRecreated, match=r"id id-old.*now has id id-new") as err:
        plan(*args, topic_id="id-new")
    assert isinstance(err.value, PermanentError)  # a retry would only repeat it
    assert plan(*args, topic_id="id-old").ranges == {0: (10, 50)}
    assert plan(*args, topic_id=None).ranges == {0: (10, 50)}  # Kafka did not say
    older = make_token(3, {0: 10})  # a token from before topic ids were recorded
    assert plan("orders", older, wm(p0=(0, 50)), 1000, "earliest", False, "id-new").ranges


def test_partition_that_vanished_from_kafka_is_an_error():
    with pytest.raises(PartitionVanished, match=r"partitions \[1\]"):
        make(make_token(3, {0: 1, 1: 1}), wm(p0=(0, 5)))


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="cap"):
        make(None, wm(p0=(0, 5)), cap=0)


def test_plan_survives_a_json_round_trip_between_tasks():
    p = make(make_token(3, {0: 10}), wm(p0=(0, 500), p1=(3, 9)), cap=100, accept_gaps=True)

    assert Plan.model_validate_json(p.model_dump_json()) == p


def test_spark_offsets_name_only_partitions_with_records_of_every_topic():
    p = make(make_token(3, {0: 10, 1: 7, 2: 0}), wm(p0=(0, 20), p1=(0, 7), p2=(0, 3)))
    other = make(None, wm(p0=(4, 9)))

    options = {
        k: json.loads(v)
        for k, v in kafka_source_options({"orders": p.ranges, "b": other.ranges}).items()
    }
    assert options["startingOffsets"] == {"orders": {"0": 10, "2": 0}, "b": {"0": 4}}
    assert options["endingOffsets"] == {"orders": {"0": 20, "2": 3}, "b": {"0": 9}}
    assert options["assign"] == {"orders": [0, 2], "b": [0]}


def test_lag_counts_records_kafka_holds_beyond_the_position():
    watermarks = wm(p0=(0, 100), p1=(0, 5), p2=(3, 9), p3=(50, 60))

    assert lag({0: 10, 1: 5, 3: 20}, watermarks) == {0: 90, 1: 0, 2: 6, 3: 10}


def test_a_first_run_at_another_root_is_refused_while_the_earlier_root_holds_tokens(tmp_path):
    """The witness that needs no consumer group (none is asked for here: Kafka is never called):
    the root of the topic's last commit, checked with one listing."""
    earlier = Storage(f"file://{tmp_path}/archive")
    cfg = TopicConfig(
        topic="orders",
        format="raw",
        archive_root=f"file://{tmp_path}/typo",
        commit_consumer_group=False,
    )

    def check(cfg: TopicConfig, roots: dict[str, Storage]) -> None:
        archive_run.check_new_archive(cfg, None, [0], lambda: roots)  # type: ignore[arg-type]

    check(cfg, {earlier.url: earlier})  # the earlier root holds nothing of it: a new archive
    check(cfg, {})
    commit_next(earlier, {0: 5})
    with pytest.raises(ArchiveElsewhere) as refused:
        check(cfg, {earlier.url: earlier})
    assert isinstance(refused.value, PermanentError)
    assert str(refused.value) == (
        f"topic 'orders': archive root {cfg.archive_root} holds no tokens of it, but archive root "
        f"{earlier.url}, where it was archived before, holds its tokens, so its archive is "
        "elsewhere: was archive_root changed or mistyped? Point archive_root back at the "
        "archive, or, to start a new archive here on purpose, set start_new_archive: true for "
        "this topic (remove it after the first run)"
    )
    check(cfg.model_copy(update={"start_new_archive": True}), {earlier.url: earlier})
    check(cfg.model_copy(update={"archive_root": earlier.url}), {earlier.url: earlier})
