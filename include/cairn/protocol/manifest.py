"""The attempt manifest: what one Spark attempt read and wrote, checked before the token commits.

The Spark job writes it; `verify` proves from storage (not from the job's word) that the files
account for every record read exactly once. Kafka offsets have holes (transaction markers,
compaction), so coverage is proved with record counts plus non-overlapping offset spans.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from itertools import pairwise

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt

from cairn.datafiles.file_entry import FileEntry
from cairn.errors import PermanentError
from cairn.protocol import format_version
from cairn.protocol.format_version import Versioned
from cairn.protocol.tokens import Counts, Gap
from cairn.storage.layout import parse_data_key
from cairn.storage.objects import Storage


class VerificationFailed(PermanentError):
    """The attempt's output does not account for exactly the records it read."""


class CorruptManifest(PermanentError):
    """A manifest object is unreadable."""


class SparkJob(BaseModel):
    """The Spark job that staged an attempt: the runs of one shared job have the same `tag`."""

    tag: str
    runs: PositiveInt
    """How many runs the job staged (of as many topics, but for a run fenced out by another)."""
    tasks: PositiveInt | None = None
    """How many Spark tasks read the job's ranges (`cairn.packing`; absent in manifests written
    before Cairn packed them)."""


class Manifest(Versioned):
    """`ranges` are the planned `[start, end)`; `records_read` is what Spark got from Kafka."""

    topic: str
    attempt_id: str
    run_id: str
    generation: PositiveInt
    ranges: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]]
    records_read: dict[NonNegativeInt, NonNegativeInt]
    files: list[FileEntry]
    processing_time: datetime
    """The time the attempt parsed with: quarantine and processing-time layouts use its date."""
    created_at: datetime
    gaps: list[Gap] = Field(default_factory=list)
    """Offsets lost to retention that this attempt skipped (accept_gaps)."""
    parses: bool = True
    """False for raw topics: backup only, nothing partitioned or quarantined."""
    spark_job: SparkJob | None = None
    timestamps: dict[NonNegativeInt, tuple[int, int]] = Field(default_factory=dict)
    """Kafka timestamps (epoch millis) of the first and last record read, per partition that had
    any: how long the run's records waited, without asking Kafka again (absent from manifests
    written before Cairn recorded them)."""


Outcome = Manifest | Exception
"""What a Spark job did for one run: its attempt's manifest, or why that run got none."""


class VerifyReport(BaseModel):
    counts: Counts
    partitions: dict[int, Counts]
    spark_job: SparkJob | None = None
    timestamps: dict[int, tuple[int, int]] = Field(default_factory=dict)
    """The manifest's: first and last record's Kafka timestamp per partition read."""


def load(storage: Storage, key: str) -> Manifest:
    return format_version.load(storage, key, Manifest, CorruptManifest, "manifest")


def verify(
    manifest: Manifest, plan_ranges: dict[int, tuple[int, int]], storage: Storage
) -> VerifyReport:
    """Check the attempt against the plan and storage; raise VerificationFailed on any mismatch.

    `storage` is where the attempt wrote (its staging area): only the files the manifest names
    are checked, one request each (`Storage.sizes`), so verify costs the same however large the
    archive is. Files of other attempts cannot matter, because only this attempt's files get
    published.
    `plan_ranges` may come straight from JSON (string partition keys, lists).
    """
    ranges = {int(p): (int(start), int(end)) for p, (start, end) in plan_ranges.items()}
    problems = _check(manifest, ranges, storage)
    if problems:
        head = f"topic {manifest.topic!r} attempt {manifest.attempt_id}: "
        raise VerificationFailed(head + "; ".join(problems))
    return _report(manifest)


