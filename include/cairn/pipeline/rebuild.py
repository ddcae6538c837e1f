"""Rebuilding dates of parsed output from the verbatim backup, with today's configuration.

One rebuild operation takes a set of dates R (a rebuild DAG run: its date, or a range) and
re-derives exactly the records filed under R, in R's partitioned folders and R's quarantine,
from their backup files. Each record goes where today's configuration files it: usually R again,
but a fix may move records to other dates (a quarantined record gains an event time, a timezone
fix crosses midnight), and those dates then hold them. So every record a rebuild removes is
written again exactly once, whichever dates a fix moves records between; records filed outside
R stay where they are (rebuild their dates to re-derive them). If any record cannot be accounted
for, the rebuild refuses and changes nothing.

A rebuild is an attempt (`cairn.protocol.attempt`, `REBUILD`), step by step (the rebuild DAG runs
them; `rebuild_source` runs on Spark executors, one task per backup file):
1. `select`: take the newest token (files committed after it are left alone); list R's files
   below its position; find each file's backup source in its Avro header (`cairn.source`,
   `cairn.processing_time`); claim a rebuild attempt, storing the selection in the claim.
2. `rebuild_source`: read the source's files in R to learn which records to re-derive, re-parse
   exactly those from the backup with the archive attempt's processing time, and stage the new
   files. The Spark job saves what each source gave in the attempt's manifest (`save_attempt`).
3. `commit_rebuild` (an Airflow task, like an archive run's commit): check that every record was
   written once, then commit through `cairn.protocol.commit.commit` with the requirements that the
   files it replaces are unchanged, that its new files overwrite nothing else, and that the topic
   was not rewound below what it read. Archive runs that committed meanwhile do not stop it.

Selection costs a listing of R's folders and one header read per file, however long the
topic's history is; the selection reaches Spark by reference (the claim object).
"""

from __future__ import annotations

import contextlib
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

import fastavro
from pydantic import BaseModel, Field, NonNegativeInt

from cairn.datafiles.avro_file import millis, read_header
from cairn.datafiles.file_entry import FileEntry
from cairn.datafiles.sealed_file import sources_of
from cairn.datafiles.writer import DEFAULT_MAX_OPEN_FILES, OutputFiles, ParsedWriter
from cairn.errors import PermanentError
from cairn.formats import Registries
from cairn.protocol import commit, leftovers
from cairn.protocol.attempt import Attempts, Claimed
from cairn.protocol.format_version import Versioned
from cairn.protocol.manifest import VerificationFailed
from cairn.protocol.tokens import RebuildPayload, Rebuilt, Token
from cairn.storage.layout import DataFile, day_prefixes, file_date, parse_data_key
from cairn.storage.objects import Storage

if TYPE_CHECKING:
    from cairn.config import TopicConfig

_HEADER_BYTES = 64 * 1024


class RebuildRefused(PermanentError):
    """Finishing would lose or double records, or touch files outside the selection."""


class NoDates(PermanentError):
    """The run names no date to rebuild, or a range that is reversed or not YYYY-MM-DD."""


def run_dates(own_date: date | None, first: str | None, last: str | None) -> list[date]:
    """The dates R a rebuild run re-derives: the range `first`..`last` (both ends included,
    either alone one date) if given, else the run's own date.

    A run without a data interval (triggered by hand, through the REST API or by an asset, with
    no logical date) has no date of its own and must name its range; a reversed range or a
    malformed date is the same on every retry, so these are `PermanentError`s."""
    if not first and not last:
        if own_date is None:
            raise NoDates(
                "this run has no date of its own (no logical date): give from_date and/or "
                "to_date (YYYY-MM-DD) in its conf"
            )
        return [own_date]
    given = [d for d in (first, last) if d]  # one end alone is one date
    try:
        start, end = date.fromisoformat(given[0]), date.fromisoformat(given[-1])
    except ValueError as err:
        raise NoDates(f"from_date/to_date must be YYYY-MM-DD: {err}") from None
    if end < start:
        raise NoDates(f"to_date {end} is before from_date {start}: nothing to rebuild")
    return [start + timedelta(days=i) for i in range((end - start).days + 1)]


