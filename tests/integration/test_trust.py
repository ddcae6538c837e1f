"""Trust under real conditions, one test per way the archive used to break: transactions,
`latest` starts, overlapping attempts, recreated topics, rewinds Kafka cannot serve again,
rebuilds that move records, retried commits and what readers see before a commit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cairn.cli import main as cli
from cairn.config import REPO
from cairn.datafiles.writer import KafkaRecord, write_partition
from cairn.errors import PERMANENT_EXIT
from cairn.jobs import ArchiveInput, to_env
from cairn.pipeline import archive_run, rebuild
from cairn.protocol import commit, tokens
from cairn.protocol.plan import TopicRecreated
from cairn.storage.layout import token_key
from cairn.storage.objects import Storage
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack.demo import create_topic, produce
from tests.integration.conftest import coords, read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once, event, fill
from tests.integration.test_recovery import delete_records, recreate_topic

DAY = date(2024, 5, 1)
NOON = datetime(2024, 5, 1, 12, tzinfo=UTC)


def transactional(kafka: str, topic: str, batches: list[tuple[list[bytes], bool]]) -> None:
    """Produce each batch in its own transaction, committing or aborting it; return once Kafka
    wrote their markers (after `commit_transaction` returns), so the last stable offset, where
    an archive run stops, is past the last batch."""
    producer = Producer({"bootstrap.servers": kafka, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)
    for values, committed in batches:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        producer.flush(30)
        if committed:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    ends = {
        level: Consumer({"bootstrap.servers": kafka, "group.id": "ends", "isolation.level": level})
        for level in ("read_committed", "read_uncommitted")
    }
    deadline = time.monotonic() + 30
    try:
        while True:
            stable, end = (
                ends[level].get_watermark_offsets(
                    TopicPartition(topic, 0), timeout=10, cached=False
                )[1]
                for level in ("read_committed", "read_uncommitted")
            )
            if stable == end:
                break
            assert time.monotonic() < deadline, f"{topic}: last stable offset {stable} < end {end}"
            time.sleep(0.2)
    finally:
        for consumer in ends.values():
            consumer.close()


def test_records_of_aborted_transactions_are_never_archived(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    transactional(
        kafka,
        topic_name,
        [
            ([event(i, NOW) for i in range(3)], True),
            ([event(i, NOW) for i in range(100, 104)], False),
            ([event(i, NOW) for i in range(3, 5)], True),
        ],
    )
    cfg = make_cfg(topic_name)

    summary = archiver.run(cfg)

    contents = read_archive(archiver.storage(cfg), topic_name)
    ids = sorted(json.loads(r["value"])["event_id"] for r in contents.backup)
    assert ids == ["e0", "e1", "e2", "e3", "e4"]
    assert summary.counts.read == 5 and summary.counts.partitioned == 5
    # offsets have holes (aborted records, transaction markers), and verify accepted them
    assert coords(contents.backup)[-1][1] > 4
    assert archiver.run(cfg) is None


def test_latest_start_records_the_position_once_and_archives_what_follows(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=5)
    cfg = make_cfg(topic_name, "new_partition_start: latest\n")

    first = archiver.run(cfg)  # nothing to read, but the starting position is recorded

    storage = archiver.storage(cfg)
    assert first is not None and first.counts.read == 0
    assert commit.newest(storage, topic_name).next_offsets == {0: 5, 1: 5}
    assert archiver.run(cfg) is None
    fill(kafka, topic_name, partitions=2, per_partition=3, start=5)

    second = archiver.run(cfg)

    assert second.ranges == {0: (5, 8), 1: (5, 8)}
    assert coords(read_archive(storage, topic_name).backup) == [
        (p, o) for p in range(2) for o in range(5, 8)
    ]


def test_a_newer_claim_fences_a_run_that_verified_and_no_record_is_lost(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """A and B plan from the same token; A writes and verifies, then B plans, cleans (discarding
    what A staged: B fenced it out) and dies. A may not commit; the next run archives everything
    once."""
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=12)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    a = archiver.plan(cfg)
    archiver.write(cfg, a)
    report = archive_run.verify_run(storage, a)
    b = archiver.plan(cfg)
    assert archive_run.clean_run(storage, b) == [a.attempt_id]

    with pytest.raises(commit.Fenced, match="fenced out"):
        archive_run.commit_run(cfg, storage, a, report, archiver.kafka)
    assert commit.newest(storage, topic_name) is None

    archiver.run(cfg)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 12, 1: 12}))


def test_a_fenced_attempt_that_wins_the_commit_race_is_published_and_the_newer_one_yields(
    kafka, archiver, make_cfg, topic_name, monkeypatch
) -> None:
    """A passed its last check a moment before B claimed, so A's token gets created after B's
    claim (the two-request window). A is published; B's steps and commit fail."""
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=10)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    a = archiver.plan(cfg)
    archiver.write(cfg, a)
    report = archive_run.verify_run(storage, a)
    fill(kafka, topic_name, partitions=1, per_partition=5, start=10)
    b = archiver.plan(cfg)  # reads [0, 15) from the same (absent) token

    with monkeypatch.context() as patched:  # A's last check passed just before B's claim
        patched.setattr(commit.NewestClaim, "check", lambda *_: None)
        archive_run.commit_run(cfg, storage, a, report, archiver.kafka)
    with pytest.raises(commit.Fenced):
        archiver.write(cfg, b)
    with pytest.raises(commit.Fenced):
        archiver.finish(cfg, b)

    assert commit.newest(storage, topic_name).attempt_id == a.attempt_id
    archiver.run(cfg)
    assert [t.next_offsets for t in tokens.list_tokens(storage, topic_name)] == [{0: 10}, {0: 15}]
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 15}))


