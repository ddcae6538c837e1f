"""How a shared Spark job's Kafka ranges become Spark tasks: tiny ranges packed together.

Spark's Kafka source reads each topic-partition's range as a task of its own, and a task costs
its slot about a quarter of a second whatever it reads (scheduling, and the Python worker's
set-up before the first record: PySpark re-reads every zip on its path for each task). A burst
of 20 records on each of a thousand topics would be a thousand such tasks. So, as Gobblin packs
thousands of topic-partitions into a few work units, `pack` splits a job's ranges by size:

- ranges under `SMALL` records are read by one Kafka source whose tasks Spark coalesces to
  `Source.tasks`, enough for about `TASK_RANGES` ranges or `TASK_RECORDS` records a task
  (Spark's coalescing balances tasks by their count of ranges, and by locality on a cluster,
  not by records: a task holds about `TASK_RANGES` ranges of under `SMALL` records each);
- a range of `SMALL` records or more is read by a task of its own, as before.

A packed task reads its ranges one after another, so its records arrive as runs of one
topic-partition each, an Arrow batch possibly spanning two; `partition_runs` hands each run to
its own `write_partition` (`cairn.datafiles.writer`), so each range is written, counted and
verified as if it had had its task.

A large partition is not split over several tasks: a range's files and its count in the
attempt manifest come from one `write_partition`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

SMALL = 10_000
"""Records below which a range is packed with others."""
TASK_RANGES = 50
"""Ranges a packed task holds at most, about: ~40 ms each, so ~2 s of work per task."""
TASK_RECORDS = 100_000
"""Records a packed task holds, about, when its ranges are not tiny."""

Ranges = dict[str, dict[int, tuple[int, int]]]
"""Per topic, per Kafka partition, the `[start, end)` to read."""


@dataclass(frozen=True)
class Source:
    """One Kafka source of a job: the ranges it reads, and the tasks Spark coalesces them to
    (None: Spark's own, one task per range)."""

    ranges: Ranges
    tasks: int | None


def pack(ranges: Mapping[str, Mapping[int, tuple[int, int]]]) -> list[Source]:
    """The sources that read `ranges` (empty ranges left out): the small ones packed, the large
    ones alone; one source or two."""
    small: Ranges = {}
    large: Ranges = {}
    for topic, partitions in ranges.items():
        for partition, (start, end) in partitions.items():
            if end > start:
                kind = small if end - start < SMALL else large
                kind.setdefault(topic, {})[partition] = (start, end)
    sources = []
    if small:
        count = sum(len(partitions) for partitions in small.values())
        records = sum(end - start for p in small.values() for start, end in p.values())
        tasks = max(math.ceil(count / TASK_RANGES), math.ceil(records / TASK_RECORDS))
        sources.append(Source(small, tasks if tasks < count else None))
    if large:
        sources.append(Source(large, None))
    return sources


def partition_runs(
    batches: Iterable[pa.RecordBatch],
) -> Iterator[tuple[tuple[str, int], Iterator[pa.RecordBatch]]]:
    """A task's batches (columns `topic` and `partition` among others) as one run of batches per
    topic-partition, in order; each run must be read before the next is asked for.

    A topic-partition met again after another is refused: its records would be written and
    counted as two ranges, and Spark hands a range to one task, whole, in offset order."""
    seen: set[tuple[str, int]] = set()
    for key, run in itertools.groupby(_slices(batches), key=lambda keyed: keyed[0]):
        if key in seen:
            raise ValueError(f"{key[0]} partition {key[1]}: its records came in two runs")
        seen.add(key)
        yield key, (batch for _, batch in run)


def _slices(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[tuple[str, int], pa.RecordBatch]]:
    """Each batch cut where its topic-partition changes, each piece with its topic-partition."""
    for batch in batches:
        rows = batch.num_rows
        if not rows:
            continue
        topics, partitions = batch.column("topic"), batch.column("partition")
        changed = pc.or_(
            pc.not_equal(topics.slice(1), topics.slice(0, rows - 1)),
            pc.not_equal(partitions.slice(1), partitions.slice(0, rows - 1)),
        )
        cuts = [0, *(i + 1 for i in pc.indices_nonzero(changed).to_pylist()), rows]
        for start, end in itertools.pairwise(cuts):
            key = (topics[start].as_py(), partitions[start].as_py())
            yield key, batch.slice(start, end - start)
