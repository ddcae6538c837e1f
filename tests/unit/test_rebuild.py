"""Rebuilding a date from the backup, against a real local Storage holding an archive written the
way the pipeline writes it: write_partition per partition, a saved manifest, a committed token."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import fastavro
import pytest

from cairn import manifest, tokens
from cairn.config import TopicConfig, load_topics
from cairn.layout import event_folder, folder_date, parse_data_key
from cairn.manifest import Manifest, VerificationFailed
from cairn.rebuild import (
    RebuildRefused,
    RebuildResult,
    Snapshot,
    Source,
    finish_rebuild,
    newest_rebuild,
    rebuild_source,
    select_sources,
    take_snapshot,
    verify_rebuild,
)
from cairn.storage import Storage
from cairn.writer import KafkaRecord, write_partition

TOPIC = "orders"
SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "ts", "type": ["null", "string", "long"], "default": None},
    ],
}
D1, D2, D3, D4 = (date(2024, 6, d) for d in (1, 2, 3, 4))
LATE = date(2019, 4, 2)


def config(tmp_path, **extra) -> TopicConfig:
    entry = {
        "topic": TOPIC,
        "format": "json",
        "schema": "order.avsc",
        "event_time": {"field": "ts", "encoding": "iso8601"},
        **extra,
    }
    (tmp_path / "order.avsc").write_text(json.dumps(SCHEMA))
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": [entry]}))
    loaded = load_topics(tmp_path / "topics.yaml")
    assert not loaded.errors
    return loaded.topics[0]


def rec(partition: int, offset: int, ts: str | int | None) -> KafkaRecord:
    """An event at `ts`; "bad" makes a value the parser refuses, None a tombstone."""
    value = None if ts is None else b"{bad" if ts == "bad" else json.dumps({"id": "x", "ts": ts})
    encoded = value.encode() if isinstance(value, str) else value
    return KafkaRecord(TOPIC, partition, offset, 1_700_000_000_000 + offset, 0, b"k", encoded)


def utc_day(r: KafkaRecord) -> date | None:
    """The UTC event date of an ISO event; None for records the parser refuses."""
    try:
        return datetime.fromisoformat(json.loads(r.value)["ts"]).date()
    except (TypeError, ValueError):
        return None


def archive_run(storage: Storage, cfg: TopicConfig, at: datetime, records: list) -> str:
    """One committed archive run, as the pipeline does it: write, manifest, verify, commit."""
    prev = tokens.newest(storage, TOPIC)
    seq = tokens.next_seq(prev)
    base = prev.next_offsets if prev else {}
    partitions = sorted({r.partition for r in records})
    results = [
        write_partition([r for r in records if r.partition == p], cfg, storage, at)
        for p in partitions
    ]
    done = dict(zip(partitions, results, strict=True))
    ranges = {p: (base.get(p, 0), r.files[0].last_offset + 1) for p, r in done.items()}
    attempt = Manifest(
        topic=TOPIC,
        attempt_id=f"{seq:012d}-test",
        run_id=f"run-{seq}",
        generation=cfg.generation,
        ranges=ranges,
        records_read={p: r.records for p, r in done.items()},
        files=[e for r in results for e in r.files],
        processing_time=at,
        created_at=at,
    )
    key = manifest.save(storage, attempt)
    report = manifest.verify(attempt, ranges, storage)
    token = tokens.Token(
        seq=seq,
        topic=TOPIC,
        generation=cfg.generation,
        next_offsets=base | {p: end for p, (_, end) in ranges.items()},
        previous_offsets=base,
        counts=report.counts,
        manifest=key,
        run_id=attempt.run_id,
        created_at=at,
        planned_at=at,
    )
    tokens.commit(storage, token)
    return key


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


# Three runs over two partitions; events around midnight (UTC), one from 2019 arriving late.
RUNS = [
    (
        at("2024-06-02T01:00"),
        [
            rec(0, 0, "2024-06-01T10:00:00Z"),
            rec(0, 1, "2024-06-01T23:30:00Z"),
            rec(0, 2, "2024-06-02T00:30:00Z"),
            rec(0, 3, "bad"),
            rec(0, 4, "2024-06-02T02:00:00Z"),
            rec(1, 0, "2024-06-01T12:00:00Z"),
            rec(1, 1, "2024-06-02T03:00:00Z"),
            rec(1, 2, "2024-06-02T05:00:00Z"),
        ],
    ),
    (
        at("2024-06-03T00:30"),
        [
            rec(0, 5, "2024-06-02T22:00:00Z"),
            rec(0, 6, "2024-06-03T00:10:00Z"),
            rec(0, 7, None),
            rec(1, 3, "2019-04-02T01:00:00Z"),
            rec(1, 4, "2024-06-02T23:59:00Z"),
            rec(1, 5, "2024-06-03T01:00:00Z"),
        ],
    ),
    (
        at("2024-06-04T09:00"),
        [
            rec(0, 8, "2024-06-03T12:00:00Z"),
            rec(0, 9, "2024-06-04T08:00:00Z"),
            rec(0, 10, "bad"),
            rec(1, 6, "2024-06-04T01:00:00Z"),
        ],
    ),
]


def build_archive(storage: Storage, cfg: TopicConfig) -> list[str]:
    return [archive_run(storage, cfg, when, records) for when, records in RUNS]


def rebuild(
    storage: Storage, cfg: TopicConfig, day: date, **select
) -> tuple[list[str], list[RebuildResult]]:
    """The rebuild DAG's steps for one date; returns the deleted keys and the per-source results."""
    snap = take_snapshot(storage, TOPIC)
    assert snap is not None
    sources = select_sources(storage, cfg, snap, day, **select)
    results = [rebuild_source(s, cfg, storage, day) for s in sources]
    new = [e for r in results for e in r.files]
    return finish_rebuild(storage, cfg, snap, day, new, sources), results


