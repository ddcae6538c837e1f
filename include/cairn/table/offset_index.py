"""Which Kafka offsets each sealed date holds, in a few ranges: the table's offset index.

A seal that adds a record to its date deletes it from any other date's partition that holds it
(a rebuild or a changed config moved it there: `cairn.table.iceberg.moved_here`). Finding those
dates by scanning the table for the record's offsets would read every date's manifest, since
Iceberg prunes manifests by partition (the date), not by offsets: a seal's requests would grow
with the table's age. So each seal also records, in the table's properties and in the same
commit, per Kafka partition a few offset ranges that cover the offsets that fed its date, and so
all its rows (`cairn.offsets.<date>`: the ranges of the seal snapshot's `cairn.offsets`). A date
whose ranges miss the new rows' offsets cannot hold them, and its manifests are not read. Ranges
are cut at the widest gaps, so one record weeks late stays a range of its own rather than
stretching its date over every date in between.

Table properties survive snapshot expiry, and the commit's check that the table did not change
meanwhile keeps an entry true to the partition it describes; rows only leave a date's partition
otherwise (a moved record), so an entry may cover more than the date holds, never less.
"""

from __future__ import annotations

import json
from datetime import date

import numpy as np

PREFIX = "cairn.offsets."
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


def entry(day: date, ranges: Ranges) -> dict[str, str]:
    """The table property that records `day`'s ranges."""
    return {f"{PREFIX}{day.isoformat()}": json.dumps(ranges, separators=(",", ":"))}


def read(properties: dict[str, str]) -> dict[date, Ranges]:
    """The index in a table's properties; an entry that does not parse is left out (its date is
    then read as if never indexed)."""
    index = {}
    for key, value in properties.items():
        if key.startswith(PREFIX):
            try:
                ranges = json.loads(value)
                index[date.fromisoformat(key[len(PREFIX) :])] = {
                    str(p): [[int(a), int(b)] for a, b in r] for p, r in ranges.items()
                }
            except (ValueError, TypeError, AttributeError):
                continue
    return index
