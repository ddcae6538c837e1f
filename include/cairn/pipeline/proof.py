"""A sealed date's proof of completeness, and the checksum it carries.

Sealing a date (`cairn.pipeline.seal`) counts, per Kafka partition and backup file, the offsets
whose records are in the date (`SourceTally`), and sums a checksum share of every record. The
proof (`Proof`) is stored in the date folder as `_SEALED` and, in short, in the table
snapshot's summary (`table_summary`); `python -m cairn verify --date` recomputes it from the
files, the backup and the tokens (`cairn.views.date_check`).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, NonNegativeInt, ValidationError

from cairn.datafiles.sealed_file import SourceSpan
from cairn.storage.layout import date_folder, proof_key
from cairn.storage.objects import Storage
from cairn.table.offset_index import Ranges, covering

if TYPE_CHECKING:
    from cairn.config import TopicConfig

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


class Proof(BaseModel):
    """A sealed date's proof of completeness (`_SEALED`, and the table snapshot's summary): which
    Kafka offsets fed the date and how many records each output holds, so anyone can check it
    again against the files, the backup and the tokens (`cairn.views.date_check`)."""

    topic: str
    date: date
    partitions: dict[NonNegativeInt, list[SourceSpan]]
    """Per Kafka partition, the backup files (and their offsets) whose records are in the date."""
    partitioned: NonNegativeInt
    quarantined: NonNegativeInt
    checksum: str
    """The sum of the date's records' checksum shares (`checksum_share`)."""
    files_before: NonNegativeInt
    files_after: NonNegativeInt
    token_seq: NonNegativeInt = 0
    table: str | None = None
    table_records: NonNegativeInt | None = None
    snapshot_id: int | None = None
    sealed_at: datetime | None = None


def write_proof(storage: Storage, cfg: TopicConfig, proof: Proof) -> str:
    """Store the proof in the date folder (`_SEALED`): the last step of a seal."""
    folder = date_folder(cfg.path_format, proof.date)
    if folder is None:
        raise ValueError(f"{cfg.label}: path_format {cfg.path_format!r} has no date folder")
    key = proof_key(cfg.topic_name, folder)
    stamped = proof.model_copy(update={"sealed_at": datetime.now(UTC)})
    storage.write(key, stamped.model_dump_json(indent=2).encode())
    return key


def read_proof(storage: Storage, cfg: TopicConfig, day: date) -> Proof | None:
    """A date's proof, if it was sealed (None if not, or unreadable)."""
    folder = date_folder(cfg.path_format, day)
    if folder is None:
        return None
    try:
        return Proof.model_validate_json(storage.read(proof_key(cfg.topic_name, folder)))
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def table_summary(proof: Proof) -> dict[str, str]:
    """The table snapshot's summary: the proof, as Iceberg's Kafka Connect sink records its
    offsets (string values, `cairn.` names), the offsets as `offset_ranges`."""
    return {
        "cairn.topic": proof.topic,
        "cairn.date": proof.date.isoformat(),
        "cairn.seq": str(proof.token_seq),
        "cairn.records": str(proof.partitioned),
        "cairn.quarantined": str(proof.quarantined),
        "cairn.checksum": proof.checksum,
        "cairn.offsets": json.dumps(offset_ranges(proof), separators=(",", ":")),
    }


def offset_ranges(proof: Proof) -> Ranges:
    """Per Kafka partition, a few offset ranges that cover the offsets that fed the date: the
    table's metadata keeps them (in every snapshot's summary, and in its offset index), so not
    one per backup file as the proof lists them."""
    return {
        str(p): covering(
            np.array([s.first for s in spans], dtype=np.int64),
            np.array([s.last for s in spans], dtype=np.int64),
        )
        for p, spans in sorted(proof.partitions.items())
        if spans
    }


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


def merged(before: SourceSpan | None, span: SourceSpan) -> SourceSpan:
    if before is None:
        return span
    return before.model_copy(
        update={
            "first": min(before.first, span.first),
            "last": max(before.last, span.last),
            "records": before.records + span.records,
        }
    )
