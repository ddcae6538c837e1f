"""The run contract against real Kafka, Spark and storage: exactly once, through crashes,
commit races, rewinds, new partitions and bad input."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from cairn.protocol import commit, tokens
from cairn.protocol.commit import Fenced
from cairn.topics_file import find_topic
from cairn_stack.demo import create_topic, produce
from tests.integration.conftest import coords, read_archive

NOW = datetime.now(UTC).replace(microsecond=0)


def event(i: int, ts: datetime | str) -> bytes:
    stamp = ts if isinstance(ts, str) else ts.isoformat()
    return json.dumps(
        {"event_id": f"e{i}", "user_id": "u1", "action": "view", "amount": 1.5, "ts": stamp}
    ).encode()


def fill(kafka: str, topic: str, partitions: int, per_partition: int, start: int = 0) -> dict:
    """Produce `per_partition` events to each partition; returns {(p, offset-ish index): ts}."""
    times = {}
    for p in range(partitions):
        values = []
        for i in range(start, start + per_partition):
            ts = NOW - timedelta(hours=(i * 7 + p * 3) % 60)  # spread over 3 days of hours
            times[(p, i)] = ts
            values.append(event(i, ts))
        produce(kafka, topic, values, partition=p)
    return times


def assert_exactly_once(contents, expected: list[tuple[int, int]]) -> None:
    assert coords(contents.backup) == expected
    parsed = coords([r for _, r in contents.partitioned], "_kafka_partition", "_kafka_offset")
    assert sorted(parsed + coords(contents.quarantine)) == expected


def all_offsets(counts: dict[int, int]) -> list[tuple[int, int]]:
    return sorted((p, o) for p, n in counts.items() for o in range(n))


def test_first_run_lays_out_every_record_once_by_event_time(
    kafka, archiver, make_cfg, topic_name, spark
) -> None:
    create_topic(kafka, topic_name, partitions=3)
    times = fill(kafka, topic_name, partitions=3, per_partition=40)
    late = datetime(2019, 4, 2, 13, 30, tzinfo=UTC)
    produce(kafka, topic_name, [event(999, late)], partition=1)
    cfg = make_cfg(topic_name)

    summary = archiver.run(cfg)

    assert summary is not None and summary.seq == 1
    assert summary.ranges == {0: (0, 40), 1: (0, 41), 2: (0, 40)}
    assert summary.counts.backup == 121 and summary.counts.quarantined == 0
    assert summary.offset_lag == {0: 0, 1: 0, 2: 0} and summary.time_lag_seconds == 0
    contents = read_archive(archiver.storage(cfg), topic_name)
    assert_exactly_once(contents, all_offsets({0: 40, 1: 41, 2: 40}))
    for folder, row in contents.partitioned:
        ts = datetime.fromisoformat(row["ts"])
        assert folder == ts.strftime("dt=%Y-%m-%d/hr=%H")
        if row["event_id"] != "e999":
            assert ts == times[(row["_kafka_partition"], int(row["event_id"][1:]))]
    assert ("dt=2019-04-02/hr=13", "e999") in [(f, r["event_id"]) for f, r in contents.partitioned]

    # Spark discovers the Hive-style folders and reads the same records.
    root = cfg.root.storage_url
    frame = spark.read.format("avro").load(f"{root}/partitioned/{topic_name}")
    assert frame.count() == 121
    assert frame.filter("dt = '2019-04-02' AND hr = 13").select("event_id").collect()[0][0] == (
        "e999"
    )


def test_second_run_reads_only_new_records_and_an_idle_run_writes_nothing(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=10)
    cfg = make_cfg(topic_name)
    archiver.run(cfg)
    fill(kafka, topic_name, partitions=2, per_partition=5, start=10)

    second = archiver.run(cfg)

    assert second is not None and second.ranges == {0: (10, 15), 1: (10, 15)}
    storage = archiver.storage(cfg)
    before = storage.list()
    assert archiver.run(cfg) is None  # nothing new: no Spark job, no token
    assert storage.list() == before
    assert [t.seq for t in tokens.list_tokens(storage, topic_name)] == [1, 2]
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 15, 1: 15}))


def test_crash_before_commit_then_retry_leaves_no_duplicate(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    fill(kafka, topic_name, partitions=2, per_partition=30)
    cfg = make_cfg(topic_name, "max_records_per_partition: 20\n")
    archiver.run(cfg)  # token 1 at offset 20
    fill(kafka, topic_name, partitions=2, per_partition=5, start=30)

    crashed = archiver.plan(cfg)
    archiver.write(cfg, crashed)  # files and manifest staged, then the run dies: no commit
    storage = archiver.storage(cfg)
    assert commit.newest(storage, topic_name).seq == 1
    staged = read_archive(storage, topic_name)  # a reader sees only committed output
    assert_exactly_once(staged, all_offsets({0: 20, 1: 20}))

    archiver.run(cfg)  # the retry plans afresh; the crashed attempt's staging is discarded

    assert [t.seq for t in tokens.list_tokens(storage, topic_name)] == [1, 2]
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 35, 1: 35}))


def test_two_attempts_planned_from_one_token_only_the_live_one_commits(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=25)
    cfg = make_cfg(topic_name)
    first, second = archiver.plan(cfg), archiver.plan(cfg)
    assert first.seq == second.seq == 1 and first.claim.k < second.claim.k

    with pytest.raises(Fenced, match="fenced out by a newer attempt"):
        archiver.write(cfg, first)  # the older claim fails fast, before cleaning or Spark
    archiver.write(cfg, second)
    archiver.finish(cfg, second)
    with pytest.raises(Fenced):
        archiver.finish(cfg, first)

    storage = archiver.storage(cfg)
    assert [t.seq for t in tokens.list_tokens(storage, topic_name)] == [1]
    assert commit.newest(storage, topic_name).attempt_id == second.attempt_id
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 25}))


def test_rewinding_two_tokens_rereads_without_duplicates(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    cfg = make_cfg(topic_name)
    for batch in range(3):
        fill(kafka, topic_name, partitions=2, per_partition=8, start=batch * 8)
        archiver.run(cfg)
    storage = archiver.storage(cfg)
    archived = read_archive(storage, topic_name)

    deleted = archiver.rewind(cfg, count=2)
    assert len(deleted) == 2
    summary = archiver.run(cfg)

    assert summary.seq == 2 and summary.ranges == {0: (8, 24), 1: (8, 24)}
    again = read_archive(storage, topic_name)
    assert_exactly_once(again, all_offsets({0: 24, 1: 24}))
    assert coords(again.backup) == coords(archived.backup)


def test_partition_added_between_runs_is_archived_from_its_first_offset(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    fill(kafka, topic_name, partitions=1, per_partition=5)
    cfg = make_cfg(topic_name)
    archiver.run(cfg)
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_partitions([NewPartitions(topic_name, 2)])[topic_name].result(30)
    produce(kafka, topic_name, [event(i, NOW) for i in range(4)], partition=1)

    summary = archiver.run(cfg)

    assert summary.ranges == {1: (0, 4)}
    storage = archiver.storage(cfg)
    assert commit.newest(storage, topic_name).next_offsets == {0: 5, 1: 4}
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 5, 1: 4}))


def test_bad_input_is_kept_verbatim_and_quarantined_with_reasons(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    big = json.dumps({"event_id": "big", "ts": NOW.isoformat(), "pad": "x" * 5_000_000})
    cases = [
        (b"good", event(0, NOW)),
        (b"malformed", b'{"event_id": "x", "ts": '),
        (b"no-ts", json.dumps({"event_id": "x", "user_id": "u", "action": "a"}).encode()),
        (b"bad-ts", event(1, "yesterday at noon")),
        (b"path", event(2, "../../etc/passwd")),
        (b"schema", json.dumps({"event_id": 5, "ts": NOW.isoformat()}).encode()),
        (b"tombstone", None),
        (b"\xff\xfe-not-utf8", event(3, NOW)),
        (b"big", big.encode()),
    ]
    produce(kafka, topic_name, [v for _, v in cases], keys=[k for k, _ in cases], partition=0)
    cfg = make_cfg(topic_name)

    summary = archiver.run(cfg)

    contents = read_archive(archiver.storage(cfg), topic_name)
    assert [(r["key"], r["value"]) for r in contents.backup] == cases  # verbatim, in order
    assert sorted(r["event_id"] for _, r in contents.partitioned) == ["e0", "e3"]
    reasons = {r["key"]: r["reason"] for r in contents.quarantine}
    assert set(reasons) == {
        b"malformed",
        b"no-ts",
        b"bad-ts",
        b"path",
        b"schema",
        b"tombstone",
        b"big",
    }
    assert "ts" in reasons[b"no-ts"] and "ts" in reasons[b"bad-ts"]
    assert "tombstone" in reasons[b"tombstone"]
    assert summary.counts.quarantined == 7 and summary.counts.partitioned == 2
    assert all("/" not in folder.replace("/hr=", "") for folder, _ in contents.partitioned)


def test_a_raw_topic_is_archived_verbatim_to_backup_only(
    kafka, archiver, make_cfg, topic_name, tmp_path
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    values = [b"\x00\x01binary", b"not json", None]
    produce(kafka, topic_name, values, partition=0)
    entry = f"""
        topics:
          - topic: {topic_name}
            format: raw
            archive_root: {(tmp_path / "raw").as_uri()}
        """
    path = tmp_path / "raw.yaml"
    path.write_text(textwrap.dedent(entry))
    cfg = find_topic(topic_name, path)

    summary = archiver.run(cfg)

    contents = read_archive(archiver.storage(cfg), topic_name)
    assert [r["value"] for r in contents.backup] == values
    assert contents.partitioned == [] and contents.quarantine == []
    assert summary.counts.backup == 3 and summary.counts.partitioned == 0
