"""Rebuilding one date of parsed output from the verbatim backup, with today's configuration.

A rebuild of day D of topic T, step by step (the rebuild DAG runs these; `rebuild_source` runs on
Spark executors, one backup file per task):
1. `take_snapshot`: the committed tokens now. The rebuild works on exactly these runs, so files
   that archive runs commit meanwhile (late data landing in D) are never touched.
2. `select_sources`: the backup files that can hold D's records, found from the manifests.
3. `rebuild_source`: re-parse one backup file; write D's records, skip the others.
4. `verify_rebuild`, then `finish_rebuild`: the new files are complete; only then are D's stale
   files deleted (every generation) and the rebuild manifest saved.

Each file a rebuild writes holds records of one backup file, i.e. of one committed run, so
cleanup after a rewind still removes exactly the rewound runs' records (see `cairn.clean`).

Two windows to know about. Between writing and finishing, a reader can see some of D's records
twice where names changed (a generation bump, or records that now fall into other folders); a
failed rebuild leaves that until it is retried. And records that today's parser moves from D to
another date are in neither until that date is rebuilt too: rebuild every affected date.
"""

from __future__ import annotations

import contextlib
import uuid
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise, takewhile
from typing import TYPE_CHECKING, Any

import fastavro
from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt

from cairn import manifest, tokens
from cairn.layout import (
    DataFile,
    check_topic,
    folder_date,
    parse_data_key,
    rebuilds_prefix,
    token_key,
)
from cairn.manifest import FileEntry, Manifest, VerificationFailed
from cairn.parsing import Parsed
from cairn.storage import Storage
from cairn.writer import DEFAULT_MAX_OPEN_FILES, OutputFiles, ParsedWriter

if TYPE_CHECKING:
    from cairn.config import TopicConfig

_DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


class RebuildRefused(Exception):
    """Finishing would lose records or touch files outside the snapshot; nothing was deleted."""


class Snapshot(BaseModel):
    """The committed runs a rebuild works on: the newest token and every surviving manifest."""

    topic: str
    seq: PositiveInt
    next_offsets: dict[NonNegativeInt, NonNegativeInt]
    created_at: datetime
    """Of the newest token: with `seq` it tells `finish_rebuild` whether the topic was rewound."""
    manifests: list[str]


class Source(BaseModel):
    """One backup file to re-read (JSON-serialisable: it travels to a Spark executor).

    `processing_time` is the one the archive attempt parsed with, so quarantined records and
    processing-time topics keep their dates when rebuilt. `processing_date` is its date in the
    topic's timezone.
    """

    key: str
    partition: NonNegativeInt
    first_offset: NonNegativeInt
    last_offset: NonNegativeInt
    processing_time: datetime
    processing_date: date


class RebuildResult(BaseModel):
    """What `rebuild_source` read and wrote."""

    records: NonNegativeInt = 0
    files: list[FileEntry] = Field(default_factory=list)
    partitioned: NonNegativeInt = 0
    quarantined: NonNegativeInt = 0


class RebuildManifest(BaseModel):
    """What one finished rebuild of a date read and wrote; the newest per date is what the date
    holds (up to files archive runs committed after its snapshot)."""

    topic: str
    day: date
    attempt_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,100}$")
    snapshot_seq: PositiveInt
    generation: PositiveInt
    sources: list[str]
    files: list[FileEntry]
    created_at: datetime

    @property
    def key(self) -> str:
        return f"{rebuilds_prefix(self.topic, self.day)}{self.attempt_id}.json"


class Selection(BaseModel):
    """What one rebuild run re-derives (travels from the select task to the Spark job)."""

    day: date
    snapshot: Snapshot
    sources: list[Source]


def select(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    margin: timedelta = _DAY,
    also_from: Iterable[date] = (),
) -> Selection | None:
    """Snapshot the committed tokens and choose the backup files for `day`; None if the topic
    was never archived."""
    snap = take_snapshot(storage, cfg.topic)
    if snap is None:
        return None
    sources = select_sources(storage, cfg, snap, day, margin, also_from)
    return Selection(day=day, snapshot=snap, sources=sources)


