"""Nothing left behind, against real Kafka, Spark, PostgreSQL (the Iceberg catalog) and the
archive root: two seals of one date at every order of their steps, a token create that failed
or lost its race, an archive attempt whose token a seal took, a rebuild that died before its
commit; and rewinds that mean what the operator meant: a seal waits for what a rewind set back,
a token deleted below the newest is a hole, and a hand rewind is the CLI's.

After each, nothing is left that no token or live attempt refers to: in the data folders, the
staging area (and pending marks) and the table's location."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from cairn.cli import main as cli
from cairn.pipeline import archive_run, completeness, seal
from cairn.protocol import commit, leftovers, tokens
from cairn.storage.layout import parse_data_key, token_key
from cairn.storage.objects import Storage
from cairn.table import iceberg
from cairn_stack.demo import create_topic, produce
from spark_jobs.seal import seal as seal_job
from tests.integration.conftest import coords, read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once, event
from tests.integration.test_seal import DAY, archived_day, at, date_keys, run_seal
from tests.leftovers import staging, table_leftovers, unnamed_data_files

LATER = timedelta(days=1, minutes=1)
"""Past every attempt's deadline (the default attempt_timeout)."""

STEPS = [("A", "select"), ("A", "job"), ("A", "commit")]
ORDERS = sorted(
    {
        order
        for order in itertools.permutations(STEPS + [("B", s) for _, s in STEPS])
        if all([s for who, s in order if who == w] == ["select", "job", "commit"] for w in "AB")
    }
)


def nothing_left(storage: Storage, topic: str, table_catalog=None) -> None:
    """No staging or pending mark, no data file that no token names, no file in the table's
    location that its metadata does not refer to."""
    assert staging(storage, topic) == []
    assert unnamed_data_files(storage, topic) == set()
    if table_catalog is not None:
        where = iceberg.target(table_catalog, topic)
        table = iceberg.catalog_of(table_catalog).load_table(where.identifier)
        assert table_leftovers(table, iceberg.table_storage(table_catalog, where)) == set()


def test_two_seals_of_one_date_at_every_order_of_their_steps_leave_one_seal_and_nothing_else(
    kafka, archiver, make_cfg, topic_name, table_catalog
):
    """Twenty dates, one per order of the six steps (each seal's select, Spark job and commit
    in its own order): the first to commit seals the date; the other stops at select (the date
    is sealed), fails in its Spark job (its inputs are gone) or is refused at its commit. What
    it wrote is gone at once, or, when its Spark job failed (it reaches no catalog), it is
    withdrawn and the next seal's commit removes it, its table files included."""
    create_topic(kafka, topic_name, partitions=2)
    cfg = make_cfg(topic_name, "max_records_per_partition: 1000\n")
    days = [DAY - timedelta(days=i) for i in range(len(ORDERS) + 1)]
    for p in (0, 1):
        produce(
            kafka,
            topic_name,
            [event(i, at(12) - (DAY - d)) for d in days for i in (1, 2)],
            partition=p,
        )
    archiver.run(cfg)
    storage = archiver.storage(cfg)
    completeness.save_state(storage, completeness.State(topic=topic_name, through=DAY))
    target = iceberg.target(table_catalog, topic_name)
    options = iceberg.storage_options(table_catalog)
    found = iceberg.catalog_of(table_catalog)

    for day, order in zip(days, ORDERS, strict=False):
        chosen: dict[str, seal.Selection | None] = {}
        for who, step in order:
            if step == "select":
                chosen[who] = seal.select(storage, cfg, day, f"seal-{who}", target)
            elif chosen[who] is None:
                continue
            try:
                if step == "job":
                    seal_job(archiver.spark, chosen[who], cfg, archiver.options, options)
                elif step == "commit":
                    seal.finish_seal(storage, cfg, chosen[who], found)
            except commit.Conflict:
                chosen[who] = None
        sealed = [t for t in tokens.list_tokens(storage, topic_name) if t.sealed]
        assert [t.sealed.date for t in sealed].count(day) == 1, order
        assert all(parse_data_key(k).sealed for k in date_keys(storage, topic_name, day)), order
        for key in staging(storage, topic_name):  # only a withdrawn one, until the next seal
            attempt = key.split("/")[2].removesuffix(".json")
            assert commit.load_claim(storage, topic_name, attempt).withdrawn_at, (order, key)

    run_seal(archiver, cfg, table_catalog, days[-1])  # its commit sweeps the last one's
    nothing_left(storage, topic_name, table_catalog)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 42, 1: 42}))
    rows = found.load_table(target.identifier).scan().to_arrow()
    assert sorted(
        zip(rows["_kafka_partition"].to_pylist(), rows["_kafka_offset"].to_pylist(), strict=True)
    ) == all_offsets({0: 42, 1: 42})


