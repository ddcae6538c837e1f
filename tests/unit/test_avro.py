import hashlib
import io
import json
import random

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from fastavro.write import Writer

from cairn.datafiles.avro_file import (
    BACKUP_SCHEMA,
    CODECS,
    QUARANTINE_SCHEMA,
    AvroFileWriter,
    codec_available,
    deflate_block,
    millis,
)
from tests.unit.conftest import as_read


def backup_record(offset: int, value: bytes | None = b"{}") -> dict:
    return {
        "topic": "t",
        "partition": 0,
        "offset": offset,
        "timestamp": 1_700_000_000_000,
        "timestamp_type": 0,
        "key": None,
        "value": value,
        "headers": [{"key": "h", "value": b"\x00\xff"}, {"key": "n", "value": None}],
    }


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_written_file_reads_back_with_the_requested_codec(codec):
    buf = io.BytesIO()
    writer = AvroFileWriter(buf, BACKUP_SCHEMA, codec)
    records = [backup_record(o, None if o == 3 else bytes([o]) * o) for o in range(10, 0, -1)]
    for i, record in enumerate(records):
        writer.append(record, record["offset"], event_time=1000 - i)
    writer.close()

    buf.seek(0)
    reader = fastavro.reader(buf)
    assert reader.codec == codec
    assert reader.writer_schema["name"] == "cairn.CairnBackupRecord"
    assert list(reader) == [as_read(r) for r in records]
    stats = writer.stats
    assert (stats.records, stats.min_offset, stats.max_offset) == (10, 1, 10)
    assert (stats.min_event_time, stats.max_event_time) == (991, 1000)


def test_every_codec_either_round_trips_or_fails_before_any_data():
    for codec in CODECS:
        buf = io.BytesIO()
        if not codec_available(codec):  # snappy/zstandard without their optional libraries
            with pytest.raises(ValueError, match=codec):
                AvroFileWriter(buf, BACKUP_SCHEMA, codec)
            continue
        writer = AvroFileWriter(buf, BACKUP_SCHEMA, codec)
        writer.append(backup_record(0), 0)
        writer.close()
        buf.seek(0)
        assert fastavro.reader(buf).codec == codec
    assert codec_available("deflate") and not codec_available("lzma")


def test_memory_is_bounded_by_one_block():
    """Blocks go to the file as they fill, so the writer's buffer never holds the whole file."""
    buf = io.BytesIO()
    writer = AvroFileWriter(buf, BACKUP_SCHEMA, "null", sync_interval=64 * 1024)
    unwritten, longest = 0, 0  # records appended since the file last grew
    for offset in range(2000):
        before = buf.tell()
        writer.append(backup_record(offset, b"x" * 1000), offset)
        unwritten = 0 if buf.tell() > before else unwritten + 1
        longest = max(longest, unwritten)
    assert buf.tell() > 1_900_000  # ~2 MB in the file before close
    assert longest <= 64  # never more than one 64 KiB block of ~1 KB records held back
    writer.close()
    buf.seek(0)
    assert sum(1 for _ in fastavro.reader(buf)) == 2000


def test_events_at_epoch_zero_count_in_stats():
    writer = AvroFileWriter(io.BytesIO(), BACKUP_SCHEMA)
    writer.append(backup_record(5), 5, event_time=0)
    writer.append(backup_record(6), 6, event_time=-5)
    writer.append(backup_record(7), 7)
    assert (writer.stats.min_event_time, writer.stats.max_event_time) == (-5, 0)


def test_empty_file_is_valid_avro_and_closed_writer_refuses_records():
    buf = io.BytesIO()
    writer = AvroFileWriter(buf, QUARANTINE_SCHEMA)
    writer.close()
    with pytest.raises(ValueError):
        writer.append({}, 0)
    buf.seek(0)
    assert list(fastavro.reader(buf)) == []


def test_quarantine_schema_is_backup_plus_reason():
    names = [f["name"] for f in QUARANTINE_SCHEMA["fields"]]
    assert names == [f["name"] for f in BACKUP_SCHEMA["fields"]] + ["reason", "processing_time"]
    buf = io.BytesIO()
    writer = AvroFileWriter(buf, QUARANTINE_SCHEMA)
    record = backup_record(1, b"\xff") | {"reason": "invalid UTF-8 at byte 0", "processing_time": 1}
    writer.append(record, 1)
    writer.close()
    buf.seek(0)
    assert list(fastavro.reader(buf)) == [as_read(record)]