def test_a_stale_plan_replayed_after_another_run_committed_fails_fast_and_changes_nothing(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """A plans [0, 10); B plans [0, 15) and commits; A's tasks are cleared and re-run from its
    old XCom plan, and A's zombie Spark job keeps writing: nothing of A reaches the archive."""
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=10)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    a = archiver.plan(cfg)
    fill(kafka, topic_name, partitions=1, per_partition=5, start=10)
    b = archiver.plan(cfg)
    archiver.write(cfg, b)
    archiver.finish(cfg, b)
    before = storage.list()

    for step in (lambda: archiver.write(cfg, a), lambda: archiver.finish(cfg, a)):
        with pytest.raises(commit.Fenced, match="stale"):
            step()
    zombie = [
        KafkaRecord(topic_name, 0, o, 0, 0, None, event(o, NOW)) for o in range(10)
    ]  # what A's Spark tasks would still write
    write_partition(zombie, cfg, a.staged(storage), a.planned_at, a.attempt_id)

    assert [k for k in storage.list() if not k.startswith("_")] == [
        k for k in before if not k.startswith("_")
    ]
    assert archiver.run(cfg) is None
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 15}))
    fill(kafka, topic_name, partitions=1, per_partition=1, start=15)
    archiver.run(cfg)  # the next run discards the zombie's staging
    assert not storage.list(f"_attempts/{topic_name}/")


