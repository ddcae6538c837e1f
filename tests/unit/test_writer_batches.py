"""Arrow batches of JVM-encoded records (as the archive job hands them over) against the same
records written one by one through the Python parser: the same files, byte for byte, in the
same order, whatever mix of parsed, refused and poison records, folders and batch sizes."""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime, timedelta

import fastavro
import pyarrow as pa
import pytest

from cairn.datafiles.avro_file import BACKUP_SCHEMA
from cairn.datafiles.fastpath import OUTPUT_COLUMNS
from cairn.datafiles.writer import EncodedRecord, KafkaRecord, ParsedWriter, write_partition
from cairn.formats import open_format
from cairn.formats.base import KafkaCoords, Parsed
from cairn.storage.objects import Storage
from tests.unit.test_writer import ATTEMPT, NOW, config, event, rec

BACKUP = fastavro.parse_schema(BACKUP_SCHEMA)
ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("backup", pa.binary()),
        ("datum", pa.binary()),
        ("event_time", pa.int64()),
    ]
)
assert tuple(ARROW.names) == OUTPUT_COLUMNS


def records(rng: random.Random, count: int, around: datetime) -> list[KafkaRecord]:
    """Valid events spread over a day around `around` (folders revisited out of order), with
    poison mixed in: invalid JSON, tombstones, missing or unreadable times, wrong types."""
    poison = [b'{"id": "a", "n":', None, event(None), event("yesterday"), event("x", n="1")]
    out, offset = [], 1000
    for _ in range(count):
        offset += rng.choice([1, 1, 1, 2])  # holes, as compaction leaves
        if rng.random() < 0.08:
            value = rng.choice(poison)
        else:
            when = around + timedelta(milliseconds=rng.randrange(-43_200_000, 43_200_000))
            pad = "é" * rng.choice([0, 10, 3000])  # some blocks fill in a few records
            value = event(when.isoformat(timespec="milliseconds"), id=f"e{offset}{pad}")
        out.append(rec(offset, value))
    return out


def encoded(cfg, rows: list[KafkaRecord], rng: random.Random) -> list[EncodedRecord]:
    """What the JVM hands over: every backup datum; the parsed datum for most valid records
    (the rest left to Python, some with the event time missing as a refusal would)."""
    fmt, out = open_format(cfg) if cfg.parses else None, []
    for r in rows:
        backup = io.BytesIO()
        verbatim = r._asdict() | {"headers": []}
        fastavro.schemaless_writer(backup, BACKUP, verbatim)
        coords = KafkaCoords(r.partition, r.offset, r.timestamp)
        parsed = fmt.parse(r.value, coords, NOW) if fmt else None
        datum = event_time = None
        if isinstance(parsed, Parsed) and rng.random() < 0.85:
            datum, event_time = parsed.datum, parsed.event_time
            if event_time is not None and rng.random() < 0.03:
                event_time = None  # refused for the time: Python must file it
        out.append(EncodedRecord(r.topic, r.partition, r.offset, r.timestamp, backup.getvalue(),
                                 datum, event_time))  # fmt: skip
    return out


def batches(rows: list[EncodedRecord], rng: random.Random) -> list[pa.RecordBatch]:
    out, start = [], 0
    while start < len(rows):
        size = rng.choice([1, 7, 150, 600])
        chunk = rows[start : start + size]
        out.append(pa.RecordBatch.from_pylist([r._asdict() for r in chunk], schema=ARROW))
        start += size
    return out


def files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.avro")}


@pytest.mark.parametrize(
    ("path_format", "max_open", "whole"),
    [
        ("dt=%Y-%m-%d/hr=%H", 256, True),  # every batch in one go
        ("dt=%Y-%m-%d/hr=%H", 3, False),  # most batches would evict: record by record
        ("dt=%Y-%m-%d/hr=%H/min=%M", 256, False),  # a folder a minute: some of each
    ],
)
@pytest.mark.parametrize(
    ("zone", "around"),
    [
        ("UTC", datetime(2024, 6, 1, 12, tzinfo=UTC)),
        ("America/New_York", datetime(2024, 11, 3, 6, tzinfo=UTC)),  # the DST fold
        ("Europe/Amsterdam", datetime(1937, 7, 1, tzinfo=UTC)),  # an offset of odd seconds
    ],
)
def test_batches_write_the_bytes_records_one_by_one_write(
    tmp_path, monkeypatch, zone, around, path_format, max_open, whole
):
    cfg = config(tmp_path, timezone=zone, path_format=path_format)
    rng = random.Random(f"{zone}{path_format}{max_open}")
    rows = records(rng, 1500, around)
    reference = write_partition(
        rows, cfg, Storage((tmp_path / "ref").as_uri()), NOW, ATTEMPT, max_open
    )
    arrow = batches(encoded(cfg, rows, rng), rng)
    taken: list[bool] = []  # per batch: written whole, or record by record
    write_encoded = ParsedWriter.write_encoded
    monkeypatch.setattr(
        ParsedWriter,
        "write_encoded",
        lambda self, *args: taken.append(write_encoded(self, *args)) or taken[-1],
    )
    fast = write_partition(
        arrow, cfg, Storage((tmp_path / "fast").as_uri()), NOW, ATTEMPT, max_open
    )
    assert fast == reference  # the same file entries, in the same order
    assert files(tmp_path / "fast") == files(tmp_path / "ref")
    kinds = [e.kind for e in reference.files]
    assert kinds.count("quarantine") == 1 and kinds.count("partitioned") > 20
    assert all(taken) if whole else (False in taken)


def test_a_processing_time_topic_and_a_raw_topic_in_batches(tmp_path):
    rng = random.Random(5)
    rows = records(rng, 800, datetime(2024, 6, 1, tzinfo=UTC))
    for fmt, extra in [("json", {"time_source": "processing"}), ("raw", {})]:
        cfg = config(tmp_path, fmt, **extra)
        ref, fast = tmp_path / fmt / "ref", tmp_path / fmt / "fast"
        reference = write_partition(rows, cfg, Storage(ref.as_uri()), NOW, ATTEMPT)
        arrow = batches(encoded(cfg, rows, rng), rng)
        assert write_partition(arrow, cfg, Storage(fast.as_uri()), NOW, ATTEMPT) == reference
        assert files(fast) == files(ref)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"offset": 1001}, "offset 1001 after"),
        ({"partition": 4}, "partition 4 after 3"),
        ({"topic": "other"}, "record of topic 'other'"),
    ],
)
def test_a_batch_out_of_order_is_refused_like_a_record(tmp_path, bad, message):
    cfg = config(tmp_path)
    rng = random.Random(1)
    rows = encoded(cfg, records(rng, 20, datetime(2024, 6, 1, tzinfo=UTC)), rng)
    first = pa.RecordBatch.from_pylist([r._asdict() for r in rows[:10]], schema=ARROW)
    wrong = [r._asdict() for r in rows[10:]]
    wrong[3] |= bad
    out = Storage((tmp_path / "out").as_uri())
    second = pa.RecordBatch.from_pylist(wrong, schema=ARROW)
    with pytest.raises(ValueError, match=message):
        write_partition([first, second], cfg, out, NOW, ATTEMPT)
    assert not list((tmp_path / "out").rglob("*.avro"))
