"""The seal's writer: one folder of a date merged into sealed files and the table's Parquet
files, in a Spark task (`seal_folder`; the seal job runs one per folder).

`cairn.pipeline.seal` selects what a seal merges (its `Selection`, which this reads as a
`SealPlan`) and commits what this staged (`FolderResult`, saved in the attempt's manifest). Here
a folder's files are merged block by block into `<gen>_sealed_<n>.avro` files
(`cairn.datafiles.sealed_file`), each naming in its header the backup files and offsets its
records came from, and every record is decoded once for the table's Parquet files
(`cairn.datafiles.parquet_file`) and the proof's counts (`SourceTally`). It commits nothing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import IO, Literal, Protocol, cast

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt

from cairn.datafiles.avro_file import Header, raw_blocks, read_header, with_schema
from cairn.datafiles.parquet_file import EVENT_DATE, ParquetFileWriter, json_fields
from cairn.datafiles.sealed_file import (
    ReEncoded,
    SealedFileWriter,
    SourceSpan,
    SourceTally,
    canonical,
    sources_of,
)
from cairn.errors import PermanentError
from cairn.storage.layout import DataKind, kind_folder, sealed_file_name, table_file_name
from cairn.storage.objects import Storage


class SealRefused(PermanentError):
    """The sealed files would not hold exactly the records of the files they replace."""


class SealInput(BaseModel):
    key: str
    version: str
    bytes: NonNegativeInt


class SealFolder(BaseModel):
    """One folder of the date and the files sealing merges there."""

    kind: Literal["partitioned", "quarantine"]
    folder: str
    inputs: list[SealInput]


class SealedFile(BaseModel):
    key: str
    records: NonNegativeInt
    bytes: NonNegativeInt


class TableFile(BaseModel):
    path: str
    """Relative to the table's location."""
    records: NonNegativeInt


class FolderResult(BaseModel):
    """What `seal_folder` wrote for one folder and what it read."""

    kind: Literal["partitioned", "quarantine"]
    folder: str
    files: list[SealedFile]
    table_files: list[TableFile] = Field(default_factory=list)
    records_read: NonNegativeInt = 0
    spans: list[SourceSpan] = Field(default_factory=list)
    checksum: NonNegativeInt = 0


