"""What an attempt's manifest records of each data file it wrote (`cairn.protocol.manifest`).

The writer reports one entry per file it finishes, from the counts it kept while writing; Verify
then checks the entries against storage before the token commits.
"""

from __future__ import annotations

from pydantic import BaseModel, NonNegativeInt, PositiveInt

from cairn.storage.layout import DataKind


class FileEntry(BaseModel):
    """One data file; offsets are of its first and last record, event times in epoch millis."""

    key: str
    kind: DataKind
    partition: NonNegativeInt
    records: PositiveInt
    first_offset: NonNegativeInt
    last_offset: NonNegativeInt
    min_event_time: int | None = None
    max_event_time: int | None = None
    bytes: NonNegativeInt
