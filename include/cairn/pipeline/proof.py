"""A sealed date's proof of completeness, and the checksum it carries.

Sealing a date (`cairn.pipeline.seal`) counts, per Kafka partition and backup file, the offsets
whose records are in the date, and sums a checksum share of every record (`SourceTally` and
`checksum_share` in `cairn.datafiles.sealed_file`, where the seal's tasks count them). The proof
(`Proof`) is stored in the date folder as `_SEALED` and, in short, in the table snapshot's summary
(`table_summary`); `python -m cairn verify --date` recomputes it from the files, the backup and
the tokens (`cairn.views.date_check`).
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
    """The sum of the date's records' checksum shares (`sealed_file.checksum_share`)."""
    files_before: NonNegativeInt
    files_after: NonNegativeInt
    token_seq: NonNegativeInt = 0
    table: str | None = None
    table_records: NonNegativeInt | None = None
    snapshot_id: int | None = None
    snapshot_expired_at: datetime | None = None
    """When the table's upkeep expired that snapshot (the date's rows are in the later ones)."""
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


def mark_expired(storage: Storage, cfg: TopicConfig, day: date, snapshot_id: int) -> bool:
    """Record in `day`'s proof that its table snapshot was expired, if it names that one."""
    proof, folder = read_proof(storage, cfg, day), date_folder(cfg.path_format, day)
    if proof is None or folder is None:
        return False
    if proof.snapshot_id != snapshot_id or proof.snapshot_expired_at:
        return False
    marked = proof.model_copy(update={"snapshot_expired_at": datetime.now(UTC)})
    storage.write(proof_key(cfg.topic_name, folder), marked.model_dump_json(indent=2).encode())
    return True


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
