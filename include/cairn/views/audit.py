"""Re-counting a date of the archive against its manifests, from the files themselves.

Verify (`cairn.protocol.manifest.verify`) checks an attempt before its token commits, by sizes and
the attempt's own counts. Afterwards a file can still be damaged, replaced or removed by hand, so an
audit reads every partitioned and quarantine file of the date and compares what it holds with
what the committing link (a token's manifest, or a rebuild) says it holds: the record count, the
size, the first and last offset, one partition in offset order. Files of one partition in one
folder must not overlap (a duplicate), and every file the consulted manifests place in the date
must be there. The audit reads each file once, streaming, so memory stays that of one record.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import date
from itertools import pairwise

from pydantic import BaseModel, Field

from cairn.config import TopicConfig
from cairn.datafiles.file_entry import FileEntry
from cairn.storage.layout import DataFile, file_date, parse_data_key
from cairn.storage.objects import Storage
from cairn.views.finder import ArchiveIndex, coordinates, date_files, read_records


class FileAudit(BaseModel):
    """One file: what its manifest says, what it holds, and what differs."""

    key: str
    kind: str
    partition: int
    by: str | None = None
    """The link that committed it (`token 3`, `rebuild 1`); None if no manifest names it."""
    expected_records: int | None = None
    records: int = 0
    expected_bytes: int | None = None
    bytes: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    problems: list[str] = Field(default_factory=list)


class DateAudit(BaseModel):
    topic: str
    day: date
    files: list[FileAudit]
    problems: list[str] = Field(default_factory=list)
    """Problems across files: overlaps, files a manifest places here that are missing."""

    @property
    def ok(self) -> bool:
        return not self.problems and not any(f.problems for f in self.files)

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)


def audit_date(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    on_file: Callable[[DataFile], None] | None = None,
) -> DateAudit:
    """Re-count `day`'s files of `cfg.topic` (see the module doc); `on_file` is called before
    each file is read (for progress)."""
    index = ArchiveIndex(storage, cfg.topic_name)
    found = date_files(storage, cfg, day)
    files = []
    for f in found:
        if on_file is not None:
            on_file(f)
        files.append(_audit_file(storage, index, f))
    problems = _overlaps(found, files)
    problems += _missing(index, cfg, day, {f.key for f in found})
    return DateAudit(topic=cfg.topic, day=day, files=files, problems=problems)


def _audit_file(storage: Storage, index: ArchiveIndex, f: DataFile) -> FileAudit:
    if f.sealed:  # many partitions and runs: its date's proof accounts for it (views.date_check)
        return _audit_sealed(storage, index, f)
    audit = FileAudit(key=f.key, kind=f.kind, partition=f.partition, bytes=storage.size(f.key))
    previous = -1
    try:
        for row in read_records(storage, f.key):
            p, offset = coordinates(f.kind, row)
            if p != f.partition or offset <= previous:
                audit.problems.append(
                    f"record {p}/{offset} after offset {previous}: not one partition "
                    f"({f.partition}) in offset order"
                )
                break
            audit.records += 1
            previous = offset
            if audit.first_offset is None:
                audit.first_offset = offset
        audit.last_offset = None if previous < 0 else previous
    except (ValueError, EOFError, OSError) as err:  # not Avro, truncated, unreadable
        audit.problems.append(f"unreadable after {audit.records} records: {err}")
    if audit.first_offset is not None and audit.first_offset != f.first_offset:
        audit.problems.append(
            f"first record at offset {audit.first_offset}, name says {f.first_offset}"
        )
    located = index.entry(f.key)
    if located is None:
        audit.problems.append("no manifest names this file (not committed by any token or rebuild)")
        return audit
    e = located.entry
    assert isinstance(e, FileEntry)  # a run's or a rebuild's file
    audit.by, audit.expected_records, audit.expected_bytes = located.by, e.records, e.bytes
    if audit.records != e.records:
        audit.problems.append(f"{audit.records} records, {located.by} says {e.records}")
    if audit.bytes != e.bytes:
        audit.problems.append(f"{audit.bytes} bytes, {located.by} says {e.bytes}")
    if audit.last_offset is not None and audit.last_offset != e.last_offset:
        audit.problems.append(f"last offset {audit.last_offset}, {located.by} says {e.last_offset}")
    return audit


def _audit_sealed(storage: Storage, index: ArchiveIndex, f: DataFile) -> FileAudit:
    """A sealed file's records and size against the seal that wrote it."""
    audit = FileAudit(key=f.key, kind=f.kind, partition=-1, bytes=storage.size(f.key))
    try:
        audit.records = sum(1 for _ in read_records(storage, f.key))
    except (ValueError, EOFError, OSError) as err:
        audit.problems.append(f"unreadable after {audit.records} records: {err}")
    located = index.entry(f.key)
    if located is None:
        audit.problems.append("no seal names this file (not committed by any token)")
        return audit
    e = located.entry
    audit.by, audit.expected_records, audit.expected_bytes = located.by, e.records, e.bytes
    if audit.records != e.records:
        audit.problems.append(f"{audit.records} records, {located.by} says {e.records}")
    if audit.bytes != e.bytes:
        audit.problems.append(f"{audit.bytes} bytes, {located.by} says {e.bytes}")
    return audit


def _overlaps(found: list[DataFile], audits: list[FileAudit]) -> list[str]:
    """Files of one partition in one folder whose offsets overlap hold a record twice."""
    spans: defaultdict[tuple[str, str, int | None], list[tuple[int, int, str]]]
    spans = defaultdict(list)
    for f, a in zip(found, audits, strict=True):
        if a.first_offset is not None and a.last_offset is not None:
            spans[f.kind, f.folder, f.partition].append((a.first_offset, a.last_offset, a.key))
    problems = []
    for same in spans.values():
        ordered = sorted(same, key=lambda span: span[0])
        for (first, last, key), (next_first, next_last, next_key) in pairwise(ordered):
            if next_first <= last:
                problems.append(
                    f"{key} ({first}..{last}) and {next_key} ({next_first}..{next_last}) overlap"
                )
    return problems


def _missing(index: ArchiveIndex, cfg: TopicConfig, day: date, present: set[str]) -> list[str]:
    """Files that the manifests consulted so far, or a rebuild of `day`, place in `day` but
    that are not there. (A run none of whose files for `day` survive is not consulted: only a
    full scan of the history could name it.)"""
    named: set[str] = set()
    for token in index.read_so_far():
        found = index.manifest(token)
        named |= {e.key for e in found.files} if found else set()
    for r in index.rebuilds():
        if day in r.dates:
            named |= {e.key for e in r.files}
    problems = []
    for key in sorted(named - present):
        f = parse_data_key(key)
        if f is None or f.kind == "backup" or _day_of(f, cfg) != day:
            continue
        current = index.entry(key)
        if current is not None:  # still current: not removed by a later rebuild
            problems.append(f"{key} is missing ({current.by} committed it)")
    return problems


def _day_of(f: DataFile, cfg: TopicConfig) -> date | None:
    return file_date(f, cfg.path_format)
