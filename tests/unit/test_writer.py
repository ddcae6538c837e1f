"""The one-pass writer against a real local Storage: what lands where, named how, and what an
error midway leaves behind."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import IO
from zoneinfo import ZoneInfo

import fastavro
import pytest

from cairn.config import TopicConfig
from cairn.datafiles.avro_file import read_metadata
from cairn.datafiles.writer import (
    KafkaRecord,
    OutputFiles,
    ParsedWriter,
    PartitionResult,
    write_partition,
)
from cairn.protocol.manifest import Manifest, verify
from cairn.storage.layout import (
    backup_key,
    event_folder,
    parse_data_key,
    partitioned_key,
    quarantine_key,
)
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from tests.unit.conftest import as_read

TOPIC, P, GEN = "orders", 3, 2
NOW = datetime(2024, 6, 3, 8, 15, tzinfo=UTC)  # processing time
NOW_MS = 1_717_402_500_000
ATTEMPT = "a-000000000007-000001-c0ffee"
SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "int"},
        {"name": "ts", "type": "string"},
    ],
}
HEADERS = [("trace", b"\x00\xff"), ("../h", None)]
BIG = "x" * (5 * 1024 * 1024)


def config(tmp_path, fmt: str = "json", **extra) -> TopicConfig:
    entry = {"topic": TOPIC, "format": fmt, "generation": GEN, **extra}
    if fmt == "json":
        (tmp_path / "order.avsc").write_text(json.dumps(SCHEMA))
        entry["schema"] = "order.avsc"
        if "time_source" not in extra:
            entry["event_time"] = {"field": "ts", "encoding": "iso8601"}
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": [entry]}))
    loaded = load_topics(tmp_path / "topics.yaml")
    assert not loaded.errors
    return loaded.topics[0]


def event(ts: str | None, id: str = "a", **fields) -> bytes:
    body = {"id": id, "n": 1} | ({"ts": ts} if ts is not None else {}) | fields
    return json.dumps(body).encode()


def rec(offset: int, value: bytes | None, key: bytes | None = b"k", **kw) -> KafkaRecord:
    base = dict(topic=TOPIC, partition=P, offset=offset, timestamp=1_717_000_000_000 + offset)
    return KafkaRecord(**(base | dict(timestamp_type=0, key=key, value=value, headers=None) | kw))


# (record, where it must land: a partitioned folder, or "q:<reason prefix>")
MIXED = [
    (rec(100, event("2024-06-01T10:05:00Z"), headers=HEADERS), "dt=2024-06-01/hr=10"),
    (rec(101, event("2024-06-01T11:59:59+00:00")), "dt=2024-06-01/hr=11"),
    (rec(103, b'{"id": "a", "n":'), "q:invalid JSON"),  # offset 102 is a hole (compaction)
    (rec(104, None, timestamp_type=1), "q:tombstone"),
    (rec(105, event("2024-06-01T10:30:00Z"), key=b"\xff\xfe\x00"), "dt=2024-06-01/hr=10"),
    (rec(106, event("2019-01-01T00:00:00Z"), key=None), "dt=2019-01-01/hr=00"),
    (rec(107, event("2024-06-02T00:00:00+02:00", id=BIG)), "dt=2024-06-01/hr=22"),
    (rec(108, event(None)), "q:event time field 'ts' is missing"),
    (rec(109, event("../../etc/passwd"), key=b"../../x"), "q:event time field 'ts' is not ISO"),
    (rec(110, b"\xc3\x28"), "q:invalid UTF-8"),
    (rec(111, event("2024-06-02T03:00:00Z")), "dt=2024-06-02/hr=03"),
]


def verbatim(r: KafkaRecord) -> dict:
    headers = [{"key": k, "value": v} for k, v in r.headers or []]
    return r._asdict() | {"headers": headers}


def read(storage: Storage, key: str) -> list[dict]:
    with storage.open_read(key) as f:
        return list(fastavro.reader(f))


def data_keys(storage: Storage) -> list[str]:
    return [k for k in storage.list() if parse_data_key(k)]


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def test_mixed_batch_lands_verbatim_parsed_or_quarantined(tmp_path, storage):
    records = [r for r, _ in MIXED]
    result = write_partition(iter(records), config(tmp_path), storage, NOW, ATTEMPT)

    assert (result.partition, result.records) == (P, len(records))
    assert result.last_timestamp == records[-1].timestamp
    assert PartitionResult.model_validate_json(result.model_dump_json()) == result
    entries = {e.key: e for e in result.files}
    assert sorted(entries) == storage.list()  # nothing else, nothing staged left behind

    backup = backup_key(TOPIC, GEN, P, 100)
    assert read(storage, backup) == [as_read(verbatim(r)) for r in records]

    good = [(r, where) for r, where in MIXED if not where.startswith("q:")]
    folders = sorted({where for _, where in good})
    for folder in folders:
        mine = [r for r, where in good if where == folder]
        key = partitioned_key(TOPIC, GEN, P, mine[0].offset, folder)
        rows = read(storage, key)
        assert [row["_kafka_offset"] for row in rows] == [r.offset for r in mine]
        for row, r in zip(rows, mine, strict=True):
            body = json.loads(r.value)
            assert row == as_read(
                body
                | {
                    "_kafka_partition": P,
                    "_kafka_offset": r.offset,
                    "_kafka_timestamp": r.timestamp,
                    "_event_time": ms(body["ts"]),
                }
            )
        times = [ms(json.loads(r.value)["ts"]) for r in mine]
        e = entries[key]
        assert (e.kind, e.records, e.first_offset, e.last_offset) == (
            "partitioned",
            len(mine),
            mine[0].offset,
            mine[-1].offset,
        )
        assert (e.min_event_time, e.max_event_time) == (min(times), max(times))

    bad = [(r, where[2:]) for r, where in MIXED if where.startswith("q:")]
    quarantine = quarantine_key(TOPIC, GEN, P, bad[0][0].offset, NOW.date())
    rows = read(storage, quarantine)
    assert [{k: v for k, v in row.items() if k != "reason"} for row in rows] == [
        as_read(verbatim(r) | {"processing_time": NOW_MS}) for r, _ in bad
    ]
    for row, (_, reason) in zip(rows, bad, strict=True):
        assert row["reason"].startswith(reason), row["reason"]

    assert len(entries) == 1 + len(folders) + 1
    for e in result.files:
        assert e.partition == P and e.bytes == storage.size(e.key)
        if e.kind != "partitioned":
            assert e.min_event_time is None and e.max_event_time is None
    kinds = ("backup", "partitioned", "quarantine")
    counts = {k: sum(e.records for e in result.files if e.kind == k) for k in kinds}
    assert counts == {"backup": len(records), "partitioned": len(good), "quarantine": len(bad)}


def test_output_passes_manifest_verify(tmp_path, storage):
    records = [r for r, _ in MIXED]
    result = write_partition(records, config(tmp_path), storage, NOW, ATTEMPT)
    ranges = {P: (100, 112)}
    manifest = Manifest(
        topic=TOPIC,
        attempt_id="a1",
        run_id="r1",
        generation=GEN,
        ranges=ranges,
        records_read={P: result.records},
        files=result.files,
        processing_time=NOW,
        created_at=NOW,
    )
    report = verify(manifest, ranges, storage)
    assert report.counts.backup == len(records)
    assert report.counts.partitioned + report.counts.quarantined == len(records)


def hourly(offsets_hours: list[tuple[int, int]]) -> list[KafkaRecord]:
    return [rec(o, event(f"2024-06-01T{h:02d}:00:00Z", id=str(o))) for o, h in offsets_hours]


# Hours 10, 11, 10, 12, 10, 11 with two writers open: 12 evicts 11 (10 was used more recently,
# so this is LRU, not FIFO), then 11 comes back and evicts 12.
INTERLEAVED = hourly([(0, 10), (1, 11), (2, 10), (3, 12), (4, 10), (5, 11)])


def partitioned_files(storage: Storage) -> dict[str, list[int]]:
    return {
        k: [row["_kafka_offset"] for row in read(storage, k)] for k in storage.list("partitioned/")
    }


def test_lru_limit_finishes_files_early_with_deterministic_names(tmp_path, storage):
    result = write_partition(INTERLEAVED, config(tmp_path), storage, NOW, ATTEMPT, max_open_files=2)

    def key(hour: int, first: int) -> str:
        return partitioned_key(TOPIC, GEN, P, first, f"dt=2024-06-01/hr={hour}")

    assert partitioned_files(storage) == {
        key(10, 0): [0, 2, 4],
        key(11, 1): [1],
        key(12, 3): [3],
        key(11, 5): [5],
    }
    # Finished in eviction order, then the backup and the still-open ones at the end.
    assert [e.key for e in result.files] == [
        key(11, 1),
        key(12, 3),
        backup_key(TOPIC, GEN, P, 0),
        key(10, 0),
        key(11, 5),
    ]
    assert all(e.bytes == storage.size(e.key) for e in result.files)


def test_same_input_gives_byte_identical_files(tmp_path):
    """A retried task rewrites its staged files byte for byte (sync markers come from names)."""
    cfg = config(tmp_path)
    records = [r for r, _ in MIXED] + hourly([(200, 1), (201, 2), (202, 1), (203, 3)])
    contents = []
    for name in ("one", "two"):
        storage = Storage(f"file://{tmp_path}/{name}")
        result = write_partition(records, cfg, storage, NOW, ATTEMPT, max_open_files=2)
        assert sorted(e.key for e in result.files) == storage.list()
        contents.append({k: storage.read(k) for k in storage.list()})
    assert contents[0] == contents[1]

    write_partition(records, cfg, storage, NOW, ATTEMPT, max_open_files=2)  # a retry
    assert {k: storage.read(k) for k in storage.list()} == contents[1]


def header(storage: Storage, key: str) -> dict[str, str]:
    """A file's Cairn metadata, from its first 4 KB (where a rebuild finds it)."""
    return read_metadata(storage.read_head(key, 4096))