class FailingCreate(Storage):
    """The archive root, where creating a token fails as an S3 error would, or first lets
    `first` happen (so the create loses the race)."""

    def __init__(self, url: str, first=None) -> None:
        super().__init__(url)
        self.first = first

    def create(self, key: str, data: bytes) -> None:
        if key.startswith("_tokens/"):
            if self.first is None:
                raise ConnectionError("the token's create failed")
            first, self.first = self.first, None
            first()
        super().create(key, data)


def test_a_token_create_that_failed_or_lost_its_race_leaves_nothing_behind(
    kafka, archiver, make_cfg, topic_name
):
    """A's create fails and its retries too; the next run commits; a run ten minutes later
    removes what A left. B's create loses the race to a run that planned and committed while
    B was between its checks and its create: B removes its own pending mark and staging."""
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    a = archiver.plan(cfg)
    archiver.write(cfg, a)
    report = archive_run.verify_run(storage, a)
    failing = FailingCreate(storage.url)
    for _ in range(3):  # the commit task and its retries
        with pytest.raises(ConnectionError):
            archive_run.commit_run(cfg, failing, a, report, archiver.kafka)
    assert staging(storage, topic_name)  # its pending mark and staging, for now

    archiver.run(cfg)  # the next run: a's mark is fresh, a commit of it may be under way
    assert staging(storage, topic_name)
    leftovers.sweep(storage, topic_name, now=datetime.now(UTC) + leftovers.MARGIN)
    nothing_left(storage, topic_name)

    produce(kafka, topic_name, [event(i, NOW) for i in range(5, 9)], partition=0)
    b = archiver.plan(cfg)
    archiver.write(cfg, b)
    report = archive_run.verify_run(storage, b)
    racing = FailingCreate(storage.url, first=lambda: archiver.run(cfg))
    with pytest.raises(commit.Fenced, match="stale"):
        archive_run.commit_run(cfg, racing, b, report, archiver.kafka)

    nothing_left(storage, topic_name)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 9}))


def test_an_archive_attempt_whose_token_a_seal_took_is_removed_by_a_later_run(
    kafka, archiver, make_cfg, topic_name
):
    """A plans and stages; a seal commits the token A planned; the next run reads A's offsets
    again and commits: A can no longer commit, and the run after removes what it staged."""
    cfg = archived_day(kafka, archiver, make_cfg, topic_name, runs=2)
    storage = archiver.storage(cfg)
    produce(kafka, topic_name, [event(900, NOW)], partition=0)
    a = archiver.plan(cfg)
    archiver.write(cfg, a)
    run_seal(archiver, cfg)
    assert commit.newest(storage, topic_name).seq == a.seq  # the seal took it

    archiver.run(cfg)  # a is still live here: it could commit on the seal
    produce(kafka, topic_name, [event(901, NOW)], partition=1)
    archiver.run(cfg)

    nothing_left(storage, topic_name)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 11, 1: 11}))