class Source(BaseModel):
    """One backup file and the files of R holding its records (travels to a Spark executor).

    `processing_time` is the one the archive attempt parsed with, so quarantined records and
    processing-time topics keep their dates when rebuilt.
    """

    key: str
    partition: NonNegativeInt
    processing_time: datetime
    files: dict[str, str]
    """R's files holding its records, with their versions (`Storage.version`) when selected."""
    within: dict[str, tuple[NonNegativeInt, NonNegativeInt]] = Field(default_factory=dict)
    """For a sealed file among them: the offsets its records from this source have."""


class Selection(Claimed):
    """What one rebuild operation re-derives; stored in its claim."""

    dates: list[date]
    sources: list[Source]


class RebuildResult(BaseModel):
    """What `rebuild_source` re-derived: `records` of the `expected` records of R's files."""

    source: str
    expected: NonNegativeInt = 0
    records: NonNegativeInt = 0
    missing: list[int] = Field(default_factory=list)
    """Offsets (the first few) in R's files that the backup file does not hold."""
    files: list[FileEntry] = Field(default_factory=list)


class RebuildAttempt(Versioned):
    """What a rebuild's Spark job staged, source by source: its attempt manifest."""

    topic: str
    attempt_id: str
    results: list[RebuildResult]
    created_at: datetime

    @property
    def files(self) -> list[FileEntry]:
        return [f for r in self.results for f in r.files]


REBUILD = Attempts(
    "rebuild", Selection, RebuildAttempt, VerificationFailed, what="rebuild manifest"
)
load_claimed = REBUILD.load
"""The selection stored in a claim object (how the Spark job receives it)."""
load_attempt = REBUILD.load_attempt


def select(
    storage: Storage, cfg: TopicConfig, dates: Iterable[date], run_id: str
) -> Selection | None:
    """Claim a rebuild of `dates`; None if there is nothing to re-derive there."""
    topic = cfg.topic_name
    newest = commit.settle(storage, topic)
    leftovers.sweep(storage, topic)
    if newest is None:
        return None
    position = newest.next_offsets
    days = sorted(set(dates))
    files = {
        f: version
        for day in days
        for f, version in day_versions(storage, topic, cfg.path_format, day).items()
        if f.partition is None or f.offset < position.get(f.partition, 0)  # None: sealed, complete
    }
    if not files:
        return None
    sources = _sources(storage, topic, files)

    def made(claim: commit.Claim) -> Selection:
        return Selection(claim=claim, dates=days, sources=sources)

    return REBUILD.claim(storage, topic, newest, run_id, made, cfg.attempt_timeout)


def save_attempt(storage: Storage, chosen: Selection, results: list[RebuildResult]) -> str:
    """Stage what the Spark job staged, as the attempt's manifest (the commit task reads it),
    while the claim is live (`Attempts.save`)."""
    attempt = RebuildAttempt(
        topic=chosen.claim.topic,
        attempt_id=chosen.claim.attempt_id,
        results=results,
        created_at=datetime.now(UTC),
    )
    return REBUILD.save(storage, chosen, attempt)


def commit_rebuild(storage: Storage, cfg: TopicConfig, chosen: Selection) -> Token:
    """Replace R's files by the re-derived ones, or refuse and change nothing (see module doc).

    Safe to retry: a rebuild that already committed returns its token (its publication
    finished); one refused leaves nothing behind."""
    claim = chosen.claim

    def change() -> commit.Change:
        staged = chosen.staged(storage)
        results = load_attempt(staged, chosen.manifest_key).results
        new_files = _accounted(chosen, results)
        verify_rebuild(staged, new_files)
        rebuilt = Rebuilt(
            dates=chosen.dates,
            snapshot_seq=claim.base_seq,
            sources=[s.key for s in chosen.sources],
        )
        return commit.replacing(
            {key: version for s in chosen.sources for key, version in s.files.items()},
            {f.key: f.bytes for f in new_files},
            RebuildPayload(
                generation=cfg.generation, manifest=chosen.manifest_key, rebuilt=rebuilt
            ),
        )

    return REBUILD.commit(storage, chosen, change)