def take_snapshot(storage: Storage, topic: str) -> Snapshot | None:
    """The committed tokens now; None if nothing was ever committed."""
    committed = tokens.list_tokens(storage, topic)
    if not committed:
        return None
    newest = committed[-1]
    return Snapshot(
        topic=topic,
        seq=newest.seq,
        next_offsets=newest.next_offsets,
        created_at=newest.created_at,
        manifests=[t.manifest for t in committed if t.manifest],
    )


def select_sources(
    storage: Storage,
    cfg: TopicConfig,
    snap: Snapshot,
    day: date,
    margin: timedelta = _DAY,
    also_from: Iterable[date] = (),
) -> list[Source]:
    """The backup files of the snapshot that can hold records of `day`, from manifests only.

    A backup file is chosen when a manifest files any of its records within `day` ± `margin`
    (in the topic's timezone): the archive attempt's partitioned files have event times there,
    or the attempt's processing time is there (quarantine is filed by processing date, and
    processing-time topics by processing time), or the newest rebuild of a date within the
    margin wrote its records there (they may have moved since the attempt).

    The margin exists because today's parser may file records elsewhere than the one that
    archived them: a fix can move them by hours (e.g. a corrected timezone moves events and
    quarantine across midnight). Its limit: a fix that moves records further (a wrong year,
    seconds read as milliseconds) needs the dates they move from listed explicitly in
    `also_from` (each with the same margin); `finish_rebuild` refuses rather than delete
    records that no chosen source holds.
    """
    if margin < timedelta(0):
        raise ValueError(f"margin must not be negative, not {margin}")
    dates = [day, *also_from]
    windows = [_window(d, cfg, margin) for d in dates]

    def filed_within(low: int, high: int) -> bool:
        return any(high >= start and low < end for start, end in windows)

    sources: list[Source] = []
    chosen: set[str] = set()
    for key in snap.manifests:
        attempt = manifest.load(storage, key)
        found = _sources(attempt, cfg)
        sources += found
        processed = _millis(attempt.processing_time)
        if filed_within(processed, processed):
            chosen |= {s.key for s in found}
        timed = [
            e
            for e in attempt.files
            if e.kind == "partitioned"
            and e.min_event_time is not None
            and e.max_event_time is not None
            and filed_within(e.min_event_time, e.max_event_time)
        ]
        chosen |= _holding(found, timed)
    reach = -(-margin // _DAY)  # whole days, rounded up
    for nearby in sorted({d + i * _DAY for d in dates for i in range(-reach, reach + 1)}):
        rebuilt = newest_rebuild(storage, snap.topic, nearby)
        chosen |= _holding(sources, rebuilt.files if rebuilt else [])
    return sorted(
        (s for s in sources if s.key in chosen), key=lambda s: (s.partition, s.first_offset)
    )


def rebuild_source(
    source: Source,
    cfg: TopicConfig,
    storage: Storage,
    day: date,
    max_open_files: int = DEFAULT_MAX_OPEN_FILES,
) -> RebuildResult:
    """Re-parse one backup file with `cfg` and write the records that belong to `day`.

    Partitioned records go out when their folder's date is `day`; rejected ones to `day`'s
    quarantine when the archive attempt processed them on `day` (quarantine is filed by
    processing date). Everything else belongs to another date's rebuild. Parsing uses the
    attempt's processing time, not the rebuild's, so processing-time topics keep their dates,
    quarantined records keep their `processing_time`, and rebuilding twice writes the same
    records. Files are named by their first record's offset with `cfg.generation`, whole or not
    at all; raw topics have nothing to rebuild.
    """
    if cfg.format == "raw":
        return RebuildResult()
    records = 0
    with contextlib.ExitStack() as uploads:  # on error, discards every upload still open
        files = OutputFiles(storage, cfg.codec, uploads)
        out = ParsedWriter(
            cfg, files, source.processing_time, source.processing_date, max_open_files
        )
        for verbatim in _backup_records(storage, source, out.topic):
            records += 1
            result = out.parse(verbatim)
            if isinstance(result, Parsed):
                keep = folder_date(result.folder, cfg.path_format) == day
            else:
                keep = source.processing_date == day
            if keep:
                out.write(verbatim, result)
        out.close()
    return RebuildResult(
        records=records,
        files=files.files,
        partitioned=sum(e.records for e in files.files if e.kind == "partitioned"),
        quarantined=sum(e.records for e in files.files if e.kind == "quarantine"),
    )


def verify_rebuild(storage: Storage, new_files: list[FileEntry]) -> None:
    """Each new file exists with its stated size and name; none overlaps another in a folder."""
    problems = []
    spans: dict[tuple[str, int], list[FileEntry]] = defaultdict(list)
    for e in new_files:
        named = parse_data_key(e.key)
        if named is None or (named.partition, named.first_offset) != (e.partition, e.first_offset):
            problems.append(f"{e.key} does not name partition {e.partition} at {e.first_offset}")
        elif not storage.exists(e.key):
            problems.append(f"{e.key} is missing")
        elif storage.size(e.key) != e.bytes:
            problems.append(f"{e.key} has {storage.size(e.key)} bytes, expected {e.bytes}")
        spans[e.key.rsplit("/", 1)[0], e.partition].append(e)
    for same in spans.values():
        ordered = sorted(same, key=lambda e: e.first_offset)
        for before, after in pairwise(ordered):
            if after.first_offset <= before.last_offset:
                problems.append(f"{before.key} and {after.key} overlap")
    if problems:
        raise VerificationFailed("rebuild: " + "; ".join(problems))


def finish_rebuild(
    storage: Storage,
    cfg: TopicConfig,
    snap: Snapshot,
    day: date,
    new_files: list[FileEntry],
    sources: list[Source],
) -> list[str]:
    """Replace `day`'s stale files with the complete new ones; return the deleted keys.

    Stale: every file in `day`'s partitioned folders and quarantine, of any generation, that is
    not new and starts below the snapshot's offsets (later files are runs committed since).
    Refuses, deleting nothing, if the topic was rewound since the snapshot or a stale file lies
    outside every source (the selection missed a backup file: its records would be lost). The
    rebuild manifest is saved before deleting, so it lists the date's files even if deleting
    stops midway (a retry deletes the rest).
    """
    verify_rebuild(storage, new_files)
    _check_not_rewound(storage, snap)
    new = {e.key for e in new_files}
    stale = [
        f
        for f in _day_files(storage, snap.topic, cfg.path_format, day)
        if f.key not in new and f.first_offset < snap.next_offsets.get(f.partition, 0)
    ]
    held = _holder(sources)
    unheld = [f.key for f in stale if held(f.partition, f.first_offset) is None]
    if unheld:
        raise RebuildRefused(
            f"topic {snap.topic!r} {day}: no chosen backup file holds the records of "
            f"{', '.join(unheld)}; nothing was deleted. Rebuild with the dates these records "
            "were filed under in also_from (or a larger margin)"
        )
    now = datetime.now(UTC)
    save_rebuild(
        storage,
        RebuildManifest(
            topic=snap.topic,
            day=day,
            attempt_id=f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}",
            snapshot_seq=snap.seq,
            generation=cfg.generation,
            sources=[s.key for s in sources],
            files=new_files,
            created_at=now,
        ),
    )
    for f in stale:
        storage.delete(f.key)
    return [f.key for f in stale]