def test_headers_name_the_processing_time_and_the_attempt_or_the_backup_source(tmp_path, storage):
    records = [r for r, _ in MIXED]
    result = write_partition(records, config(tmp_path), storage, NOW, ATTEMPT, max_open_files=2)

    backup = backup_key(TOPIC, GEN, P, 100)
    when = {"cairn.processing_time": NOW.isoformat()}
    parsed = [e.key for e in result.files if e.key != backup]
    assert header(storage, backup) == when | {"cairn.attempt": ATTEMPT}
    assert len(parsed) == 6  # 5 partitioned (3 evicted early) and the quarantine
    for key in parsed:
        assert header(storage, key) == when | {"cairn.source": backup}, key


def test_another_processing_time_or_attempt_changes_only_what_names_it(tmp_path):
    cfg = config(tmp_path)
    records = [r for r, _ in MIXED]
    later = NOW + timedelta(hours=1)
    runs = {}
    for name, when, attempt in (("a", NOW, ATTEMPT), ("b", NOW, "a-1"), ("c", later, ATTEMPT)):
        storage = Storage(f"file://{tmp_path}/{name}")
        write_partition(records, cfg, storage, when, attempt)
        runs[name] = {k: storage.read(k) for k in storage.list()}

    backup = backup_key(TOPIC, GEN, P, 100)
    differ = {k for k in runs["a"] if runs["a"][k] != runs["b"][k]}
    assert differ == {backup}  # the attempt is named by the backup file only
    assert {k for k in runs["a"] if runs["a"][k] != runs["c"].get(k)} == set(runs["a"])