def read(storage: Storage, key: str) -> list[dict]:
    with storage.open_read(key) as f:
        return list(fastavro.reader(f))


def placed(storage: Storage, kind: str) -> dict[str, list[dict]]:
    return {k: read(storage, k) for k in storage.list(f"{kind}/{TOPIC}/")}


def day_keys(storage: Storage, day: date) -> list[str]:
    """Keys filed under `day`: its partitioned folders and its quarantine."""
    return [
        k
        for k in storage.list("partitioned/") + storage.list("quarantine/")
        if (f := parse_data_key(k)) and folder_date(f.folder.split("/hr=")[0], "dt=%Y-%m-%d") == day
    ]


def coordinates(storage: Storage, kind: str) -> Counter:
    """How often each (partition, offset) appears in `kind`'s files."""
    names = (
        ("partition", "offset") if kind != "partitioned" else ("_kafka_partition", "_kafka_offset")
    )
    rows = (row for rows in placed(storage, kind).values() for row in rows)
    return Counter((row[names[0]], row[names[1]]) for row in rows)


def assert_exactly_once_in_place(storage: Storage, cfg: TopicConfig) -> None:
    """Every backup record once in partitioned-or-quarantine, filed where `cfg` files it."""
    backed_up = coordinates(storage, "backup")
    assert set(backed_up.values()) == {1}
    assert coordinates(storage, "partitioned") + coordinates(storage, "quarantine") == backed_up
    if cfg.event_time is not None:
        for key, rows in placed(storage, "partitioned").items():
            for row in rows:
                when = datetime.fromtimestamp(row["_event_time"] / 1000, UTC)
                assert event_folder(cfg.path_format, when, cfg.tzinfo) == parse_data_key(key).folder
    for key, rows in placed(storage, "quarantine").items():
        for row in rows:
            processed = datetime.fromtimestamp(row["processing_time"] / 1000, cfg.tzinfo)
            assert f"dt={processed.date()}" == parse_data_key(key).folder, (key, row)