class _Claimed(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def attempt_id(self) -> str: ...


class SealPlan(Protocol):
    """What `seal_folder` reads of a seal's selection: `cairn.pipeline.seal.Selection`, which
    this layer may not import."""

    @property
    def claim(self) -> _Claimed: ...
    @property
    def folders(self) -> list[SealFolder]: ...
    @property
    def target_bytes(self) -> PositiveInt: ...
    @property
    def generation(self) -> PositiveInt: ...
    def schema_of(self, kind: str) -> dict: ...
    def table_schema(self) -> pa.Schema: ...
    @property
    def date(self) -> date: ...


def seal_folder(
    chosen: SealPlan,
    index: int,
    codec: str,
    storage: Storage,
    staged: Storage,
    table: Storage | None,
) -> FolderResult:
    """Merge folder `index` of the selection into sealed files of at most its target size, and
    write its parsed records to the table's Parquet files (a Spark task, one per folder).

    Blocks of files written with the folder's schema and `codec` are copied as they are; other
    files' records are re-encoded. Every record is also decoded once, to count which backup
    file's offsets fed the date (the proof) and to fill the table file. Memory: a few blocks,
    one row group and one input file up to `_READ_WHOLE_BYTES`. Names depend only on the
    selection, so a retry writes the same files."""
    folder = chosen.folders[index]
    schema = chosen.schema_of(folder.kind)
    same_schema = canonical(json.dumps(schema))
    decoding = _Decoding(schema)
    result = FolderResult(kind=folder.kind, folder=folder.folder, files=[])
    whole = SourceTally()
    with contextlib.ExitStack() as uploads:
        rows = None
        if table is not None and folder.kind == "partitioned":
            rows = _TableRows(table, chosen, index, uploads, decoding.timestamps)
        chunk, in_chunk = _sealed(chosen, folder, schema, codec, 0), SourceTally()
        for item in folder.inputs:
            part = SourceTally()
            opened = _opener(storage, item)
            with opened() as data:
                header = read_header(data)
                copy = header.codec == codec and canonical(header.schema) == same_schema
                if copy:
                    for count, block in raw_blocks(data, header):
                        chunk.blocks.append_block(count, block)
            with opened() as data:
                sources = _Sources(header, item.key, folder.kind)
                reencoded = None if copy else ReEncoded(schema, codec, item.key)
                for batch in decoding.batches(data, header):
                    for source, partitions, offsets in sources.split(batch):
                        part.add(partitions, offsets, source)
                    if reencoded is not None:
                        for record in batch:
                            reencoded.add(record)
                    if rows is not None:
                        rows.add_all(batch)
                if reencoded is not None:
                    reencoded.copy_to(chunk.blocks)
            in_chunk.merge(part)
            whole.merge(part)
            if chunk.blocks.bytes >= chosen.target_bytes:
                result.files.append(_closed(chunk, in_chunk, staged))
                chunk = _sealed(chosen, folder, schema, codec, len(result.files))
                in_chunk = SourceTally()
        if chunk.blocks.records or not result.files:
            result.files.append(_closed(chunk, in_chunk, staged))
        if rows is not None:
            result.table_files = rows.close()
    result.records_read, result.checksum = whole.records, whole.checksum
    result.spans = whole.spans()
    return result


_READ_WHOLE_BYTES = 16 * 2**20
"""An input up to this size is read with one request, and both passes over it (its blocks, its
records) read it from memory; a larger one (an earlier seal's file) is opened twice, so memory
stays a block."""


def _opener(
    storage: Storage, item: SealInput
) -> Callable[[], contextlib.AbstractContextManager[IO[bytes]]]:
    if item.bytes > _READ_WHOLE_BYTES:
        return lambda: storage.open_read(item.key)
    data = storage.read(item.key)
    return lambda: contextlib.nullcontext(io.BytesIO(data))


_MICROS_PER = {
    "timestamp-millis": 1_000,
    "local-timestamp-millis": 1_000,
    "timestamp-micros": 1,
    "local-timestamp-micros": 1,
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Decoding:
    """Decodes a folder's inputs to its schema, its top-level timestamps as numbers.

    fastavro resolves a writer's schema to a reader's record by record, which costs ~40% more
    than reading with the writer's schema alone, so an input written with the folder's very
    schema (names, types, logical types, docs) is read with its own. And it makes a datetime of
    each timestamp (~0.85 µs a value) that Arrow would only turn back into a number, so such an
    input is read under the same schema without the timestamps' logical types: they stay longs
    (`timestamps`: each field's microseconds per unit), which `_TableRows` makes timestamps
    column-wise and an Avro writer takes as they are."""

    def __init__(self, schema: dict) -> None:
        self.schema = schema
        self.parsed = fastavro.parse_schema(schema)
        self.timestamps: dict[str, int] = {}
        longs = copy.deepcopy(schema)
        for field in longs["fields"]:  # a timestamp, or a timestamp or null (not in a JSON union)
            types = field["type"] if isinstance(field["type"], list) else [field["type"]]
            match [t for t in types if t != "null"]:
                case [{"logicalType": str(logical)} as branch] if logical in _MICROS_PER:
                    self.timestamps[field["name"]] = _MICROS_PER[branch.pop("logicalType")]
        self.longs = json.dumps(longs)
        self.same: dict[str, bool] = {}

    def batches(self, data: IO[bytes], header: Header) -> Iterator[list[dict]]:
        """The file's records in lists of up to 10,000 (the caller counts them column-wise)."""
        same = self.same.get(header.schema)
        if same is None:
            same = fastavro.parse_schema(json.loads(header.schema)) == self.parsed
            self.same[header.schema] = same
        if same:
            read_header(data)
            reader = fastavro.reader(with_schema(data, header, self.longs))
        else:
            reader = fastavro.reader(data, reader_schema=self.schema)
        records = cast(Iterator[dict], reader)  # fastavro types them as any Avro value
        while batch := list(itertools.islice(records, 10_000)):
            if not same:
                for record in batch:
                    for name, micros in self.timestamps.items():
                        if (value := record.get(name)) is not None:
                            epoch = _EPOCH if value.tzinfo else _EPOCH.replace(tzinfo=None)
                            record[name] = (value - epoch) // timedelta(microseconds=micros)
            yield batch


def _sealed(
    chosen: SealPlan, folder: SealFolder, schema: dict, codec: str, n: int
) -> SealedFileWriter:
    key = kind_folder(folder.kind, chosen.claim.topic, folder.folder)
    return SealedFileWriter(key + sealed_file_name(chosen.generation, n), schema, codec)


def _closed(chunk: SealedFileWriter, tally: SourceTally, staged: Storage) -> SealedFile:
    size = chunk.close(staged, tally.spans())
    return SealedFile(key=chunk.key, records=chunk.blocks.records, bytes=size)


_NONE = np.zeros(1, dtype=np.int64)
"""The span ends of a partition an input's header lists no span of (every record is outside)."""


class _Sources:
    """Which backup file a record of one input file came from: its header names it (a run's or
    a rebuild's file), or lists them with their offsets (a file sealed before)."""

    def __init__(self, header: Header, key: str, kind: DataKind) -> None:
        self.one = header.metadata.get("cairn.source")
        self.processing_time = header.metadata.get("cairn.processing_time")
        self.key, self.kind = key, kind
        self.spans: dict[int, list[SourceSpan]] = defaultdict(list)
        for span in sorted(sources_of(header.metadata) or [], key=lambda s: s.first):
            self.spans[span.partition].append(span)
        self.firsts = {p: np.array([s.first for s in v]) for p, v in self.spans.items()}
        self.lasts = {p: np.array([s.last for s in v]) for p, v in self.spans.items()}

    def split(
        self, records: list[dict]
    ) -> Iterator[tuple[tuple[str | None, str | None], np.ndarray, np.ndarray]]:
        """The Kafka partitions and offsets of `records`, by the backup file each came from (its
        key, and the processing time it was parsed with), found column-wise: a resealed date's
        records mostly pass here."""
        names = ("_kafka_partition", "_kafka_offset")
        if self.kind != "partitioned":
            names = ("partition", "offset")
        partitions, offsets = (
            np.fromiter((r[name] for r in records), np.int64, len(records)) for name in names
        )
        if not self.spans:
            yield (self.one, self.processing_time), partitions, offsets
            return
        for partition in np.unique(partitions).tolist():
            mine = offsets[partitions == partition]
            i = np.full(len(mine), -1)
            if partition in self.spans:
                i = np.searchsorted(self.firsts[partition], mine, side="right") - 1
            outside = (i < 0) | (mine > self.lasts.get(partition, _NONE)[i.clip(0)])
            if outside.any():
                raise SealRefused(
                    f"{self.key}: record {partition}@{mine[outside.argmax()]} is in no backup "
                    "file its header lists"
                )
            for n in np.unique(i).tolist():
                span = self.spans[partition][n]
                at = mine[i == n]
                yield (span.source, span.processing_time), np.full(len(at), partition), at


class _TableRows:
    """A folder's parsed records as the table's Parquet files, with the date as `_event_date`."""

    def __init__(
        self,
        table: Storage,
        chosen: SealPlan,
        index: int,
        uploads: contextlib.ExitStack,
        timestamps: dict[str, int],
    ) -> None:
        self.table, self.chosen, self.index, self.uploads = table, chosen, index, uploads
        self.schema = chosen.table_schema()
        self.timestamps = timestamps
        """The fields that come as numbers (`_Decoding`): their microseconds per unit."""
        self.row_type = pa.struct(
            [
                f.with_type(pa.int64()) if f.name in timestamps else f
                for f in self.schema
                if f.name != EVENT_DATE
            ]
        )
        self.json = json_fields(chosen.schema_of("partitioned"))
        self.rows: list[dict] = []
        self.files: list[TableFile] = []
        self.writer: ParquetFileWriter | None = None

    def add_all(self, records: list[dict]) -> None:
        for name in self.json:
            for record in records:
                if record.get(name) is not None:
                    record[name] = json.dumps(record[name], default=str)
        self.rows.extend(records)
        if len(self.rows) >= 10_000:
            self._flush()

    def close(self) -> list[TableFile]:
        """Finish the table file (its upload completes when the task's uploads do)."""
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.files.append(TableFile(path=self.path, records=self.writer.stats.records))
        return self.files

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.writer is None:
            chosen = self.chosen
            self.path = table_file_name(chosen.date, chosen.claim.attempt_id, self.index, 0)
            out = self.uploads.enter_context(self.table.open_write(self.path))
            self.writer = ParquetFileWriter(out, self.schema, "_kafka_offset")
        # pyarrow converts the dicts to a struct in C++: ~2x faster than column lists in Python
        # (`from_pydict`), which was ~2.4x faster than `from_pylist`.
        rows = iter(pa.array(self.rows, type=self.row_type).flatten())
        arrays = []
        for field in self.schema:
            if field.name == EVENT_DATE:
                arrays.append(pa.repeat(pa.scalar(self.chosen.date, field.type), len(self.rows)))
            elif (micros := self.timestamps.get(field.name)) is not None:
                arrays.append(pc.multiply(next(rows), micros).cast(field.type))
            else:
                arrays.append(next(rows))
        self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
        self.rows = []