def test_a_recreated_topic_is_refused_and_archives_under_a_new_prefix(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    cfg = make_cfg(topic_name)
    archiver.run(cfg)
    recreate_topic(kafka, topic_name)
    produce(kafka, topic_name, [event(i, NOW) for i in range(100, 112)], partition=0)
    storage = archiver.storage(cfg)
    before = storage.list()

    with pytest.raises(TopicRecreated, match="archive_root"):
        archiver.run(cfg)  # offsets 0..11 exist again: without the id, [0, 5) would be skipped

    assert storage.list() == before
    fresh = make_cfg(topic_name, root=(tmp_path / "second").as_uri())
    archiver.run(fresh)
    backup = read_archive(archiver.storage(fresh), topic_name).backup
    assert sorted(json.loads(r["value"])["event_id"] for r in backup) == [
        f"e{i}" for i in sorted(range(100, 112), key=str)
    ]


def test_a_hand_rewind_past_retention_keeps_the_archived_records_it_cannot_read_again(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name, "accept_gaps: true\n")
    produce(kafka, topic_name, [event(i, NOW) for i in range(5)], partition=0)
    archiver.run(cfg)
    produce(kafka, topic_name, [event(i, NOW) for i in range(5, 20)], partition=0)
    archiver.run(cfg)
    storage = archiver.storage(cfg)
    storage.delete(token_key(topic_name, 2))  # a rewind by hand, as docs/recovery.md allows
    delete_records(kafka, topic_name, before=10)
    before = {k: storage.read(k) for k in storage.list() if k.startswith("backup/")}

    summary = archiver.run(cfg)  # adopts [5, 20): Kafka cannot serve [5, 10) again

    assert summary.counts.read == 0 and summary.gaps == []
    assert commit.newest(storage, topic_name).adopted == {0: (5, 20)}
    assert {k: storage.read(k) for k in storage.list() if k.startswith("backup/")} == before
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 20}))


def test_a_rewind_on_a_compacted_topic_is_refused_by_the_cli_and_kept_by_the_run(
    kafka, archiver, make_cfg, topic_name, tmp_path, capsys
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka})
    compact = NewTopic(topic_name, 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([compact])[topic_name].result(30)
    cfg = make_cfg(topic_name)
    keys = [f"k{i % 3}".encode() for i in range(6)]
    produce(kafka, topic_name, [event(i, NOW) for i in range(6)], keys=keys, partition=0)
    archiver.run(cfg)
    produce(kafka, topic_name, [event(i, NOW) for i in range(6, 12)], keys=keys, partition=0)
    archiver.run(cfg)
    storage = archiver.storage(cfg)
    topics = str(tmp_path / f"{topic_name}.yaml")
    args = ["--topics-file", topics, "tokens", "rewind", topic_name, "--bootstrap-servers", kafka]

    assert cli([*args, "--count", "1"]) == 1
    assert "compacted" in capsys.readouterr().err
    storage.delete(token_key(topic_name, 2))  # by hand, bypassing the CLI
    summary = archiver.run(cfg)  # keeps what a re-read might no longer return

    assert summary.counts.read == 0 and commit.newest(storage, topic_name).adopted == {0: (6, 12)}
    assert coords(read_archive(storage, topic_name).backup) == [(0, o) for o in range(12)]


def test_a_fix_that_gives_quarantined_records_an_event_time_moves_them_by_one_rebuild(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """Archived reading the event time from a field the records lack, every record is
    quarantined under the processing date; rebuilding that date with the fix files them under
    their event dates (not rebuilt), none lost."""
    create_topic(kafka, topic_name, partitions=1)
    times = [NOON + timedelta(hours=9 * i) for i in range(6)]
    produce(kafka, topic_name, [event(i, ts) for i, ts in enumerate(times)], partition=0)
    buggy = make_cfg(topic_name, "event_time: {field: sent_at, encoding: iso8601}\n")
    archiver.run(buggy)
    storage = archiver.storage(buggy)
    assert len(read_archive(storage, topic_name).quarantine) == 6
    processing_day = date.fromisoformat(
        next(k for k in storage.list(f"quarantine/{topic_name}/")).split("dt=")[1][:10]
    )
    fixed = make_cfg(topic_name)

    archiver.rebuild(fixed, processing_day)

    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 6}))
    assert not contents.quarantine
    assert sorted(folder for folder, _ in contents.partitioned) == sorted(
        ts.strftime("dt=%Y-%m-%d/hr=%H") for ts in times
    )