def test_a_rebuild_that_died_before_its_commit_is_removed_once_past_its_deadline(
    kafka, archiver, make_cfg, topic_name
):
    cfg = archived_day(kafka, archiver, make_cfg, topic_name, runs=2)
    storage = archiver.storage(cfg)
    dying = archiver.rebuild_selected(make_cfg(topic_name, "generation: 2\n"), DAY)
    assert staging(storage, topic_name)

    produce(kafka, topic_name, [event(900, NOW)], partition=0)
    archiver.run(cfg)  # it may still commit: kept
    assert staging(storage, topic_name)
    removed = leftovers.sweep(storage, topic_name, now=datetime.now(UTC) + LATER)

    assert removed == [dying.claim.attempt_id]
    nothing_left(storage, topic_name)
    with pytest.raises(commit.Fenced, match="withdrawn"):
        archiver.commit_rebuild(make_cfg(topic_name, "generation: 2\n"), dying)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 11, 1: 10}))


def test_a_seal_after_a_rewind_waits_until_the_rewound_offsets_are_read_again(
    kafka, archiver, make_cfg, topic_name, table_catalog
):
    """A rewind of the last run, then a seal of the date: it seals nothing (it would keep the
    rewound records from being read again). The next run reads them again; then the seal
    seals the whole date, and the run after reads nothing it already has."""
    cfg = archived_day(kafka, archiver, make_cfg, topic_name)
    storage = archiver.storage(cfg)
    archiver.rewind(cfg, count=1)

    assert run_seal(archiver, cfg, table_catalog) == (None, None)
    again = archiver.run(cfg)
    _, proof = run_seal(archiver, cfg, table_catalog)

    assert again.ranges == {0: (10, 15), 1: (10, 15)}  # the rewound run's offsets, read again
    assert proof is not None and proof.partitioned == 24
    assert archiver.run(cfg) is None
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 15, 1: 15}))
    nothing_left(storage, topic_name, table_catalog)


def test_a_hand_rewind_is_the_clis_and_a_token_deleted_below_the_newest_is_a_hole(
    kafka, archiver, make_cfg, tmp_path, capsys
):
    """Two topics alike, four runs each: the CLI rewinds two runs of one, the two newest tokens
    of the other are deleted by hand; the next runs read the same offsets again and leave the
    same chains. Then a token below the newest is deleted by hand: the runs read on from the
    newest, nothing twice, and `tokens list` names the hole."""
    topics = [f"it.rewind-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    cfgs = []
    for topic in topics:
        create_topic(kafka, topic, partitions=1)
        cfgs.append(make_cfg(topic))
        for run in range(4):
            produce(kafka, topic, [event(run * 10 + i, NOW) for i in range(3)], partition=0)
            archiver.run(cfgs[-1])
    by_hand = cfgs[1]
    args = ["--topics-file", str(tmp_path / f"{topics[0]}.yaml"), "tokens", "rewind", topics[0]]
    assert cli([*args, "--count", "2", "--bootstrap-servers", kafka]) == 0
    storage = archiver.storage(by_hand)
    for seq in (4, 3):
        storage.delete(token_key(topics[1], seq))

    again = [archiver.run(cfg) for cfg in cfgs]

    assert again[0].ranges == again[1].ranges == {0: (6, 12)}
    chains = [[t.next_offsets for t in tokens.list_tokens(storage, t)] for t in topics]
    assert chains[0] == chains[1] == [{0: 3}, {0: 6}, {0: 12}]
    storage.delete(token_key(topics[1], 2))  # below the newest: a hole, not a rewind
    produce(kafka, topics[1], [event(99, NOW)], partition=0)
    assert archiver.run(by_hand).ranges == {0: (12, 13)}
    assert (
        cli(["--topics-file", str(tmp_path / f"{topics[1]}.yaml"), "tokens", "list", topics[1]])
        == 0
    )
    assert "tokens 2..2 are missing: a hole in the history, not a rewind" in capsys.readouterr().out
    assert coords(read_archive(storage, topics[1]).backup) == [(0, o) for o in range(13)]
    assert staging(storage, topics[1]) == [] and staging(storage, topics[0]) == []
