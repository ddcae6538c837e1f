"""Rebuilding dates of parsed output from the verbatim backup, with today's configuration.

One rebuild operation takes a set of dates R (a rebuild DAG run: its date, or a range) and
re-derives exactly the records filed under R, in R's partitioned folders and R's quarantine,
from their backup files. Each record goes where today's configuration files it: usually R again,
but a fix may move records to other dates (a quarantined record gains an event time, a timezone
fix crosses midnight), and those dates then hold them. So every record a rebuild removes is
written again exactly once, whichever dates a fix moves records between; records filed outside
R stay where they are (rebuild their dates to re-derive them). If any record cannot be accounted
for, the rebuild refuses and changes nothing.

Step by step (the rebuild DAG runs them; `rebuild_source` runs on Spark executors, one task per
backup file):
1. `select`: finish publications a crash interrupted; snapshot the newest token (files committed
   after it are left alone); list R's files below the snapshot; find each file's backup source
   in its Avro header (`cairn.source`, `cairn.processing_time`); claim the next link of the
   topic's rebuild chain (`cairn.fence`), storing the selection in the claim.
2. `rebuild_source`: read the source's files in R to learn which records to re-derive, re-parse
   exactly those from the backup with the archive attempt's processing time, and stage the new
   files (`cairn.staging`).
3. `finish_rebuild`: check that every record was written once and nothing outside the selection
   would be overwritten; check the claim and that the topic was not rewound; store the
   publication (new files in, R's old files out), create the rebuild link, publish.

Selection costs a listing of R's folders and one header read per file, however long the
topic's history is; the selection reaches Spark by reference (the claim object).
"""

from __future__ import annotations

import contextlib
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import fastavro
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt

from cairn import fence, staging, tokens
from cairn.avro import millis, read_metadata
from cairn.errors import PermanentError
from cairn.formats import Registries
from cairn.layout import (
    DataFile,
    chain_key,
    check_topic,
    date_prefix,
    folder_date,
    parse_data_key,
)
from cairn.manifest import FileEntry, VerificationFailed
from cairn.storage import Storage
from cairn.writer import DEFAULT_MAX_OPEN_FILES, OutputFiles, ParsedWriter

if TYPE_CHECKING:
    from cairn.config import TopicConfig

_HEADER_BYTES = 64 * 1024


class RebuildRefused(PermanentError):
    """Finishing would lose or double records, or touch files outside the snapshot."""


class Snapshot(BaseModel):
    """The newest token when the rebuild started: it works only on files committed below it."""

    topic: str
    seq: PositiveInt
    next_offsets: dict[NonNegativeInt, NonNegativeInt]
    created_at: datetime
    """With `seq`, tells `finish_rebuild` whether the topic was rewound meanwhile."""


class Source(BaseModel):
    """One backup file and the files of R holding its records (travels to a Spark executor).

    `processing_time` is the one the archive attempt parsed with, so quarantined records and
    processing-time topics keep their dates when rebuilt.
    """

    key: str
    partition: NonNegativeInt
    processing_time: datetime
    files: list[str]


class Selection(BaseModel):
    """What one rebuild operation re-derives; stored in its claim."""

    claim: fence.Claim
    dates: list[date]
    snapshot: Snapshot
    sources: list[Source]


class RebuildResult(BaseModel):
    """What `rebuild_source` re-derived: `records` of the `expected` records of R's files."""

    source: str
    expected: NonNegativeInt = 0
    records: NonNegativeInt = 0
    missing: list[int] = Field(default_factory=list)
    """Offsets (the first few) in R's files that the backup file does not hold."""
    files: list[FileEntry] = Field(default_factory=list)


class RebuildManifest(BaseModel):
    """A finished rebuild: link `seq` of the topic's rebuild chain."""

    seq: PositiveInt
    topic: str
    attempt_id: str
    dates: list[date]
    snapshot_seq: PositiveInt
    generation: PositiveInt
    sources: list[str]
    files: list[FileEntry]
    removed: list[str]
    created_at: datetime


def select(
    storage: Storage, cfg: TopicConfig, dates: Iterable[date], run_id: str
) -> Selection | None:
    """Claim a rebuild of `dates`; None if there is nothing to re-derive there."""
    topic = cfg.topic
    staging.settle(storage, topic)
    newest = tokens.newest(storage, topic)
    if newest is None:
        return None
    snap = Snapshot(
        topic=topic, seq=newest.seq, next_offsets=newest.next_offsets, created_at=newest.created_at
    )
    days = sorted(set(dates))
    files = [
        f
        for day in days
        for f in day_files(storage, topic, cfg.path_format, day)
        if f.first_offset < snap.next_offsets.get(f.partition, 0)
    ]
    if not files:
        return None
    sources = _sources(storage, topic, files)

    def made(claim: fence.Claim) -> Selection:
        return Selection(claim=claim, dates=days, snapshot=snap, sources=sources)

    base = fence.newest_link(storage, topic, "rebuild")
    claim = fence.claim(
        storage, topic, "rebuild", base, run_id, lambda c: made(c).model_dump_json().encode()
    )
    return made(claim)