def test_rebuild_selection_reads_only_the_rebuilt_dates_and_reaches_spark_by_reference(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """Forty runs of history: selecting one date reads its files' headers and no manifest or
    token beyond the newest, and the Spark job is handed only the claim's key."""
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name)
    for i in range(40):
        ts = NOON + timedelta(days=1 + i) if i != 20 else NOON
        produce(kafka, topic_name, [event(i, ts)], partition=0)
        archiver.run(cfg)

    reads: list[str] = []
    counting = Storage(cfg.root.storage_url)
    real_read = counting.read
    counting.read = lambda key: reads.append(key) or real_read(key)
    chosen = rebuild.select(counting, cfg, [DAY], "count")

    assert [s.key for s in chosen.sources] == [
        f"backup/{topic_name}/partition=0/" + (f"1_0_{20:020d}.avro")
    ]
    assert not [k for k in reads if k.startswith("_manifests/")]
    assert len([k for k in reads if k.startswith("_tokens/")]) <= 2
    assert rebuild.load_claimed(archiver.storage(cfg), chosen.claim.key) == chosen


def test_a_retried_commit_after_the_token_was_created_succeeds(
    kafka, archiver, make_cfg, topic_name, monkeypatch
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=8)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    planned = archiver.plan(cfg)
    archiver.write(cfg, planned)
    report = archive_run.verify_run(storage, planned)
    real_create = storage.create

    def created_but_lost(key: str, data: bytes) -> None:
        real_create(key, data)
        if key == token_key(topic_name, 1):
            raise ConnectionError("the conditional PUT succeeded but its response was lost")

    monkeypatch.setattr(storage, "create", created_but_lost)
    with pytest.raises(ConnectionError):
        archive_run.commit_run(cfg, storage, planned, report, archiver.kafka)
    monkeypatch.undo()

    summary = archive_run.commit_run(cfg, storage, planned, report, archiver.kafka)
    again = archive_run.commit_run(
        cfg, storage, planned, report, "127.0.0.1:1"
    )  # Kafka unreachable

    assert summary.seq == again.seq == 1 and again.lag_error is not None
    assert [t.seq for t in tokens.list_tokens(storage, topic_name)] == [1]
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 8}))


def test_readers_see_nothing_of_an_attempt_until_its_token_commits(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=6)
    cfg = make_cfg(topic_name)
    storage = archiver.storage(cfg)
    planned = archiver.plan(cfg)
    archiver.write(cfg, planned)
    archive_run.verify_run(storage, planned)

    staged = read_archive(storage, topic_name)
    assert staged.backup == [] and staged.partitioned == [] and staged.quarantine == []
    archiver.finish(cfg, planned)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 6, 1: 6}))
    assert not storage.list(f"_attempts/{topic_name}/")


def test_a_fenced_spark_job_exits_with_the_permanent_status_the_operator_does_not_retry(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=3)
    cfg = make_cfg(topic_name)
    stale = archiver.plan(cfg)
    archiver.plan(cfg)  # a newer attempt fences the first out
    job = [
        str(Path(sys.executable).parent / "spark-submit"),
        *("--master", "local[1]", "--py-files", str(code_artifact().path)),
        str(REPO / "spark_jobs" / "main.py"),
    ]
    given = ArchiveInput(
        topic=cfg.snapshot(),
        claim=stale.claim.key,
        artifact=code_artifact().name,
        kafka=archiver.kafka.settings,
        kafka_label=archiver.kafka.label,
    )
    env = os.environ | to_env(given) | {"PYSPARK_PYTHON": sys.executable}

    done = subprocess.run(job, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == PERMANENT_EXIT, done.stderr[-2000:]
    output = done.stdout + done.stderr  # the driver's output may arrive on either stream
    assert "Fenced" in output and stale.attempt_id in output
    assert not archiver.storage(cfg).list(f"_attempts/{topic_name}/")
