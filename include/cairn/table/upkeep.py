"""A topic's table kept the same size however many dates it holds: the upkeep every seal does.

Users of Iceberg's Kafka Connect sink schedule this maintenance themselves; Cairn does it as
part of sealing, after the date's commit (`cairn.pipeline.seal.finish_seal`):

- **Snapshots older than the topic's `table_snapshot_age`** (the current one is always kept)
  are expired, with the files only they referenced: their manifest lists, the manifests no
  kept snapshot lists, and the data files that a later snapshot deleted while every snapshot
  before it goes (a resealed date's earlier files). The history is one line (Cairn's commits
  never branch), so these are found from the expired snapshots and the oldest kept one alone,
  not from every file of the table. The files are named in a journal
  (`metadata/cairn-expiry-<id>.json`) before the expiry commits and removed after it, so a
  crash in between leaves them to the next upkeep, never unreferenced for good. A table with
  branches, tags or snapshots off that line only keeps its snapshots: files may be shared.
- **Orphans of the sealed date**: files in its data folder that no kept snapshot refers to and
  that are older than the longest an attempt may take (`attempt_timeout`: no seal still
  running wrote them), and Cairn's own offset index files that the table no longer names. The
  table files of a seal that never commits are removed when it is found over
  (`cairn.protocol.leftovers`), through `unreferenced`, which keeps any a snapshot refers to.
- The metadata files themselves: each commit deletes those older than the ten before it
  (`write.metadata.delete-after-commit.enabled`, set on the table by `cairn.table.iceberg`),
  and manifests stay one a month (`cairn.table.manifests`).

Each expired seal snapshot is reported, so the date's proof can say its snapshot id is no
longer there to travel back to. A concurrent commit makes the expiry give up until the next seal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise, takewhile

from pydantic import BaseModel
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.storage.layout import table_folder
from cairn.storage.objects import Storage
from cairn.table import offset_index
from cairn.table.catalog import TableTarget

log = logging.getLogger(__name__)

JOURNAL = "cairn-expiry-"
SETTLED = timedelta(minutes=10)
"""A journal older than this is no upkeep's in progress."""


class Expired(BaseModel):
    """A snapshot the upkeep expired, and the date it sealed (None: not a seal's)."""

    snapshot_id: int
    date: date | None


class Upkept(BaseModel):
    expired: list[Expired]
    removed: int
    """Files removed."""


def upkeep(
    table: Table,
    files: Storage,
    day: date,
    keep: timedelta,
    orphaned: timedelta,
    now: datetime | None = None,
) -> Upkept:
    """The upkeep of `table` (module doc) after a seal of `day`; `files` is its location."""
    now = now or datetime.now(UTC)
    removed = _finish_journals(table, files, now)
    expired, n = _expire(table, files, now - keep)
    table.refresh()
    removed += n + _orphans(table, files, day, now - orphaned)
    return Upkept(expired=expired, removed=removed)


def _expire(table: Table, files: Storage, before: datetime) -> tuple[list[Expired], int]:
    """Expire the snapshots older than `before` and remove what only they referenced."""
    current = table.current_snapshot()
    if current is None:
        return [], 0
    line = list(ancestors_of(current, table.metadata))[::-1]
    cutoff = before.timestamp() * 1000
    doomed = list(takewhile(lambda s: s.timestamp_ms < cutoff, line[:-1]))
    if not doomed:
        return [], 0
    if len(line) != len(table.snapshots()) or set(table.metadata.refs) != {MAIN_BRANCH}:
        log.warning(
            "table %s has branches, tags or snapshots off its main line: its snapshots are kept",
            table.name(),
        )
        return [], 0
    journal = f"metadata/{JOURNAL}{doomed[0].snapshot_id}.json"
    ids = [s.snapshot_id for s in doomed]
    files.write(journal, json.dumps({"snapshots": ids, "files": _only_in(table, doomed)}).encode())
    try:
        table.maintenance.expire_snapshots().by_ids(ids).commit()
    except (CommitFailedException, ValidationException) as err:
        files.delete(journal)
        log.info("table %s: snapshots not expired, the next seal does it: %s", table.name(), err)
        return [], 0
    expired = [Expired(snapshot_id=s.snapshot_id, date=_sealed_date(s)) for s in doomed]
    return expired, _apply(table, files, journal)