def load_selection(storage: Storage, claim_key: str) -> Selection:
    return Selection.model_validate_json(storage.read(claim_key))


def rebuild_source(
    source: Source,
    cfg: TopicConfig,
    storage: Storage,
    staged: Storage,
    max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    registries: Registries | None = None,
) -> RebuildResult:
    """Re-derive the records of `source` that R's files hold; stage the new files in `staged`.

    `registries`: the Schema Registry client configurations the topic's format needs.

    Memory: the offsets to re-derive (one backup file's worth at most, packed 8 bytes each once
    sorted) plus the writer's bounded buffers. Files are named by their first record's offset with
    `cfg.generation`, so rebuilding twice writes the same names.
    """
    wanted = array("q", sorted(_offsets(storage, source)))
    result = RebuildResult(source=source.key, expected=len(wanted))
    found = array("q")
    processing_date = source.processing_time.astimezone(cfg.tzinfo).date()
    with contextlib.ExitStack() as uploads:  # on error, discards every upload still open
        files = OutputFiles(staged, cfg.codec, uploads)
        out = ParsedWriter(
            cfg, files, source.processing_time, processing_date, max_open_files, registries
        )
        out.source = source.key
        for verbatim in _backup_records(storage, source, out.topic):
            offset = verbatim["offset"]
            i = bisect_left(wanted, offset)
            if i < len(wanted) and wanted[i] == offset:
                out.write(verbatim, out.parse(verbatim))
                found.append(offset)
        out.close()
    result.records = len(found)
    result.missing = _missing(wanted, found)
    result.files = files.files
    return result


def _missing(wanted: array, found: array, most: int = 10) -> list[int]:
    """The first `most` offsets of `wanted` that `found` (an ordered subsequence) lacks."""
    missing, j = [], 0
    for offset in wanted:
        if j < len(found) and found[j] == offset:
            j += 1
        elif len(missing) < most:
            missing.append(offset)
    return missing


def verify_rebuild(staged: Storage, new_files: list[FileEntry]) -> None:
    """Each new file exists with its stated size and name; none overlaps another in a folder."""
    problems = []
    spans: dict[tuple[str, int], list[FileEntry]] = defaultdict(list)
    for e in new_files:
        named = parse_data_key(e.key)
        if named is None or (named.partition, named.first_offset) != (e.partition, e.first_offset):
            problems.append(f"{e.key} does not name partition {e.partition} at {e.first_offset}")
        elif not staged.exists(e.key):
            problems.append(f"{e.key} is missing")
        elif staged.size(e.key) != e.bytes:
            problems.append(f"{e.key} has {staged.size(e.key)} bytes, expected {e.bytes}")
        spans[e.key.rsplit("/", 1)[0], e.partition].append(e)
    for same in spans.values():
        ordered = sorted(same, key=lambda e: e.first_offset)
        for before, after in pairwise(ordered):
            if after.first_offset <= before.last_offset:
                problems.append(f"{before.key} and {after.key} overlap")
    if problems:
        raise VerificationFailed("rebuild: " + "; ".join(problems))


def finish_rebuild(
    storage: Storage, cfg: TopicConfig, chosen: Selection, results: list[RebuildResult]
) -> RebuildManifest:
    """Replace R's files by the re-derived ones, or refuse and change nothing (see module doc)."""
    claim = chosen.claim
    topic = chosen.snapshot.topic
    if fence.decided_for(storage, topic, "rebuild", claim.seq) == claim.attempt_id:
        # A retry after this attempt committed: its staging may be half published already, so
        # checking it again would fail and discard the rest. Only publishing is left to do.
        staging.publish(storage, topic, claim.attempt_id)
        return read_rebuild(storage, topic, claim.seq)
    try:
        manifest = _decide(storage, cfg, chosen, results)
    except PermanentError:
        staging.discard(storage, topic, claim.attempt_id)
        raise
    staging.publish(storage, topic, claim.attempt_id)
    return manifest


def read_rebuild(storage: Storage, topic: str, seq: int) -> RebuildManifest | None:
    """Link `seq` of the topic's rebuild chain, if it exists."""
    try:
        raw = storage.read(chain_key(topic, "rebuild", seq))
    except FileNotFoundError:
        return None
    return RebuildManifest.model_validate_json(raw)