def save_rebuild(storage: Storage, rebuilt: RebuildManifest) -> str:
    storage.write(rebuilt.key, rebuilt.model_dump_json(indent=2).encode())
    return rebuilt.key


def newest_rebuild(storage: Storage, topic: str, day: date) -> RebuildManifest | None:
    """The last finished rebuild of `day` (attempt ids start with their UTC time, so sort)."""
    keys = storage.list(rebuilds_prefix(topic, day))
    if not keys:
        return None
    return RebuildManifest.model_validate_json(storage.read(keys[-1]))


def _window(day: date, cfg: TopicConfig, margin: timedelta) -> tuple[int, int]:
    """`day` ± `margin` in the topic's timezone, as epoch millis [start, end)."""
    start = datetime.combine(day, time(), cfg.tzinfo) - margin
    end = datetime.combine(day + _DAY, time(), cfg.tzinfo) + margin
    return _millis(start), _millis(end)


def _millis(when: datetime) -> int:
    return (when - _EPOCH) // _MS


def _sources(attempt: Manifest, cfg: TopicConfig) -> list[Source]:
    when = attempt.processing_time
    return [
        Source(
            key=e.key,
            partition=e.partition,
            first_offset=e.first_offset,
            last_offset=e.last_offset,
            processing_time=when,
            processing_date=when.astimezone(cfg.tzinfo).date(),
        )
        for e in attempt.files
        if e.kind == "backup"
    ]


