"""Sealed files: the merged files a sealed date's folders hold (`cairn.pipeline.seal`).

A sealed file is an Avro container file like any other Cairn data file, named
`<gen>_sealed_<n>.avro` (`cairn.storage.layout`), whose records come from many runs' files. Its
header lists, as JSON under `cairn.sources`, every backup file its records came from with
their partition and offsets (`SourceSpan`), so it stays re-derivable from the backup like the
files it replaced (`cairn.pipeline.rebuild`), and a rewind knows which rewound offsets it holds
(`cairn.protocol.rewind`).

While a seal writes them, `SourceTally` counts those spans and the date's checksum
(`checksum_share`) for its proof (`cairn.pipeline.proof`).
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import fastavro
import numpy as np
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


CHECKSUM_MODULUS = 4_294_967_291
"""A record's share of a date's checksum is `((partition * 1000003 + offset) * 2654435761) mod`
this prime: a number below 2**32 that Spark SQL and Python both compute exactly, so the sum
over a date's records (and their count) changes when any record goes missing or doubles."""


def checksum_share(partition: int, offset: int) -> int:
    """One record's share of its date's checksum (see `CHECKSUM_MODULUS`)."""
    return ((partition * 1000003 + offset) * 2654435761) % CHECKSUM_MODULUS


def checksum_sum(partitions: np.ndarray, offsets: np.ndarray) -> int:
    """The sum of `checksum_share` over many records at once, exact in 64 bits: each factor is
    reduced below the modulus (< 2**32) before it is multiplied."""
    m = np.uint64(CHECKSUM_MODULUS)
    p, o = partitions.astype(np.uint64) % m, offsets.astype(np.uint64) % m
    x = (p * np.uint64(1000003) % m + o) % m
    return int((x * np.uint64(2654435761) % m).sum(dtype=np.uint64))


class SourceTally:
    """Per backup file and Kafka partition: the offsets and records seen, and the checksum."""

    def __init__(self) -> None:
        self.found: dict[tuple[str | None, int], list] = {}
        self.records = self.checksum = 0

    def add(self, p: np.ndarray, o: np.ndarray, source: tuple[str | None, str | None]) -> None:
        """Count records of one backup file `source` (its key, and the processing time it was
        parsed with) by their Kafka partitions `p` and offsets `o`: column by column, since a
        sealed date's records pass here and a Python call each would cost more than the rest of
        the tally."""
        for partition in np.unique(p):
            mine = o[p == partition]
            first, last = int(mine.min()), int(mine.max())
            self._include((source[0], int(partition)), first, last, len(mine), source[1])
        self.records += len(p)
        self.checksum += checksum_sum(p, o)

    def merge(self, other: SourceTally) -> None:
        for key, (first, last, n, when) in other.found.items():
            self._include(key, first, last, n, when)
        self.records += other.records
        self.checksum += other.checksum

    def _include(
        self, key: tuple[str | None, int], first: int, last: int, n: int, when: str | None
    ) -> None:
        mine = self.found.get(key)
        self.found[key] = (
            [first, last, n, when]
            if mine is None
            else [min(mine[0], first), max(mine[1], last), mine[2] + n, when]
        )

    def spans(self) -> list[SourceSpan]:
        return [
            SourceSpan(source=s, processing_time=w, partition=p, first=f, last=la, records=n)
            for (s, p), (f, la, n, w) in sorted(
                self.found.items(), key=lambda item: (item[0][1], item[1][0])
            )
        ]
