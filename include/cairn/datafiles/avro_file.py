"""Avro schemas of the verbatim outputs and a streaming, bounded-memory file writer (fastavro)."""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import IO, Any, NamedTuple, cast

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastavro.io.binary_encoder import BinaryEncoder
from fastavro.write import Writer
from zlib_ng import zlib_ng

from cairn.formats.base import TIMESTAMP_MILLIS

CODECS = ("deflate", "snappy", "zstandard", "null")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# fastavro buffers one block in memory and compresses it once it passes this size, so a writer
# holds ~256 KiB (plus one record) however many records go through it, and the writer's cap of
# open files (cairn.datafiles.writer) bounds the total. fastavro's default (16 kB) makes many tiny
# deflate blocks; 256 KiB compresses nearly as well as larger blocks and every reader streams it.
SYNC_INTERVAL = 256 * 1024

_HEADER = {
    "type": "record",
    "name": "CairnHeader",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "value", "type": ["null", "bytes"], "default": None},
    ],
}

# Every Kafka record, verbatim: the backup never parses, so it never fails on content.
BACKUP_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "CairnBackupRecord",
    "namespace": "cairn",
    "fields": [
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": TIMESTAMP_MILLIS, "doc": "Kafka record timestamp"},
        {"name": "timestamp_type", "type": "int", "doc": "0 CreateTime, 1 LogAppendTime"},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "value", "type": ["null", "bytes"], "default": None},
        {"name": "headers", "type": {"type": "array", "items": _HEADER}, "default": []},
    ],
}

# A record the parser refused: the verbatim record plus why, so nothing is ever dropped.
QUARANTINE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "CairnQuarantineRecord",
    "namespace": "cairn",
    "fields": [
        *copy.deepcopy(BACKUP_SCHEMA["fields"]),
        {"name": "reason", "type": "string"},
        {"name": "processing_time", "type": TIMESTAMP_MILLIS, "doc": "when Cairn parsed it"},
    ],
}


@functools.cache
def codec_available(codec: str) -> bool:
    """True if this Python can write `codec` (snappy and zstandard need optional libraries)."""
    if codec not in CODECS:
        return False
    writer = Writer(io.BytesIO(), {"type": "string"}, codec)
    writer.write("probe")
    try:
        writer.flush()
    except ValueError:
        return False
    return True


@dataclass
class FileStats:
    """What one file holds: the numbers Verify and the run summary need."""

    records: int = 0
    min_offset: int | None = None
    max_offset: int | None = None
    min_event_time: int | None = None
    max_event_time: int | None = None