def _holder(sources: Iterable[Source]) -> Callable[[int, int], Source | None]:
    """A lookup of the source holding (partition, offset)."""
    by_partition: dict[int, list[Source]] = defaultdict(list)
    for s in sorted(sources, key=lambda s: s.first_offset):
        by_partition[s.partition].append(s)
    starts = {p: [s.first_offset for s in found] for p, found in by_partition.items()}

    def held(partition: int, offset: int) -> Source | None:
        i = bisect_right(starts.get(partition, []), offset) - 1
        found = by_partition[partition][i] if i >= 0 else None
        return found if found is not None and offset <= found.last_offset else None

    return held


def _holding(sources: Iterable[Source], entries: Iterable[FileEntry]) -> set[str]:
    """Keys of the sources that hold the records of any of `entries`."""
    held = _holder(sources)
    return {s.key for e in entries if (s := held(e.partition, e.first_offset)) is not None}


def _backup_records(storage: Storage, source: Source, topic: str) -> Iterator[dict[str, Any]]:
    """The backup file's records, checked against the source (names depend on them)."""
    previous = -1
    with storage.open_read(source.key) as f:
        for record in fastavro.reader(f):
            offset = record["offset"]
            if (
                record["topic"] != topic
                or record["partition"] != source.partition
                or not max(previous + 1, source.first_offset) <= offset <= source.last_offset
            ):
                raise ValueError(
                    f"{source.key}: record {record['topic']}/{record['partition']}@{offset} "
                    f"does not fit partition {source.partition} offsets "
                    f"{source.first_offset}..{source.last_offset} in order"
                )
            previous = offset
            yield record


def _day_files(storage: Storage, topic: str, path_format: str, day: date) -> list[DataFile]:
    """Data files in `day`'s partitioned folders (of `path_format`) and quarantine."""
    check_topic(topic)
    # List only below the folders that the date alone fixes, e.g. `dt=2024-06-01/`.
    fixed = takewhile(lambda s: "%H" not in s and "%M" not in s, path_format.split("/"))
    midnight = datetime.combine(day, time())
    prefix = "".join(f"{midnight.strftime(segment)}/" for segment in fixed)
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
    try:
        token = tokens.Token.model_validate_json(storage.read(token_key(snap.topic, snap.seq)))
    except FileNotFoundError:
        token = None
    if token is None or (token.created_at, token.next_offsets) != (
        snap.created_at,
        snap.next_offsets,
    ):
        raise RebuildRefused(
            f"topic {snap.topic!r}: token {snap.seq} changed since the rebuild's snapshot (the "
            "topic was rewound); nothing was deleted, run the rebuild again"
        )