def _only_in(table: Table, doomed: list[Snapshot]) -> list[str]:
    """The files that only `doomed` (the oldest snapshots of the line) refer to: their manifest
    lists, their manifests that the oldest kept snapshot does not list, and the data files
    deleted by a snapshot whose parent is doomed."""
    io = table.io
    line = list(ancestors_of(table.current_snapshot(), table.metadata))[::-1]
    kept = line[len(doomed)]
    listed = {m.manifest_path for m in kept.manifests(io)}
    found = set()
    for _, s in pairwise([*doomed, kept]):
        for m in s.manifests(io):
            if m.added_snapshot_id == s.snapshot_id and m.deleted_files_count != 0:
                for entry in m.fetch_manifest_entry(io, discard_deleted=False):
                    if entry.status == ManifestEntryStatus.DELETED:
                        found.add(entry.data_file.file_path)
    for s in doomed:
        found.add(s.manifest_list)
        found |= {m.manifest_path for m in s.manifests(io)} - listed
    return sorted(found)


def _apply(table: Table, files: Storage, journal: str) -> int:
    """Remove the files a journal names, then the journal."""
    named = json.loads(files.read(journal))["files"]
    for path in named:
        table.io.delete(path)
    files.delete(journal)
    return len(named)


def _finish_journals(table: Table, files: Storage, now: datetime) -> int:
    """Journals an earlier upkeep left (it crashed): applied if their expiry landed, else
    dropped."""
    removed = 0
    present = {s.snapshot_id for s in table.snapshots()}
    for key, when in files.modified("metadata/").items():
        if key.startswith(f"metadata/{JOURNAL}") and now - when > SETTLED:
            if present & set(json.loads(files.read(key))["snapshots"]):
                files.delete(key)
            else:
                removed += _apply(table, files, key)
    return removed


def unreferenced(
    catalog: Catalog, where: TableTarget, files: Storage
) -> Callable[[str, str], None]:
    """What removes the table files a seal attempt wrote in a date's folder that no snapshot of
    the table refers to (`cairn.protocol.leftovers.Remover`; `files`: the table's location)."""

    def remove(folder: str, attempt_id: str) -> None:
        try:
            table: Table | None = catalog.load_table(where.identifier)
        except NoSuchTableError:
            table = None  # never made: nothing refers to any file
        day = date.fromisoformat(folder.rsplit("=", 1)[-1])
        for key in _unreferenced(table, files, day, named=f"{attempt_id}-"):
            files.delete(key)

    return remove


def _orphans(table: Table, files: Storage, day: date, before: datetime) -> int:
    """Remove the files of `day`'s data folder that no snapshot refers to, and offset index
    files the table does not name, written before `before`."""
    old = _unreferenced(table, files, day, before=before)
    location = table.location().rstrip("/")
    pointer = table.properties.get(offset_index.POINTER)
    stale = [
        key
        for key, when in files.modified("metadata/").items()
        if key.startswith(f"metadata/{offset_index.FILE_PREFIX}")
        and when < before
        and f"{location}/{key}" != pointer
    ]
    for key in [*old, *stale]:
        files.delete(key)
    return len(old) + len(stale)


def _unreferenced(
    table: Table | None,
    files: Storage,
    day: date,
    named: str = "",
    before: datetime | None = None,
) -> list[str]:
    """The keys of `day`'s data folder whose names begin with `named` and that were written
    before `before` (if given), that no snapshot of `table` refers to (the current one is
    asked first: most files are its own)."""
    folder = table_folder(day)
    found = {
        key
        for key, when in files.modified(f"{folder}/").items()
        if key[len(folder) + 1 :].startswith(named) and (before is None or when < before)
    }
    if table is None or not found:
        return sorted(found)
    location = table.location().rstrip("/")
    current = table.current_snapshot()
    for snapshot in [current, *(s for s in table.snapshots() if s != current)]:
        if snapshot is None or not found:
            break
        scan = table.scan(
            snapshot_id=snapshot.snapshot_id, row_filter=EqualTo(term=EVENT_DATE, value=day)
        )
        found -= {task.file.file_path.removeprefix(f"{location}/") for task in scan.plan_files()}
    return sorted(found)


def _sealed_date(snapshot: Snapshot) -> date | None:
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    return date.fromisoformat(summary["cairn.date"]) if "cairn.date" in summary else None