def test_error_midway_leaves_only_whole_finished_files(tmp_path, storage):
    def records() -> Iterator[KafkaRecord]:
        yield from hourly([(0, 10), (1, 11), (2, 10)])
        yield rec(3, b"not json")
        raise RuntimeError("Kafka fetch failed")

    with pytest.raises(RuntimeError, match="Kafka fetch failed"):
        write_partition(records(), config(tmp_path), storage, NOW, ATTEMPT, max_open_files=1)

    # hr=10@0 and hr=11@1 were finished by eviction; hr=10@2, backup and quarantine were open.
    assert partitioned_files(storage) == {
        partitioned_key(TOPIC, GEN, P, 0, "dt=2024-06-01/hr=10"): [0],
        partitioned_key(TOPIC, GEN, P, 1, "dt=2024-06-01/hr=11"): [1],
    }
    assert storage.list() == sorted(partitioned_files(storage))
    staging = tmp_path / "archive" / "_staging"
    assert not staging.exists() or not any(staging.iterdir())


@pytest.mark.parametrize(
    "bad",
    [
        rec(1, b"{}"),  # offsets must increase
        rec(5, b"{}", partition=P + 1),  # one partition per call
        rec(5, b"{}", topic="other"),
    ],
)
def test_records_outside_one_partition_in_order_are_refused(tmp_path, storage, bad):
    records = [*hourly([(1, 10), (2, 10)]), bad]
    with pytest.raises(ValueError):
        write_partition(records, config(tmp_path), storage, NOW, ATTEMPT)
    assert storage.list() == []


def test_raw_topic_writes_backup_only(tmp_path, storage):
    records = [r for r, _ in MIXED]
    result = write_partition(records, config(tmp_path, "raw"), storage, NOW, ATTEMPT)
    key = backup_key(TOPIC, GEN, P, 100)
    assert storage.list() == [key]
    assert read(storage, key) == [as_read(verbatim(r)) for r in records]
    [entry] = result.files
    assert (entry.kind, entry.records, entry.first_offset, entry.last_offset) == (
        "backup",
        len(records),
        100,
        111,
    )
    assert entry.bytes == storage.size(key)


