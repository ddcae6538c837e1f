"""Rebuilding dates from the backup with real Spark: parser fixes, late data, generations, a
date range as one operation, and a rebuild racing an archive run of the same date."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

from cairn.pipeline import rebuild
from cairn.storage import layout
from cairn_stack.demo import create_topic, produce
from spark_jobs.rebuild import rebuild as rebuild_job
from tests.integration.conftest import read_archive
from tests.integration.test_archive import all_offsets, assert_exactly_once, event

DAY = date(2024, 5, 1)
NOON = datetime(2024, 5, 1, 12, tzinfo=UTC)


def sent_late(i: int, ts: datetime) -> bytes:
    """An event whose `sent_at` is six hours after its true time `ts`."""
    body = json.loads(event(i, ts))
    return json.dumps(body | {"sent_at": (ts + timedelta(hours=6)).isoformat()}).encode()


def folders_of(contents) -> dict[str, str]:
    return {row["event_id"]: folder for folder, row in contents.partitioned}


def test_parser_bug_is_fixed_by_rebuilding_the_affected_dates(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    times = {f"e{i}": NOON + timedelta(minutes=37 * i) for i in range(20)}  # 12:00 to 23:43
    for p in range(2):
        values = [sent_late(i, times[f"e{i}"]) for i in range(p, 20, 2)]
        produce(kafka, topic_name, values, partition=p)
    buggy = make_cfg(topic_name, "event_time: {field: sent_at, encoding: iso8601}\n")
    archiver.run(buggy)
    storage = archiver.storage(buggy)
    wrong = folders_of(read_archive(storage, topic_name))
    assert any(folder.startswith("dt=2024-05-02") for folder in wrong.values())

    fixed = make_cfg(topic_name)  # event_time: ts
    for day in (DAY, DAY + timedelta(days=1)):  # one date at a time, as a backfill's runs do
        archiver.rebuild(fixed, day)

    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 10, 1: 10}))
    assert folders_of(contents) == {e: ts.strftime("dt=%Y-%m-%d/hr=%H") for e, ts in times.items()}


def test_late_event_lands_in_its_date_and_its_rebuild_reads_only_its_backup_file(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    cfg = make_cfg(topic_name)
    late = datetime(2019, 4, 2, 8, 15, tzinfo=UTC)
    for batch in range(3):  # three runs: six backup files
        for p in range(2):
            values = [event(batch * 10 + i, NOON + timedelta(hours=i)) for i in range(5)]
            if (batch, p) == (1, 1):
                values.append(event(999, late))
            produce(kafka, topic_name, values, partition=p)
        archiver.run(cfg)
    storage = archiver.storage(cfg)
    backups = [k for k in storage.list(f"backup/{topic_name}") if k.endswith(".avro")]
    assert folders_of(read_archive(storage, topic_name))["e999"] == "dt=2019-04-02/hr=08"

    chosen = archiver.rebuild(cfg, date(2019, 4, 2))

    assert len(backups) == 6
    assert [s.key for s in chosen.sources] == [layout.backup_key(topic_name, 1, 1, 5)]
    assert list(chosen.sources[0].files) == [
        k for k in storage.list(f"partitioned/{topic_name}/dt=2019-04-02/")
    ]
    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 15, 1: 16}))
    assert [r["event_id"] for f, r in contents.partitioned if f.startswith("dt=2019")] == ["e999"]


def test_archive_run_committing_during_a_rebuild_of_the_same_date_keeps_both(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    cfg = make_cfg(topic_name)
    produce(kafka, topic_name, [event(i, NOON) for i in range(10)], partition=0)
    archiver.run(cfg)
    storage = archiver.storage(cfg)

    # The rebuild takes its snapshot, then late data for the same date is archived and committed
    # before the rebuild's Spark job writes and replaces the date's files.
    chosen = rebuild.select(storage, cfg, [DAY], "racing")
    produce(kafka, topic_name, [event(i, NOON) for i in range(10, 15)], partition=0)
    archiver.run(cfg)

    rebuild_job(archiver.spark, chosen, cfg, archiver.options)
    done = archiver.commit_rebuild(cfg, chosen)  # commits after the archive run: not stopped

    assert (done.seq, done.kind, done.next_offsets) == (3, "rebuild", {0: 15})
    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 15}))
    assert sorted(int(r["event_id"][1:]) for _, r in contents.partitioned) == list(range(15))


def test_generation_bump_then_rebuild_leaves_only_the_new_generation_in_that_date(
    kafka, archiver, make_cfg, topic_name
) -> None:
    create_topic(kafka, topic_name, partitions=1)
    other_day = NOON + timedelta(days=3)
    produce(kafka, topic_name, [event(0, NOON), event(1, other_day)], partition=0)
    archiver.run(make_cfg(topic_name))
    bumped = make_cfg(topic_name, "generation: 2\n")
    produce(kafka, topic_name, [event(2, NOON)], partition=0)
    archiver.run(bumped)
    storage = archiver.storage(bumped)

    archiver.rebuild(bumped, DAY)

    generations = {
        (parsed.folder[:13], parsed.gen)
        for parsed in map(layout.parse_data_key, storage.list(f"partitioned/{topic_name}"))
        if parsed is not None
    }
    assert generations == {("dt=2024-05-01", 2), ("dt=2024-05-04", 1)}
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 3}))


def test_a_date_range_is_rebuilt_as_one_operation_when_a_fix_moves_records_across_midnight(
    kafka, archiver, make_cfg, topic_name
) -> None:
    """A timezone fix moves late-evening events to the next date: one rebuild of both dates
    files every record once, and a second rebuild of the range changes nothing."""
    create_topic(kafka, topic_name, partitions=1)
    times = [NOON + timedelta(hours=h) for h in (0, 3, 6, 9, 11, 13)]  # 12:00 .. 01:00 (+1)
    produce(kafka, topic_name, [event(i, ts) for i, ts in enumerate(times)], partition=0)
    archiver.run(make_cfg(topic_name))
    storage = archiver.storage(make_cfg(topic_name))
    fixed = make_cfg(topic_name, "timezone: Asia/Tokyo\n")  # UTC+9

    archiver.rebuild(fixed, DAY, DAY + timedelta(days=1))

    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 6}))
    tokyo = [ts.astimezone(fixed.tzinfo).strftime("dt=%Y-%m-%d/hr=%H") for ts in times]
    assert sorted(folder for folder, _ in contents.partitioned) == sorted(tokyo)
    files = {k: storage.read(k) for k in storage.list(f"partitioned/{topic_name}/")}
    archiver.rebuild(fixed, DAY, DAY + timedelta(days=1), DAY + timedelta(days=2))
    assert {k: storage.read(k) for k in storage.list(f"partitioned/{topic_name}/")} == files