def _decide(
    storage: Storage, cfg: TopicConfig, chosen: Selection, results: list[RebuildResult]
) -> RebuildManifest:
    claim, snap = chosen.claim, chosen.snapshot
    unaccounted = [r for r in results if r.missing or r.records != r.expected]
    if unaccounted or len(results) != len(chosen.sources):
        detail = "; ".join(
            f"{r.source} lacks offsets {r.missing} of the files it should hold" for r in unaccounted
        )
        raise RebuildRefused(
            f"topic {snap.topic!r} {_dates(chosen.dates)}: not every record could be re-derived "
            f"from its backup ({detail or 'a source was not rebuilt'}); nothing was changed"
        )
    new_files = [f for r in results for f in r.files]
    staged = staging.staged(storage, snap.topic, claim.attempt_id)
    verify_rebuild(staged, new_files)
    old = {key for s in chosen.sources for key in s.files}
    new = {f.key for f in new_files}
    foreign = sorted(key for key in new - old if storage.exists(key))
    if foreign:
        raise RebuildRefused(
            f"topic {snap.topic!r} {_dates(chosen.dates)}: the new files would replace "
            f"{', '.join(foreign[:5])}, which this rebuild did not select; nothing was changed"
        )
    _check_not_rewound(storage, snap)
    manifest = RebuildManifest(
        seq=claim.seq,
        topic=snap.topic,
        attempt_id=claim.attempt_id,
        dates=chosen.dates,
        snapshot_seq=snap.seq,
        generation=cfg.generation,
        sources=[s.key for s in chosen.sources],
        files=new_files,
        removed=sorted(old - new),
        created_at=datetime.now(UTC),
    )
    publication = staging.Publication(move=sorted(new), delete=manifest.removed)
    staging.prepare(storage, snap.topic, claim.attempt_id, publication)
    fence.commit(storage, claim, manifest.model_dump_json(indent=2).encode())
    return manifest


def _sources(storage: Storage, topic: str, files: list[DataFile]) -> list[Source]:
    """Group R's files by the backup file holding their records (named in each header)."""
    grouped: dict[str, Source] = {}
    for f in files:
        try:
            meta = read_metadata(storage.read_head(f.key, _HEADER_BYTES))
        except (EOFError, ValueError):  # a header larger than the first read
            meta = read_metadata(storage.read(f.key))
        key, when = meta.get("cairn.source"), meta.get("cairn.processing_time")
        named = parse_data_key(key) if key else None
        if named is None or named.kind != "backup" or named.topic != topic or when is None:
            raise RebuildRefused(
                f"{f.key} does not name its backup file in its header (written by an older "
                "Cairn?); nothing was changed. Re-archive the topic under a new generation"
            )
        source = grouped.setdefault(
            key,
            Source(
                key=key,
                partition=named.partition,
                processing_time=datetime.fromisoformat(when),
                files=[],
            ),
        )
        source.files.append(f.key)
    return sorted(grouped.values(), key=lambda s: (s.partition, s.key))


def _offsets(storage: Storage, source: Source) -> Iterator[int]:
    """The Kafka offsets of the records in `source.files` (partitioned or quarantine)."""
    for key in source.files:
        parsed = parse_data_key(key).kind == "partitioned"
        p_field, o_field = (
            ("_kafka_partition", "_kafka_offset") if parsed else ("partition", "offset")
        )
        with storage.open_read(key) as f:
            for row in fastavro.reader(f):
                if row[p_field] != source.partition:
                    raise RebuildRefused(
                        f"{key} holds a record of partition {row[p_field]}, but its header names "
                        f"{source.key}; nothing was changed"
                    )
                yield row[o_field]


def _backup_records(storage: Storage, source: Source, topic: str) -> Iterator[dict[str, Any]]:
    """The backup file's records, checked against the source (names depend on them)."""
    previous = -1
    with storage.open_read(source.key) as f:
        for record in fastavro.reader(f):
            offset = record["offset"]
            if (
                record["topic"] != topic
                or record["partition"] != source.partition
                or offset <= previous
            ):
                raise ValueError(
                    f"{source.key}: record {record['topic']}/{record['partition']}@{offset} "
                    f"does not fit partition {source.partition} in offset order"
                )
            previous = offset
            record["timestamp"] = millis(record["timestamp"])  # old backups hold plain longs
            yield record


def day_files(storage: Storage, topic: str, path_format: str, day: date) -> list[DataFile]:
    """Data files in `day`'s partitioned folders (of `path_format`) and quarantine."""
    check_topic(topic)
    # List only below the folders that the date alone fixes, e.g. `dt=2024-06-01/`.
    prefix = date_prefix(path_format, day)
    found = []
    for key in storage.list(f"partitioned/{topic}/{prefix}"):
        f = parse_data_key(key)
        if f is not None and _folder_date(f.folder, path_format) == day:
            found.append(f)
    quarantined = (parse_data_key(k) for k in storage.list(f"quarantine/{topic}/dt={day}/"))
    return found + [f for f in quarantined if f is not None]


def _folder_date(folder: str, path_format: str) -> date | None:
    """None for a folder of another path format (not this configuration's to replace)."""
    try:
        return folder_date(folder, path_format)
    except ValueError:
        return None


def _check_not_rewound(storage: Storage, snap: Snapshot) -> None:
    link = fence.read_link(storage, snap.topic, "archive", snap.seq)
    if link is None or link.created_at != snap.created_at:
        raise RebuildRefused(
            f"topic {snap.topic!r}: token {snap.seq} changed since the rebuild's snapshot (the "
            "topic was rewound); nothing was changed, run the rebuild again"
        )


def _dates(days: list[date]) -> str:
    return days[0].isoformat() if len(days) == 1 else f"{days[0]}..{days[-1]}"
