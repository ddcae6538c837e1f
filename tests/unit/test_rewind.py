"""Rewinds on a real local archive root: finding rewound files (numerically, in every
generation), what a re-read replaces, and the one rule the CLI and the run share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord
from cairn.kafka.cluster import TopicState, Watermarks
from cairn.protocol import commit, rewind, tokens
from cairn.protocol.plan import Span
from cairn.storage.layout import backup_key, parse_data_key, token_key
from cairn.storage.objects import Storage
from tests.unit.conftest import archive_records, commit_next
from tests.unit.test_rebuild import config as rebuild_config

TOPIC = "orders"
NOON = datetime(2024, 6, 1, 12, tzinfo=UTC)


def config(tmp_path, **extra) -> TopicConfig:
    return rebuild_config(tmp_path, time_source="processing", event_time=None, **extra)


def records(partition: int, offsets: range) -> list[KafkaRecord]:
    """Records that parse at even offsets and are quarantined at odd ones."""
    values = [b'{"id": "x"}', b"{}"]
    return [
        KafkaRecord(TOPIC, partition, o, 1_700_000_000_000 + o, 0, b"k", values[o % 2])
        for o in offsets
    ]


def state(compacted: bool = False, **lows: int) -> TopicState:
    """Kafka as the rule sees it: every partition ends at 100, starts at `p<n>` (default 0)."""
    marks = {p: Watermarks(lows.get(f"p{p}", 0), 100) for p in (0, 1)}
    return TopicState("id", marks, compacted)


@pytest.fixture
def archived(tmp_path, storage) -> TopicConfig:
    """Four runs: partition 0 [0,10) [10,20) [20,30) [30,40), partition 1 in the second."""
    cfg = config(tmp_path)
    for i in range(4):
        part = records(0, range(10 * i, 10 * i + 10)) + (records(1, range(5)) if i == 1 else [])
        archive_records(storage, cfg, NOON + timedelta(hours=i), part)
    return cfg


def test_rewound_backups_are_those_at_or_after_the_position_in_every_generation(storage):
    for key in (
        backup_key(TOPIC, 9, 0, 5),
        backup_key(TOPIC, 10, 0, 20),  # "10_…" sorts before "9_…": found all the same
        backup_key(TOPIC, 10, 0, 3),
        backup_key(TOPIC, 2, 1, 0),
    ):
        storage.write(key, b"x")

    found = rewind.rewound_backups(storage, TOPIC, {0: 5, 1: 1})

    assert {p: [(f.gen, f.first_offset) for f in fs] for p, fs in found.items()} == {
        0: [(9, 5), (10, 20)]
    }
    assert rewind.rewound_backups(storage, TOPIC, {0: 21, 1: 0})[1][0].gen == 2


def test_nothing_is_rewound_after_a_commit(storage, archived):
    position = commit.newest(storage, TOPIC).next_offsets
    assert rewind.rewound_backups(storage, TOPIC, position) == {}


def test_spans_come_from_each_files_manifest_or_from_the_file(storage, archived):
    found = rewind.survey(storage, TOPIC, {0: 20, 1: 5})
    assert rewind.spans(storage, found) == {0: [Span(20, 29), Span(30, 39)]}

    for key in storage.list("_manifests/"):
        storage.delete(key)
    assert rewind.spans(storage, found) == {0: [Span(20, 29), Span(30, 39)]}


def test_a_re_read_replaces_every_kind_of_rewound_file_in_its_ranges_and_nothing_else(
    storage, archived
):
    found = rewind.survey(storage, TOPIC, {0: 10, 1: 0})

    doomed = rewind.supersedes(found, {0: (10, 30), 1: (0, 5)})

    inside = {0: range(10, 30), 1: range(5)}
    expected = [
        k
        for k in storage.list()
        if (f := parse_data_key(k)) is not None and f.first_offset in inside[f.partition]
    ]
    assert doomed == sorted(expected)
    assert {parse_data_key(k).kind for k in doomed} == {"backup", "partitioned", "quarantine"}
    assert rewind.supersedes(rewind.Rewound({}), {0: (10, 30)}) == []


def test_rewind_by_count_takes_back_archive_runs_and_the_tokens_above_them(storage, archived):
    claim = commit.claim(
        storage, TOPIC, "rebuild", commit.newest(storage, TOPIC), "r", lambda c: b"{}"
    )
    commit.commit(
        storage, claim, lambda: commit.Change(requirements=[], adds={})
    )  # token 5: a rebuild

    deleted = rewind.rewind(storage, archived, state(), count=2)

    assert deleted == [token_key(TOPIC, s) for s in (5, 4, 3)]
    assert tokens.seqs(storage, TOPIC) == [1, 2]


def test_rewind_to_a_seq_or_a_time(storage, archived):
    created = {t.seq: t.created_at for t in tokens.list_tokens(storage, TOPIC)}

    assert rewind.rewind(storage, archived, state(), before=created[4]) == [token_key(TOPIC, 4)]
    assert len(rewind.rewind(storage, archived, state(), to_seq=1)) == 2
    assert rewind.rewind(storage, archived, state(), to_seq=1) == []


@pytest.mark.parametrize(
    "kwargs", [{}, {"count": 1, "to_seq": 1}, {"count": 5}, {"count": -1}, {"to_seq": 7}]
)
def test_invalid_rewinds_delete_nothing(storage, archived, kwargs):
    with pytest.raises(ValueError):
        rewind.rewind(storage, archived, state(), **kwargs)
    assert tokens.seqs(storage, TOPIC) == [1, 2, 3, 4]


def test_a_rewind_past_retention_is_refused_naming_the_range(storage, archived):
    with pytest.raises(rewind.RewindRefused, match=r"partition 0 \[10, 30\).*retention"):
        rewind.rewind(storage, archived, state(p0=25), count=3)
    assert tokens.seqs(storage, TOPIC) == [1, 2, 3, 4]

    assert len(rewind.rewind(storage, archived, state(p0=30), count=1)) == 1


def test_a_rewind_of_a_compacted_topic_over_runs_that_read_anything_is_refused(storage, archived):
    with pytest.raises(rewind.RewindRefused, match="compacted"):
        rewind.rewind(storage, archived, state(compacted=True), count=1)
    commit_next(storage, {0: 40, 1: 5})  # a run that read nothing
    assert rewind.rewind(storage, archived, state(compacted=True), count=1) == [token_key(TOPIC, 5)]


def test_rewinding_every_token_of_a_latest_topic_is_refused(tmp_path, storage, archived):
    latest = config(tmp_path, new_partition_start="latest")

    with pytest.raises(rewind.RewindRefused, match="--to-seq 1"):
        rewind.rewind(storage, latest, state(), to_seq=0)
    assert len(rewind.rewind(storage, latest, state(), to_seq=1)) == 3
    assert len(rewind.rewind(storage, archived, state(), to_seq=0)) == 1  # earliest: allowed


def test_the_rule_is_the_runs_own_plan(storage, archived):
    """What the CLI refuses is what the next run would keep instead of reading again."""
    commit_next_position = commit.newest(storage, TOPIC)
    target = tokens.token_at(storage, TOPIC, 2)
    assert rewind.refusal(storage, archived, target, state()) is None
    why = rewind.refusal(storage, archived, target, state(p0=35))
    assert "[20, 40)" in why and commit_next_position.seq == 4


def test_a_crash_midway_through_a_rewind_leaves_a_consistent_chain(storage, archived, monkeypatch):
    real_delete, calls = storage.delete, []

    def crash_on_second(key: str) -> None:
        calls.append(key)
        if len(calls) == 2:
            raise OSError("connection lost")
        real_delete(key)

    monkeypatch.setattr(storage, "delete", crash_on_second)
    with pytest.raises(OSError):
        rewind.rewind(storage, archived, state(), to_seq=1)

    assert commit.settle(Storage(storage.url), TOPIC).seq == 3
