"""Sealed files: the merged files a sealed date's folders hold (`cairn.pipeline.seal`).

A sealed file is an Avro container file like any other Cairn data file, named
`<gen>_sealed_<n>.avro` (`cairn.storage.layout`), whose records come from many runs' files. Its
header lists, as JSON under `cairn.sources`, every backup file its records came from with
their partition and offsets (`SourceSpan`), so it stays re-derivable from the backup like the
files it replaced (`cairn.pipeline.rebuild`), and a rewind knows which rewound offsets it holds
(`cairn.protocol.rewind`).
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form
from pydantic import BaseModel, NonNegativeInt, PositiveInt

from cairn.datafiles.avro_file import AvroFileWriter, BlockFileWriter, raw_blocks, read_header
from cairn.storage.objects import Storage

SOURCES = "cairn.sources"
"""A sealed file's header entry: the backup files its records came from (JSON)."""


class SourceSpan(BaseModel):
    """Records of one backup file (in one Kafka partition) that a file holds: what a sealed
    file's header lists (`SOURCES`) and a proof sums up per date."""

    source: str | None
    """The backup file; None for records of files written before Cairn named it."""
    processing_time: str | None
    partition: NonNegativeInt
    first: NonNegativeInt
    last: NonNegativeInt
    records: PositiveInt


def sources_of(metadata: dict[str, str]) -> list[SourceSpan] | None:
    """The backup files a sealed file's records came from (its header); None if not sealed."""
    raw = metadata.get(SOURCES)
    return None if raw is None else [SourceSpan.model_validate(s) for s in json.loads(raw)]


def canonical(schema_json: str) -> str:
    """The schema's Parsing Canonical Form: equal for schemas whose records encode alike."""
    return to_parsing_canonical_form(fastavro.parse_schema(json.loads(schema_json)))


class SealedFileWriter:
    """One sealed file being written. Its blocks spool to a local file (`BlockFileWriter`),
    because its header, which lists the backup files of its records, can only be written once
    all of them are known."""

    def __init__(self, key: str, schema: dict[str, Any], codec: str) -> None:
        self.key, self.schema, self.codec = key, json.dumps(schema, sort_keys=True), codec
        self.blocks = BlockFileWriter(key)

    def close(self, storage: Storage, sources: list[SourceSpan]) -> int:
        """Write the file to `storage`; returns its size."""
        metadata = {SOURCES: json.dumps([s.model_dump() for s in sources])}
        with storage.open_write(self.key) as out:
            return self.blocks.write_to(out, self.schema, self.codec, metadata)


class ReEncoded:
    """An input file's records re-encoded to the folder's schema and codec, spooled to local
    disk (bounded memory), then copied block by block like any other input."""

    def __init__(self, schema: dict[str, Any], codec: str, key: str) -> None:
        self.spool = tempfile.SpooledTemporaryFile(max_size=8 * 2**20)  # noqa: SIM115
        self.avro = AvroFileWriter(self.spool, schema, codec, name=key)

    def add(self, record: dict) -> None:
        self.avro.append(record, 0)

    def copy_to(self, writer: BlockFileWriter) -> None:
        self.avro.close()
        self.spool.seek(0)
        header = read_header(self.spool)
        for count, block in raw_blocks(self.spool, header):
            writer.append_block(count, block)
        self.spool.close()