def stamps(storage: Storage, keys: list[str]) -> dict[str, int]:
    return {k: os.stat(storage.path(k)).st_mtime_ns for k in keys}


def test_snapshot_is_the_newest_token_and_every_surviving_manifest(tmp_path, storage):
    assert take_snapshot(storage, TOPIC) is None
    manifests = build_archive(storage, config(tmp_path))
    snap = take_snapshot(storage, TOPIC)
    assert (snap.seq, snap.next_offsets, snap.manifests) == (3, {0: 11, 1: 7}, manifests)
    assert Snapshot.model_validate_json(snap.model_dump_json()) == snap


def test_rebuild_of_a_day_holds_exactly_its_records_and_leaves_other_days(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    others = [k for k in storage.list() if k not in day_keys(storage, D2)]
    before = stamps(storage, others)

    deleted, results = rebuild(storage, cfg, D2)

    assert deleted == []  # same generation and parser: the same names, rewritten in place
    parsed = [k for k in day_keys(storage, D2) if k.startswith("partitioned/")]
    rows = [
        (row["_kafka_partition"], row["_kafka_offset"]) for k in parsed for row in read(storage, k)
    ]
    expected = [(r.partition, r.offset) for _, rs in RUNS for r in rs if utc_day(r) == D2]
    assert sorted(rows) == sorted(expected)
    [quarantine] = [k for k in day_keys(storage, D2) if k.startswith("quarantine/")]
    assert [row["offset"] for row in read(storage, quarantine)] == [3]  # processed on D2
    assert sum(r.partitioned for r in results) == len(expected)
    assert stamps(storage, others) == before  # other dates (and the backup) untouched
    assert_exactly_once_in_place(storage, cfg)
    assert newest_rebuild(storage, TOPIC, D2).files == [e for r in results for e in r.files]


def test_late_day_reads_only_the_backup_file_holding_it(tmp_path, storage):
    cfg = config(tmp_path)
    build_archive(storage, cfg)
    snap = take_snapshot(storage, TOPIC)
    [source] = select_sources(storage, cfg, snap, LATE)
    assert (source.partition, source.first_offset, source.last_offset) == (1, 3, 5)
    assert source.processing_date == D3
    assert Source.model_validate_json(source.model_dump_json()) == source
    assert len(storage.list("backup/")) == 6

    rebuild(storage, config(tmp_path, generation=2), LATE)
    [key] = day_keys(storage, LATE)
    assert parse_data_key(key).gen == 2
    assert [row["_kafka_offset"] for row in read(storage, key)] == [3]


def test_parser_fix_rebuilding_the_affected_dates_files_every_record_once(tmp_path, storage):
    build_archive(storage, config(tmp_path))  # the topic's timezone was wrong: UTC
    fixed = config(tmp_path, timezone="America/New_York")
    # Midnight-adjacent events and quarantine move a day back; 2019-04-02T01Z to 2019-04-01.
    affected = [LATE - timedelta(days=1), LATE, D1, D2, D3, D4]
    for day in reversed(affected):
        rebuild(storage, fixed, day)
    assert_exactly_once_in_place(storage, fixed)
    assert day_keys(storage, LATE) == []
    assert [k for k in storage.list("quarantine/")] == [
        f"quarantine/{TOPIC}/dt=2024-06-01/1_0_{3:020d}.avro",  # processed 2024-06-01 21:00 NY
        f"quarantine/{TOPIC}/dt=2024-06-02/1_0_{7:020d}.avro",
        f"quarantine/{TOPIC}/dt=2024-06-04/1_0_{10:020d}.avro",
    ]


def test_the_margin_covers_a_fix_that_shifts_event_times_by_hours(tmp_path, storage):
    """Naive ISO times read in the wrong timezone: their instants move by nine hours."""
    naive = [rec(0, 0, "2024-06-01T22:00:00"), rec(1, 0, "2024-06-01T03:00:00")]
    archive_run(storage, config(tmp_path), at("2024-07-15T12:00"), naive)
    tokyo = config(tmp_path, timezone="Asia/Tokyo")
    with pytest.raises(RebuildRefused, match=f"1_0_{0:020d}"):  # 22:00Z is June 2 in Tokyo
        rebuild(storage, tokyo, D1, margin=timedelta(0))
    rebuild(storage, tokyo, D1)
    assert_exactly_once_in_place(storage, tokyo)


def test_generation_bump_leaves_only_the_new_generation_in_the_day(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    old = day_keys(storage, D2)

    deleted, _ = rebuild(storage, cfg, D2)

    assert sorted(deleted) == sorted(old)
    assert {parse_data_key(k).gen for k in day_keys(storage, D2)} == {2}
    assert {parse_data_key(k).gen for k in day_keys(storage, D1) + day_keys(storage, D3)} == {1}
    assert_exactly_once_in_place(storage, cfg)


def test_files_committed_after_the_snapshot_are_untouched(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    snap = take_snapshot(storage, TOPIC)
    sources = select_sources(storage, cfg, snap, D2)
    new = [e for s in sources for e in rebuild_source(s, cfg, storage, D2).files]
    # Meanwhile an archive run commits late data into the same date, and a crashed attempt
    # leaves a file there that no token covers.
    archive_run(storage, cfg, at("2024-06-04T10:00"), [rec(1, 7, "2024-06-02T06:00:00Z")])
    late = [k for k in day_keys(storage, D2) if parse_data_key(k).first_offset == 7]
    write_partition([rec(0, 11, "2024-06-02T07:00:00Z")], cfg, storage, at("2024-06-04T11:00"))

    deleted = finish_rebuild(storage, cfg, snap, D2, new, sources)

    assert deleted and all(parse_data_key(k).gen == 1 for k in deleted)
    assert late and all(storage.exists(k) for k in late)
    offsets = [parse_data_key(k).first_offset for k in day_keys(storage, D2)]
    assert 7 in offsets and 11 in offsets


def test_a_missing_source_makes_finish_refuse_and_delete_nothing(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    snap = take_snapshot(storage, TOPIC)
    sources = select_sources(storage, cfg, snap, D2)
    kept = [s for s in sources if (s.partition, s.first_offset) != (0, 0)]
    new = [e for s in kept for e in rebuild_source(s, cfg, storage, D2).files]
    before = storage.list()

    with pytest.raises(RebuildRefused, match=f"1_0_{2:020d}.avro"):
        finish_rebuild(storage, cfg, snap, D2, new, kept)

    assert storage.list() == before
    assert newest_rebuild(storage, TOPIC, D2) is None


def test_a_rewind_since_the_snapshot_makes_finish_refuse(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    snap = take_snapshot(storage, TOPIC)
    sources = select_sources(storage, cfg, snap, D2)
    new = [e for s in sources for e in rebuild_source(s, cfg, storage, D2).files]
    tokens.rewind(storage, TOPIC, low_watermarks=None, count=1)
    before = storage.list()
    with pytest.raises(RebuildRefused, match="rewound"):
        finish_rebuild(storage, cfg, snap, D2, new, sources)
    assert storage.list() == before


def test_rebuilding_the_same_day_twice_changes_nothing(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    cfg = config(tmp_path, generation=2)
    rebuild(storage, cfg, D2)
    first = {k: read(storage, k) for k in storage.list() if parse_data_key(k)}

    deleted, _ = rebuild(storage, cfg, D2)

    assert deleted == []
    assert {k: read(storage, k) for k in storage.list() if parse_data_key(k)} == first
    assert_exactly_once_in_place(storage, cfg)


def test_far_moves_need_their_dates_listed_and_later_rebuilds_follow_them(tmp_path, storage):
    """Epoch seconds read as millis file June events in January 1970, far past any margin."""
    wrong = config(tmp_path, event_time={"field": "ts", "encoding": "epoch_millis"})
    june1, june2 = 1_717_272_000, 1_717_308_000  # 2024-06-01T20:00Z, 2024-06-02T06:00Z
    archive_run(storage, wrong, at("2024-07-15T12:00"), [rec(0, 0, june1), rec(0, 1, june2)])
    jan = date(1970, 1, 20)
    assert len(day_keys(storage, jan)) == 1

    fixed = config(tmp_path, event_time={"field": "ts", "encoding": "epoch_seconds"})
    snap = take_snapshot(storage, TOPIC)
    assert select_sources(storage, fixed, snap, D1) == []  # the margin cannot reach 1970
    for day in (D1, D2, jan):
        rebuild(storage, fixed, day, also_from=[jan])
    assert_exactly_once_in_place(storage, fixed)
    assert day_keys(storage, jan) == []

    # A second fix (the events were Tokyo time) moves both into June 2; the rebuild of June 1
    # is what tells June 2's rebuild where record 0 lives now.
    tokyo = config(tmp_path, timezone="Asia/Tokyo", event_time=fixed.event_time.model_dump())
    for day in (D2, D1):
        rebuild(storage, tokyo, day)
    assert_exactly_once_in_place(storage, tokyo)
    assert day_keys(storage, D1) == []


def test_processing_time_topic_keeps_its_folders(tmp_path, storage):
    build_archive(storage, config(tmp_path, time_source="processing", event_time=None))
    cfg = config(tmp_path, time_source="processing", event_time=None, generation=2)
    snap = take_snapshot(storage, TOPIC)
    chosen = select_sources(storage, cfg, snap, D2, margin=timedelta(0))
    assert [(s.processing_date, s.first_offset) for s in chosen] == [(D2, 0), (D2, 0)]
    old = day_keys(storage, D2)

    deleted, _ = rebuild(storage, cfg, D2, margin=timedelta(0))

    assert sorted(deleted) == sorted(old)
    new = [parse_data_key(k) for k in day_keys(storage, D2)]
    assert [(f.folder, f.gen) for f in new] == [("dt=2024-06-02/hr=01", 2)] * 2 + [
        ("dt=2024-06-02", 2)
    ]
    assert_exactly_once_in_place(storage, cfg)


def test_raw_topics_have_nothing_to_rebuild(tmp_path, storage):
    raw = config(tmp_path, format="raw", schema=None, event_time=None)
    source = Source(
        key=f"backup/{TOPIC}/partition=0/1_0_{0:020d}.avro",
        partition=0,
        first_offset=0,
        last_offset=9,
        processing_time=at("2024-06-02T01:00"),
        processing_date=D2,
    )
    assert rebuild_source(source, raw, storage, D2) == RebuildResult()


def test_verify_rebuild_catches_missing_resized_and_overlapping_files(tmp_path, storage):
    build_archive(storage, config(tmp_path))
    [entry] = [e for e in rebuild(storage, config(tmp_path), D1)[1][0].files if e.first_offset == 0]
    verify_rebuild(storage, [entry])
    missing = entry.key.replace("1_0_", "1_1_")
    for match, bad in {
        "missing": entry.model_copy(update={"key": missing, "partition": 1}),
        "bytes": entry.model_copy(update={"bytes": entry.bytes + 1}),
    }.items():
        with pytest.raises(VerificationFailed, match=match):
            verify_rebuild(storage, [bad])
    second = entry.key.replace(f"{0:020d}", f"{1:020d}")
    storage.write(second, storage.read(entry.key))
    overlapping = entry.model_copy(update={"key": second, "first_offset": 1, "last_offset": 1})
    with pytest.raises(VerificationFailed, match="overlap"):
        verify_rebuild(storage, [entry.model_copy(update={"last_offset": 1}), overlapping])