def test_processing_time_topic_uses_one_folder_and_no_event_times(tmp_path, storage):
    cfg = config(tmp_path, time_source="processing", timezone="Asia/Tokyo")
    result = write_partition([*hourly([(0, 1), (1, 5)]), rec(2, None)], cfg, storage, NOW, ATTEMPT)
    [part] = [e for e in result.files if e.kind == "partitioned"]
    assert part.key == partitioned_key(TOPIC, GEN, P, 0, "dt=2024-06-03/hr=17")
    assert (part.records, part.min_event_time, part.max_event_time) == (2, None, None)
    [quarantine] = [e for e in result.files if e.kind == "quarantine"]
    assert quarantine.key == quarantine_key(TOPIC, GEN, P, 2, NOW.date())


def test_no_records_no_files(tmp_path, storage):
    result = write_partition([], config(tmp_path), storage, NOW, ATTEMPT)
    assert result == PartitionResult(partition=None, records=0, last_timestamp=None, files=[])
    assert storage.list() == []


class TrackingStorage(Storage):
    """Counts uploads still open, to prove an error closes every one before it propagates."""

    open_uploads = 0

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[IO[bytes]]:
        self.open_uploads += 1
        try:
            with super().open_write(key) as out:
                yield out
        finally:
            self.open_uploads -= 1


def test_error_exits_every_open_upload_before_propagating(tmp_path):
    storage = TrackingStorage(f"file://{tmp_path}/archive")
    records = [*hourly([(0, 10), (1, 11), (2, 12)]), rec(3, b"bad"), rec(2, b"{}")]
    with pytest.raises(ValueError, match="offset 2 after 3") as raised:
        write_partition(records, config(tmp_path), storage, NOW, ATTEMPT, max_open_files=2)
    assert raised.traceback  # the frames (and any leaked generator) are still alive here
    assert storage.open_uploads == 0
    assert storage.list() == [partitioned_key(TOPIC, GEN, P, 0, "dt=2024-06-01/hr=10")]


def test_bytearrays_from_spark_rows_are_written_as_bytes(tmp_path, storage):
    value = bytearray(event("2024-06-01T10:00:00Z"))
    r = rec(0, value, key=bytearray(b"\xff"), headers=[("h", bytearray(b"\x01"))])
    write_partition([r], config(tmp_path), storage, NOW, ATTEMPT)
    [row] = read(storage, backup_key(TOPIC, GEN, P, 0))
    assert (row["key"], row["value"], row["headers"]) == (
        b"\xff",
        bytes(value),
        [{"key": "h", "value": b"\x01"}],
    )
    [parsed] = read(storage, partitioned_key(TOPIC, GEN, P, 0, "dt=2024-06-01/hr=10"))
    assert parsed["_kafka_offset"] == 0


def _transitions(tz: ZoneInfo, year: int) -> list[int]:
    """Epoch millis of the offset changes of `tz` in `year` (bisected to the millisecond)."""
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000)
    found, step = [], 3_600_000
    offset = lambda ms: (datetime.fromtimestamp(ms / 1000, UTC).astimezone(tz)).utcoffset()  # noqa: E731
    for low in range(start, start + 366 * 86_400_000, step):
        high = low + step
        if offset(low) != offset(high):
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if offset(mid) == offset(low) else (low, mid)
            found.append(high)
    return found


@pytest.mark.parametrize(
    ("zone", "year"),
    [
        ("America/New_York", 2024),
        ("Europe/Amsterdam", 1916),
        ("Europe/Amsterdam", 1937),
        ("Asia/Kathmandu", 1985),
    ],
)
@pytest.mark.parametrize("path_format", ["dt=%Y-%m-%d/hr=%H", "dt=%Y-%m-%d/hr=%H/min=%M"])
def test_the_minute_memo_files_every_millisecond_as_rendering_it_would(
    tmp_path, storage, zone, year, path_format
):
    """Around offset changes, also ones at odd seconds (local mean time), the memo of folders by
    UTC minute gives what `event_folder` gives for each millisecond."""
    cfg = config(tmp_path, timezone=zone, path_format=path_format)
    files = OutputFiles(storage, cfg.codec, contextlib.ExitStack())
    writer = ParsedWriter(cfg, files, NOW, NOW.date(), 4)
    changes = _transitions(ZoneInfo(zone), year)
    assert changes
    rng = random.Random(zone)
    for change in changes:
        for millis in sorted(change + rng.randrange(-7_200_000, 7_200_000) for _ in range(3000)):
            when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
            assert writer._folder_of(millis) == event_folder(path_format, when, cfg.tzinfo)
