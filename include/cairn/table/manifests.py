"""A seal's overwrite snapshot, keeping one data manifest per month of dates.

pyiceberg's overwrite adds a manifest for the date's new files and rewrites the one that held its
old files, so a table sealed a date at a time would hold a manifest per date, and every
snapshot's manifest list, which every reader and every seal reads, would grow with the table's
age. Here, as the snapshot is made, the data manifests that share a month of `_event_date` (or
hold several months: the new files, when a seal moved records of other dates) are rewritten as
one manifest per month, the entries keeping their meaning as pyiceberg's own merge keeps it (this
snapshot's additions and deletions as they are, earlier files as existing ones). So the manifest
list holds one entry per month, and a seal rewrites only its month's manifest.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date
from typing import cast

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.types import DateType
from pyiceberg.utils.datetime import days_to_date

from cairn.table.offset_index import date_positions

Month = tuple[int, int, int]
"""A partition spec's id, a year and a month."""


class MonthlyOverwrite(_OverwriteFiles):
    """An overwrite snapshot of `table` in `txn` with summary `properties`, its data manifests
    one per month (module doc)."""

    def __init__(self, txn: Transaction, table: Table, properties: dict[str, str]) -> None:
        first = txn.table_metadata.snapshot_by_name(MAIN_BRANCH) is None
        super().__init__(
            operation=Operation.APPEND if first else Operation.OVERWRITE,
            transaction=txn,
            io=table.io,
            snapshot_properties=properties,
        )
        self._dates = date_positions(table)

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        whole: dict[Month, list[ManifestFile]] = defaultdict(list)
        mixed, others = [], []
        for m in manifests:
            if m.content != ManifestContent.DATA:
                others.append(m)
            elif (month := self._month(m)) is not None:
                whole[month].append(m)
            else:
                mixed.append(m)
        entries: dict[Month, list[ManifestEntry]] = defaultdict(list)
        for m in mixed:
            for entry in m.fetch_manifest_entry(self._io, discard_deleted=False):
                entries[self._entry_month(m.partition_spec_id, entry)].append(entry)
        kept, merged = [], list(mixed)
        for month, group in whole.items():
            if len(group) == 1 and month not in entries:
                kept.append(group[0])
                continue
            merged += group
            for m in group:
                entries[month] += m.fetch_manifest_entry(self._io, discard_deleted=False)
        written = [self._written(month[0], found) for month, found in entries.items()]
        for m in merged:  # what this snapshot wrote and merged away: nothing will refer to it
            if m.manifest_path in self._written_manifests:
                self._written_manifests.remove(m.manifest_path)
                self._io.delete(m.manifest_path)
        return kept + written + others

    def _written(self, spec_id: int, entries: list[ManifestEntry]) -> ManifestFile:
        """One manifest of `entries`: this snapshot's additions and deletions as they are, other
        live files as existing, other deletions dropped (they belong to earlier snapshots)."""
        with self.new_manifest_writer(self.spec(spec_id)) as writer:
            for entry in entries:
                ours = entry.snapshot_id == self.snapshot_id
                if entry.status == ManifestEntryStatus.DELETED:
                    if ours:
                        writer.delete(entry)
                elif entry.status == ManifestEntryStatus.ADDED and ours:
                    writer.add(entry)
                else:
                    writer.existing(entry)
        return writer.to_manifest_file()

    def _month(self, manifest: ManifestFile) -> Month | None:
        """The month all of a manifest's files are in (None: several, or it does not say)."""
        at = self._dates.get(manifest.partition_spec_id)
        partitions = manifest.partitions or []
        if at is None or len(partitions) <= at:
            return None
        bounds = partitions[at]
        if bounds.lower_bound is None or bounds.upper_bound is None:
            return None
        low, high = (
            days_to_date(cast(int, from_bytes(DateType(), b)))  # pyiceberg: any primitive value
            for b in (bounds.lower_bound, bounds.upper_bound)
        )
        same = (low.year, low.month) == (high.year, high.month)
        return (manifest.partition_spec_id, low.year, low.month) if same else None

    def _entry_month(self, spec_id: int, entry: ManifestEntry) -> Month:
        at = self._dates.get(spec_id)
        day = days_to_date(entry.data_file.partition[at]) if at is not None else date.min
        return spec_id, day.year, day.month