def test_timestamps_are_timestamp_millis_and_files_of_the_old_schema_still_read():
    """Spark, Trino and Hive read the Kafka timestamp as a timestamp; files written before,
    with a plain long, read as they were, and `millis` takes both."""
    [field] = [f for f in BACKUP_SCHEMA["fields"] if f["name"] == "timestamp"]
    assert field["type"] == {"type": "long", "logicalType": "timestamp-millis"}
    old = json.loads(json.dumps(BACKUP_SCHEMA))
    old["fields"][3]["type"] = "long"
    buf = io.BytesIO()
    fastavro.writer(buf, old, [backup_record(7)])
    buf.seek(0)
    [row] = fastavro.reader(buf)
    assert row["timestamp"] == 1_700_000_000_000 == millis(row["timestamp"])
    buf = io.BytesIO()
    fastavro.writer(buf, BACKUP_SCHEMA, [backup_record(7)])
    buf.seek(0)
    [row] = fastavro.reader(buf)
    assert row["timestamp"].tzinfo is not None and millis(row["timestamp"]) == 1_700_000_000_000


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_encoded_datums_and_dicts_make_the_same_file_as_fastavro(codec):
    """The JVM's datums and Python's dicts fill the same blocks, cut where fastavro cuts them:
    a file's bytes do not depend on which side encoded its records."""
    records = [backup_record(o, b"v" * (o * 37 % 900)) for o in range(600)]
    schema = fastavro.parse_schema(BACKUP_SCHEMA)
    sync = hashlib.blake2b(b"k", digest_size=16).digest()
    expected = io.BytesIO()
    header_schema = json.loads(json.dumps(BACKUP_SCHEMA, sort_keys=True))
    reference = Writer(expected, header_schema, codec, 8192, sync_marker=sync)
    if codec == "deflate":  # fastavro's framing, our compressor (zlib-ng)
        reference.block_writer = deflate_block
    for r in records:
        reference.write(r)
    reference.flush()
    mixed = io.BytesIO()
    writer = AvroFileWriter(mixed, BACKUP_SCHEMA, codec, sync_interval=8192, name="k")
    for r in records:
        if r["offset"] % 3:
            datum = io.BytesIO()
            fastavro.schemaless_writer(datum, schema, r)
            writer.append_datum(datum.getvalue(), r["offset"])
        else:
            writer.append(r, r["offset"])
    writer.close()
    assert mixed.getvalue() == expected.getvalue()
    assert writer.stats.records == 600 and writer.stats.max_offset == 599


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_arrays_of_datums_fill_the_blocks_that_datums_one_by_one_fill(codec):
    """Blocks are cut after the record that takes them to the interval, also when a record ends
    exactly on it, whatever slices of an Arrow array the datums come in; stats follow."""
    rng = random.Random(codec)
    sizes = [rng.choice([0, 1, 7, 40, 99, 100]) for _ in range(3000)]
    sizes[:4] = [50, 50, 100, 1]  # the first block ends exactly at the interval (100)
    datums = [bytes([i % 256]) * n for i, n in enumerate(sizes)]
    times = [None if i % 5 == 0 else 1_700_000_000_000 - i * 7 for i in range(len(datums))]
    one_by_one, in_arrays = io.BytesIO(), io.BytesIO()
    expected = AvroFileWriter(one_by_one, {"type": "bytes"}, codec, sync_interval=100, name="k")
    for offset, (datum, at) in enumerate(zip(datums, times, strict=True)):
        expected.append_datum(datum, offset, at)
    expected.close()
    writer = AvroFileWriter(in_arrays, {"type": "bytes"}, codec, sync_interval=100, name="k")
    column, at_column, start = pa.array(datums, pa.binary()), pa.array(times, pa.int64()), 0
    while start < len(datums):
        stop = start + rng.choice([1, 2, 30, 500])
        offsets = np.arange(start, min(stop, len(datums)))
        writer.append_datums(column[start:stop], offsets, at_column[start:stop])
        start = stop
    writer.close()
    assert in_arrays.getvalue() == one_by_one.getvalue()
    assert writer.stats == expected.stats and expected.stats.min_event_time is not None
    fresh = AvroFileWriter(io.BytesIO(), {"type": "bytes"}, codec)
    with pytest.raises(ValueError, match="null datum"):
        fresh.append_datums(pa.array([b"x", None], pa.binary()), np.arange(2))
