"""Parquet data files: what a topic's Iceberg table holds (`cairn.table.iceberg`).

The seal job hands each date's parsed records over as Arrow batches (Spark decodes the Avro in
the JVM); this streams them into Parquet with memory bounded by one row group, however many
records the file gets, and counts what it wrote the way the Avro writer does (`FileStats`), so a
table file is accounted for like every other file Cairn writes.
"""

from __future__ import annotations

from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cairn.datafiles.avro_file import FileStats, widen

ROW_GROUP_ROWS = 128 * 1024
"""Rows buffered before a row group is written: a few tens of MB of typical events."""
EVENT_DATE = "_event_date"
"""The table's partition column: the date a record is filed under (in the topic's timezone)."""

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_LOGICAL: dict[str, pa.DataType] = {
    "timestamp-millis": pa.timestamp("us", "UTC"),
    "timestamp-micros": pa.timestamp("us", "UTC"),
    "local-timestamp-millis": pa.timestamp("us"),
    "local-timestamp-micros": pa.timestamp("us"),
    "date": pa.date32(),
    "time-millis": pa.time64("us"),
    "time-micros": pa.time64("us"),
    "uuid": pa.string(),
}


def avro_to_arrow(schema: dict[str, Any]) -> pa.Schema:
    """The Arrow schema (what Parquet and Iceberg take) of records read with Avro `schema` by
    fastavro: unions with null are nullable, logical types keep their meaning (timestamps in
    microseconds, as Iceberg stores them), enums are strings, and a top-level field whose union
    has several types (which no table type holds) is its value's JSON text (`json_fields`)."""
    return pa.schema([_field(f["name"], f["type"], top=True) for f in schema["fields"]])


def json_fields(schema: dict[str, Any]) -> list[str]:
    """The top-level fields `avro_to_arrow` makes JSON text: unions of several types."""
    return [f["name"] for f in schema["fields"] if len(_branches(f["type"])) > 1]


def _branches(avro: Any) -> list[Any]:
    return [t for t in avro if t != "null"] if isinstance(avro, list) else [avro]


def _field(name: str, avro: Any, top: bool = False) -> pa.Field:
    branches = _branches(avro)
    nullable = isinstance(avro, list) and "null" in avro
    if len(branches) > 1:
        if not top:
            raise ValueError(f"field {name!r}: a nested union of {branches} has no table type")
        return pa.field(name, pa.string(), True)
    return pa.field(name, _type(branches[0]), nullable)


def _type(avro: Any) -> pa.DataType:
    if isinstance(avro, str):
        if avro not in _PRIMITIVES:
            raise ValueError(f"Avro type {avro!r} (a named type) cannot be mapped here")
        return _PRIMITIVES[avro]
    logical = avro.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(avro["precision"], avro.get("scale", 0))
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    kind = avro["type"]
    if kind == "record":
        return pa.struct([_field(f["name"], f["type"]) for f in avro["fields"]])
    if kind == "array":
        return pa.list_(_type(avro["items"]))
    if kind == "map":
        return pa.map_(pa.string(), _type(avro["values"]))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary(avro["size"])
    return _type(kind)


class ParquetFileWriter:
    """Stream Arrow record batches into one Parquet file (zstd), memory bounded by a row group.

    `offsets` names the column whose min and max feed `stats` (Kafka offsets in table files)."""

    def __init__(self, out: IO[bytes], schema: pa.Schema, offsets: str | None = None) -> None:
        self._writer = pq.ParquetWriter(out, schema, compression="zstd")
        self._offsets, self._rows = offsets, 0
        self._buffered: list[Any] = []
        self.stats = FileStats()

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self._buffered.append(batch)
        self._rows += batch.num_rows
        self.stats.records += batch.num_rows
        if self._offsets is not None:
            low, high = (v.as_py() for v in pc.min_max(batch.column(self._offsets)).values())
            self.stats.min_offset, self.stats.max_offset = widen(
                self.stats.min_offset, self.stats.max_offset, low, high
            )
        if self._rows >= ROW_GROUP_ROWS:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if self._buffered:
            self._writer.write_table(pa.Table.from_batches(self._buffered))
            self._buffered, self._rows = [], 0