class AvroFileWriter:
    """Stream records into one Avro container file with memory bounded by one block.

    Records come in as dicts (`append`, encoded here) or as datums the JVM already encoded
    (`append_datum`); both fill the same block, cut by the same rule as fastavro's own writer
    (after the record that takes it past `sync_interval`), so a file's bytes do not depend on
    which path encoded its records. `fileobj` stays open (its owner, e.g. `Storage.open_write`,
    publishes or discards it); `close()` writes the last block. The codec is checked up front so
    a missing library fails before any Kafka data is read, not at the first block.
    """

    def __init__(
        self,
        fileobj: IO[bytes],
        schema: dict[str, Any],
        codec: str = "deflate",
        sync_interval: int = SYNC_INTERVAL,
        metadata: dict[str, str] | None = None,
        name: str = "",
    ) -> None:
        """`metadata` goes into the file header; `name` (the file's key) seeds the sync marker,
        so the same records written twice give byte-identical files."""
        if not codec_available(codec):
            raise ValueError(f"Avro codec {codec!r} is unknown or its library is not installed")
        sync = hashlib.blake2b(name.encode(), digest_size=16).digest()
        self._writer = Writer(
            fileobj,
            _stable(schema),
            codec,
            sync_interval,
            metadata=metadata or {},
            sync_marker=sync,
        )
        if codec == "deflate":
            self._writer.block_writer = deflate_block
        self._schema = self._writer.schema  # parsed
        self._block, self._count, self._interval = io.BytesIO(), 0, sync_interval
        self._closed = False
        self.stats = FileStats()

    def append(self, record: dict[str, Any], offset: int, event_time: int | None = None) -> None:
        """Write one record; `offset` and `event_time` (epoch millis) feed the file's stats."""
        self._check_open()
        fastavro.schemaless_writer(self._block, self._schema, record)
        self._added(offset, event_time)

    def append_datum(self, datum: bytes, offset: int, event_time: int | None = None) -> None:
        """Write one record already encoded with this file's schema (Avro binary)."""
        self._check_open()
        self._block.write(datum)
        self._added(offset, event_time)

    def append_datums(
        self, datums: pa.Array, offsets: np.ndarray, event_times: pa.Array | None = None
    ) -> None:
        """`append_datum` for each of an Arrow array of datums (no nulls) in order, with the same
        blocks, at a cost per block instead of per record: the array's data buffer already holds
        the datums back to back, so each block takes one slice of it."""
        self._check_open()
        n = len(datums)
        if n == 0:
            return
        if datums.null_count:
            raise ValueError("a null datum: every record needs its encoded bytes")
        width = np.int64 if pa.types.is_large_binary(datums.type) else np.int32
        _, ends_buffer, data = datums.buffers()
        ends = np.frombuffer(ends_buffer, dtype=width)[datums.offset : datums.offset + n + 1]
        view = memoryview(data)
        start = 0
        while start < n:
            # the first record whose end takes the block to the interval ends it, as in `_added`
            target = self._interval - self._block.tell() + ends[start]
            cut = start + int(np.searchsorted(ends[start + 1 :], target, side="left"))
            stop = min(cut + 1, n)
            self._block.write(view[ends[start] : ends[stop]])
            self._count += stop - start
            if cut < n:
                self._dump()
            start = stop
        times = None
        if event_times is not None and event_times.null_count < n:
            low, high = (v.as_py() for v in pc.min_max(event_times).values())
            times = low, high
        self._count_in(n, (int(offsets.min()), int(offsets.max())), times)

    def flush(self) -> None:
        """Write the buffered block out (the file stays valid Avro after each flush)."""
        self._dump()
        self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def _dump(self) -> None:
        if self._count:
            self._writer.write_block(_Block(self._count, self._block))
            self._block, self._count = io.BytesIO(), 0

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("writer is closed")

    def _added(self, offset: int, event_time: int | None) -> None:
        self._count += 1
        if self._block.tell() >= self._interval:
            self._dump()
        self._count_in(1, (offset, offset), None if event_time is None else (event_time,) * 2)

    def _count_in(
        self, records: int, offsets: tuple[int, int], event_times: tuple[int, int] | None
    ) -> None:
        """Add `records` with these spans of offsets and event times to the file's stats."""
        s = self.stats
        s.records += records
        s.min_offset, s.max_offset = widen(s.min_offset, s.max_offset, *offsets)
        if event_times is not None:
            s.min_event_time, s.max_event_time = widen(
                s.min_event_time, s.max_event_time, *event_times
            )


def _stable(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its keys sorted, for the header: fastavro's parsed schemas do not keep
    one key order (a field's `doc` and `default` came out either way round in different
    processes), and a retry on another worker must write the same header bytes."""
    plain = {k: v for k, v in schema.items() if k not in ("__fastavro_parsed", "__named_schemas")}
    return json.loads(json.dumps(plain, sort_keys=True))


def deflate_block(fo: IO[bytes], block: bytes, level: int | None) -> None:
    """fastavro's deflate block writer (`Writer.block_writer`: the size, then the data), with
    zlib-ng's deflate: the Avro codec's raw deflate at zlib's default level, in about two thirds
    of zlib's CPU (deflate is most of a Python worker's time). A pinned wheel gives the same bytes
    wherever Cairn runs on one CPU architecture."""
    data = zlib_ng.compress(block, -1 if level is None else level, wbits=-15)
    BinaryEncoder(fo).write_long(len(data))
    fo.write(data)


class _Block(NamedTuple):
    """What fastavro's `Writer.write_block` takes: encoded records it compresses and frames."""

    num_records: int
    bytes_: io.BytesIO


_BACKUP_PARSED = fastavro.parse_schema(BACKUP_SCHEMA)
_QUARANTINE_PARSED = fastavro.parse_schema(QUARANTINE_SCHEMA)


def encode_quarantine(record: dict[str, Any]) -> bytes:
    """A quarantine record as its datum: the bytes `AvroFileWriter.append` writes for it."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _QUARANTINE_PARSED, record)
    return out.getvalue()


def decode_backup(datum: bytes) -> dict[str, Any]:
    """A backup datum as the record dict the writer encodes (timestamp in epoch millis)."""
    record = cast(dict[str, Any], fastavro.schemaless_reader(io.BytesIO(datum), _BACKUP_PARSED))
    record["timestamp"] = millis(record["timestamp"])
    return record


def millis(value: int | datetime) -> int:
    """Epoch millis of a timestamp as read from Cairn's files, old (long) or new (datetime)."""
    if isinstance(value, datetime):
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return value


def read_metadata(head: bytes) -> dict[str, str]:
    """The user metadata in an Avro file's header, from the file's first bytes."""
    reader = fastavro.reader(io.BytesIO(head))
    return {k: v for k, v in reader.metadata.items() if not k.startswith("avro.")}