def _check(
    manifest: Manifest, plan_ranges: dict[int, tuple[int, int]], storage: Storage
) -> list[str]:
    planned = _non_empty(plan_ranges)
    if _non_empty(manifest.ranges) != planned:
        return [f"manifest ranges {manifest.ranges} differ from the plan {plan_ranges}"]
    problems: list[str] = []
    seen: set[str] = set()
    by_partition: dict[int, list[FileEntry]] = defaultdict(list)
    sizes = storage.sizes({e.key for e in manifest.files})
    for entry in manifest.files:
        problems += _check_entry(manifest, entry, sizes[entry.key], seen)
        by_partition[entry.partition].append(entry)
    read = {p: n for p, n in manifest.records_read.items() if n}
    for p in sorted(set(planned) | set(read) | set(by_partition)):
        entries = by_partition[p]
        problems += _check_partition(p, planned.get(p), read.get(p, 0), entries, manifest.parses)
    return problems


def _non_empty(ranges: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    return {p: (start, end) for p, (start, end) in ranges.items() if end > start}


def _check_entry(manifest: Manifest, e: FileEntry, size: int | None, seen: set[str]) -> list[str]:
    """`size`: what storage holds at the entry's key (None: nothing)."""
    if e.key in seen:
        return [f"{e.key} is listed twice"]
    seen.add(e.key)
    named = parse_data_key(e.key)
    stated = (e.kind, manifest.topic, manifest.generation, e.partition, e.first_offset)
    if (
        named is None
        or (named.kind, named.topic, named.gen, named.partition, named.first_offset) != stated
    ):
        return [
            f"{e.key} does not name a {e.kind} file of generation {manifest.generation} "
            f"partition {e.partition} starting at offset {e.first_offset}"
        ]
    if e.last_offset - e.first_offset + 1 < e.records:
        return [
            f"{e.key}: {e.records} records do not fit offsets {e.first_offset}..{e.last_offset}"
        ]
    if size is None:
        return [f"{e.key} is missing"]
    if size != e.bytes:
        return [f"{e.key} has {size} bytes, the manifest says {e.bytes}"]
    return []


def _check_partition(
    p: int, planned: tuple[int, int] | None, read: int, entries: list[FileEntry], parses: bool
) -> list[str]:
    if planned is None:
        return [f"partition {p} has files or records read but nothing was planned"]
    start, end = planned
    problems = [
        f"{e.key}: offsets {e.first_offset}..{e.last_offset} outside planned [{start}, {end})"
        for e in entries
        if e.first_offset < start or e.last_offset >= end
    ]
    if read > end - start:
        problems.append(f"partition {p}: {read} records read from a range of {end - start}")
    backup = sorted((e for e in entries if e.kind == "backup"), key=lambda e: e.first_offset)
    for before, after in pairwise(backup):
        if after.first_offset <= before.last_offset:
            problems.append(f"backup files {before.key} and {after.key} overlap")
    backed_up = sum(e.records for e in backup)
    parsed = sum(e.records for e in entries if e.kind != "backup")
    if backed_up != read:
        problems.append(f"partition {p}: {read} records read, {backed_up} in backup")
    if parsed != (backed_up if parses else 0):
        problems.append(
            f"partition {p}: {backed_up} records in backup, {parsed} partitioned + quarantined"
        )
    return problems


def _report(manifest: Manifest) -> VerifyReport:
    partitions: dict[int, Counts] = {}
    for p in sorted(manifest.ranges):
        entries = [e for e in manifest.files if e.partition == p]
        partitions[p] = Counts(
            read=manifest.records_read.get(p, 0),
            backup=sum(e.records for e in entries if e.kind == "backup"),
            partitioned=sum(e.records for e in entries if e.kind == "partitioned"),
            quarantined=sum(e.records for e in entries if e.kind == "quarantine"),
            bytes=sum(e.bytes for e in entries),
            files=len(entries),
        )
    total = Counts(
        **{
            field: sum(getattr(c, field) for c in partitions.values())
            for field in Counts.model_fields
        }
    )
    return VerifyReport(
        counts=total,
        partitions=partitions,
        spark_job=manifest.spark_job,
        timestamps=manifest.timestamps,
    )