def _accounted(chosen: Selection, results: list[RebuildResult]) -> list[FileEntry]:
    """The new files, once every record of the selection is accounted for."""
    unaccounted = [r for r in results if r.missing or r.records != r.expected]
    done = {r.source for r in results}
    if unaccounted or done != {s.key for s in chosen.sources}:
        detail = "; ".join(
            f"{r.source} lacks offsets {r.missing} of the files it should hold" for r in unaccounted
        )
        raise RebuildRefused(
            f"topic {chosen.claim.topic!r} {_dates(chosen.dates)}: not every record could be "
            f"re-derived from its backup ({detail or 'a source was not rebuilt'}); nothing was "
            "changed"
        )
    return [f for r in results for f in r.files]


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
    missing: list[int] = []
    j = 0
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


def _sources(storage: Storage, topic: str, files: dict[DataFile, str]) -> list[Source]:
    """Group R's files by the backup file holding their records: named in each file's header,
    or, for a sealed file, listed there with the offsets each one's records have in it."""
    grouped: dict[str, Source] = {}
    for f, version in files.items():
        with storage.open_read(f.key) as data:
            meta = read_header(data).metadata
        sealed = sources_of(meta)
        spans: list[tuple[str | None, str | None, tuple[int, int] | None]]
        if sealed is None:
            spans = [(meta.get("cairn.source"), meta.get("cairn.processing_time"), None)]
        else:
            spans = [(s.source, s.processing_time, (s.first, s.last)) for s in sealed]
        for key, when, within in spans:
            named = parse_data_key(key) if key else None
            if (
                key is None
                or named is None
                or named.kind != "backup"
                or named.partition is None
                or named.topic != topic
                or when is None
            ):
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
                    files={},
                ),
            )
            source.files[f.key] = version
            if within is not None:
                source.within[f.key] = within
    return sorted(grouped.values(), key=lambda s: (s.partition, s.key))


def _offsets(storage: Storage, source: Source) -> Iterator[int]:
    """The Kafka offsets of the records in `source.files` (partitioned or quarantine) that came
    from `source`: all of a run's file, the span `source.within` names in a sealed file."""
    for key in source.files:
        named = parse_data_key(key)
        parsed = named is not None and named.kind == "partitioned"
        p_field, o_field = (
            ("_kafka_partition", "_kafka_offset") if parsed else ("partition", "offset")
        )
        within = source.within.get(key)
        with storage.open_read(key) as f:
            for row in cast(Iterator[dict[str, Any]], fastavro.reader(f)):
                p, offset = row[p_field], row[o_field]
                if within is not None:
                    if p == source.partition and within[0] <= offset <= within[1]:
                        yield offset
                    continue
                if p != source.partition:
                    raise RebuildRefused(
                        f"{key} holds a record of partition {p}, but its header names "
                        f"{source.key}; nothing was changed"
                    )
                yield offset


def _backup_records(storage: Storage, source: Source, topic: str) -> Iterator[dict[str, Any]]:
    """The backup file's records, checked against the source (names depend on them)."""
    previous = -1
    with storage.open_read(source.key) as f:
        for record in cast(Iterator[dict[str, Any]], fastavro.reader(f)):
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


def day_versions(storage: Storage, topic: str, path_format: str, day: date) -> dict[DataFile, str]:
    """Data files (and their versions) in `day`'s partitioned folders (of `path_format`) and
    quarantine: one listing each."""
    found = {}
    for prefix in day_prefixes(topic, path_format, day):  # only what the date alone fixes
        for key, version in storage.versions(prefix).items():
            f = parse_data_key(key)
            if f is not None and file_date(f, path_format) == day:
                found[f] = version
    return found


def day_files(storage: Storage, topic: str, path_format: str, day: date) -> list[DataFile]:
    """Data files in `day`'s partitioned folders (of `path_format`) and quarantine."""
    return list(day_versions(storage, topic, path_format, day))


def _dates(days: list[date]) -> str:
    return days[0].isoformat() if len(days) == 1 else f"{days[0]}..{days[-1]}"