def widen(low: int | None, high: int | None, lo: int, hi: int) -> tuple[int, int]:
    """The span [low, high] (None: empty) widened to take in [lo, hi]."""
    if low is None or high is None:
        return lo, hi
    return min(low, lo), max(high, hi)


# --- merging files block by block --------------------------------------------------------------

_MAGIC = b"Obj\x01"


@dataclass(frozen=True)
class Header:
    """An Avro container file's header: what a reader needs before the first block."""

    schema: str
    """The writer schema's JSON as the file holds it."""
    codec: str
    metadata: dict[str, str]
    """The user metadata (`cairn.*`)."""
    sync: bytes


def read_header(f: IO[bytes]) -> Header:
    """Read a container file's header, leaving `f` at its first block."""
    if f.read(4) != _MAGIC:
        raise ValueError("not an Avro container file")
    entries: dict[str, bytes] = {}
    while (count := _read_long(f)) != 0:
        if count < 0:
            count = -count
            _read_long(f)  # the block's size in bytes
        for _ in range(count):
            key = f.read(_read_long(f)).decode()
            entries[key] = f.read(_read_long(f))
    return Header(
        schema=entries.pop("avro.schema").decode(),
        codec=entries.pop("avro.codec", b"null").decode(),
        metadata={k: v.decode() for k, v in entries.items()},
        sync=f.read(16),
    )


def raw_blocks(f: IO[bytes], header: Header) -> Iterator[tuple[int, bytes]]:
    """The file's blocks as they are stored: (record count, compressed bytes); never decoded."""
    while (first := f.read(1)) != b"":
        count = _read_long(f, first)
        data = f.read(_read_long(f))
        if f.read(16) != header.sync:
            raise ValueError("an Avro block does not end with the file's sync marker")
        yield count, data


class BlockFileWriter:
    """Write a container file from blocks already encoded and compressed: merging files of one
    schema and codec costs a copy of their bytes, not a decode and re-encode.

    Blocks spool to a local file (memory stays one block), because the header — schema, codec
    and metadata that may depend on every block — comes first in the file: `write_to` writes it,
    then the blocks. `name` seeds the sync marker, so the same blocks give byte-identical files."""

    def __init__(self, name: str) -> None:
        self._sync = hashlib.blake2b(name.encode(), digest_size=16).digest()
        self._spool = tempfile.SpooledTemporaryFile(max_size=SYNC_INTERVAL)  # noqa: SIM115
        self.records = self.bytes = 0

    def append_block(self, count: int, data: bytes) -> None:
        block = io.BytesIO()
        _write_long(block, count)
        _write_long(block, len(data))
        block.write(data)
        block.write(self._sync)
        self._spool.write(block.getvalue())
        self.records += count
        self.bytes += block.tell()

    def write_to(self, out: IO[bytes], schema: str, codec: str, metadata: dict[str, str]) -> int:
        """Write the file (header, then the blocks) to `out`; returns its size."""
        head = _header_bytes(Header(schema=schema, codec=codec, metadata=metadata, sync=self._sync))
        out.write(head)
        self._spool.seek(0)
        shutil.copyfileobj(self._spool, out)
        self._spool.close()
        self.bytes += len(head)
        return self.bytes


def with_schema(data: IO[bytes], header: Header, schema: str) -> IO[bytes]:
    """The container file `data` (just past its header, `header`) as a file whose header says
    `schema`: its blocks read under another schema of the same binary encoding."""
    return io.BufferedReader(_Joined(_header_bytes(replace(header, schema=schema)), data))


def _header_bytes(header: Header) -> bytes:
    entries = {"avro.schema": header.schema.encode(), "avro.codec": header.codec.encode()}
    entries |= {k: v.encode() for k, v in sorted(header.metadata.items())}
    head = io.BytesIO()
    head.write(_MAGIC)
    _write_long(head, len(entries))
    for key, value in entries.items():
        _write_long(head, len(key.encode()))
        head.write(key.encode())
        _write_long(head, len(value))
        head.write(value)
    _write_long(head, 0)
    head.write(header.sync)
    return head.getvalue()


class _Joined(io.RawIOBase):
    """`head`, then the rest of `tail`, as one stream."""

    def __init__(self, head: bytes, tail: IO[bytes]) -> None:
        self.head, self.tail = io.BytesIO(head), tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.head.readinto(buffer) or self.tail.readinto(buffer)  # type: ignore[attr-defined]


def _read_long(f: IO[bytes], first: bytes | None = None) -> int:
    """Avro's zig-zag varint long."""
    shift = result = 0
    while True:
        byte = first if first is not None else f.read(1)
        first = None
        if not byte:
            raise EOFError("an Avro file ends inside a number")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return (result >> 1) ^ -(result & 1)
        shift += 7


def _write_long(out: IO[bytes], value: int) -> None:
    BinaryEncoder(out).write_long(value)
