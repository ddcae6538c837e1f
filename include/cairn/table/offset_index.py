"""Which Kafka offsets each sealed date holds, in a few ranges: the table's offset index.

A seal that adds a record to its date deletes it from any other date's partition that holds it
(a rebuild or a changed config moved it there: `cairn.table.moved`). Finding those dates by
scanning the table for the record's offsets would read every date's manifest, since Iceberg
prunes manifests by partition (the date), not by offsets: a seal's requests would grow with the
table's age. So each seal also records, in the same commit, per Kafka partition a few offset
ranges that cover the offsets that fed its date, and so all its rows (the ranges of the seal
snapshot's `cairn.offsets`). A date whose ranges miss the new rows' offsets cannot hold them,
and its manifests are not read. Ranges are cut at the widest gaps, so one record weeks late
stays a range of its own rather than stretching its date over every date in between.

The index is one JSON file in the table's metadata folder, which the table property
`cairn.offset-index` names: each seal writes a new one (the one it read, and its date's entry)
and points the property at it in its commit, so the table's metadata, which every reader loads,
stays the same size however many dates are sealed (only the seals read the index). It covers
every date the table holds: a table sealed before the index had its file (its entries were in
properties, `cairn.offsets.<date>`, or missing for older dates) gets one built once from its
manifests' column bounds (`rebuilt`). The commit's check that the table did not change
meanwhile (pyiceberg's own retries are off for Cairn's tables: `cairn.table.iceberg`) keeps an
entry true to the partition it describes; rows only leave a date's partition otherwise (a moved
record), so an entry may cover more than the date holds, never less.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import date
from typing import cast

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import NestedField, PrimitiveType
from pyiceberg.utils.datetime import days_to_date

from cairn.datafiles.parquet_file import EVENT_DATE

log = logging.getLogger(__name__)

POINTER = "cairn.offset-index"
FILE_PREFIX = "cairn-offset-index-"
"""The index files' names begin with this, in the table's metadata folder."""
LEGACY = "cairn.offsets."
"""Where tables sealed before the index had its file kept entries (table properties)."""
RANGES = 4
"""At most this many offset ranges per Kafka partition and date."""

Ranges = dict[str, list[list[int]]]
"""Per Kafka partition (as a string: JSON keys), `[first, last]` offset ranges."""


def covering(firsts: np.ndarray, lasts: np.ndarray, at_most: int = RANGES) -> list[list[int]]:
    """At most `at_most` ranges that cover the ranges `[firsts[i], lasts[i]]`, cut at the widest
    gaps between them."""
    order = np.argsort(firsts, kind="stable")
    starts, ends = firsts[order], np.maximum.accumulate(lasts[order])
    gaps = starts[1:] - ends[:-1]
    cuts = min(at_most - 1, int((gaps > 1).sum()))
    at = np.sort(np.argpartition(gaps, -cuts)[-cuts:]) if cuts else np.array([], dtype=int)
    firsts_at, lasts_at = np.concatenate(([0], at + 1)), np.concatenate((at, [len(starts) - 1]))
    return [[int(starts[f]), int(ends[la])] for f, la in zip(firsts_at, lasts_at, strict=True)]


def overlaps(ours: Ranges, theirs: Ranges) -> bool:
    return any(
        a <= d and c <= b
        for partition, ranges in ours.items()
        for a, b in ranges
        for c, d in theirs.get(partition, [])
    )


Index = dict[date, Ranges]
"""Per date, the ranges that cover its rows."""


def load(table: Table) -> Index:
    """The table's index (module doc): its file, or one built from the table (`rebuilt`) if it
    has none, or it is missing or does not parse."""
    path = table.properties.get(POINTER)
    if path is not None:
        try:
            with table.io.new_input(path).open() as data:
                return {
                    date.fromisoformat(day): {
                        str(p): [[int(a), int(b)] for a, b in r] for p, r in ranges.items()
                    }
                    for day, ranges in json.load(data).items()
                }
        except (FileNotFoundError, ValueError, TypeError, AttributeError) as err:
            log.warning(
                "table %s: offset index %s is missing or does not parse (%s): rebuilt",
                table.name(),
                path,
                err,
            )
    return rebuilt(table)


def rebuilt(table: Table) -> Index:
    """An index of every date the table holds, from its manifests: per data file, its Kafka
    partition and offset bounds cover its rows. Read once, for a table sealed before the index
    had its file."""
    index: Index = {}
    snapshot = table.current_snapshot()
    if snapshot is None:
        return index
    kafka = [table.schema().find_field(name) for name in ("_kafka_partition", "_kafka_offset")]
    at = date_positions(table)
    spans: dict[tuple[date, str], list[tuple[int, int]]] = defaultdict(list)
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io):
            f = entry.data_file
            day = days_to_date(f.partition[at[f.spec_id]])
            for p, first, last in _kafka_bounds(table, f, kafka):
                spans[day, str(p)].append((first, last))
    for (day, partition), found in spans.items():
        firsts, lasts = (np.array(x, dtype=np.int64) for x in zip(*found, strict=True))
        index.setdefault(day, {})[partition] = covering(firsts, lasts)
    return index


def date_positions(table: Table) -> dict[int, int]:
    """Per partition spec that has it, where `_event_date` (as it is) is among its fields."""
    at = {}
    for spec_id, spec in table.specs().items():
        for i, field in enumerate(spec.fields):
            name = table.schema().find_column_name(field.source_id)
            if isinstance(field.transform, IdentityTransform) and name == EVENT_DATE:
                at[spec_id] = i
    return at


def _kafka_bounds(
    table: Table, f: DataFile, kafka: list[NestedField]
) -> Iterator[tuple[int, int, int]]:
    """(partition, first, last) offsets that cover the rows of data file `f`: its column bounds
    (every partition they span gets the whole offset span), or its rows if it has none."""
    low, high = f.lower_bounds or {}, f.upper_bounds or {}
    if all(c.field_id in low and c.field_id in high for c in kafka):
        p, o = ([_bound(c, b) for b in (low, high)] for c in kafka)
        yield from ((partition, o[0], o[1]) for partition in range(p[0], p[1] + 1))
        return
    with table.io.new_input(f.file_path).open() as data:
        rows = pq.read_table(data, columns=[c.name for c in kafka])
    by = rows.group_by(kafka[0].name).aggregate([(kafka[1].name, "min_max")])
    for partition, bounds in zip(*(by.column(i).to_pylist() for i in (1, 0)), strict=True):
        yield partition, bounds["min"], bounds["max"]


def _bound(column: NestedField, bounds: dict[int, bytes]) -> int:
    """A Kafka column's value in a data file's lower or upper `bounds`: the column is an int or
    a long, which pyiceberg types as any Iceberg type and any primitive value."""
    return cast(int, from_bytes(cast(PrimitiveType, column.field_type), bounds[column.field_id]))


def store(table: Table, index: Index) -> str:
    """Write `index` as a new file in the table's metadata folder; returns its path (the
    commit points `POINTER` at it)."""
    path = table.location_provider().new_metadata_location(f"{FILE_PREFIX}{uuid.uuid4()}.json")
    body = {day.isoformat(): ranges for day, ranges in sorted(index.items())}
    with table.io.new_output(path).create() as out:
        out.write(json.dumps(body, separators=(",", ":")).encode())
    return path
