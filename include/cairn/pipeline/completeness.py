"""Completeness: when a date of a topic's archive is final, told by `_SUCCESS` and an asset event.

The rule. A date D (in the topic's timezone, filed under its path format's date folder) is
complete once every Kafka partition of the topic is archived past D's *cutoff*: the end of D
plus the topic's `lateness`, in Kafka time (log-append or create time). A partition is past the
cutoff when
1. its committed position is at or past the first offset whose timestamp is after the cutoff
   (everything Kafka holds before that record is archived), or
2. it is caught up (committed position at the high watermark) in a check that started after
   the cutoff: whatever is appended later carries a later log-append time. This is what keeps
   an idle partition from holding a date back forever.
No date is complete before its cutoff has passed on the clock, whatever a producer's clock says.

Kafka time decides, not event time: event time files a record, but only Kafka time tells whether
more can still arrive. `lateness` is the allowance for records whose event time is in D but that
reach Kafka after D ended. Records later still (or whose create time a producer set early) are
archived all the same and make D *amended*: its marker is recounted and announced again. A
rebuild of D does the same.

The marker, `partitioned/<topic>/<date folder>/_SUCCESS`, holds the date's counts recounted from
the data files themselves (records per partitioned folder, the quarantined records of that
processing date, files), the token they include and when D completed. Spark, Hive and Trino skip
`_` files and `parse_data_key` ignores it, so nothing that lists data files sees it. A process
remembers each file version's count (`count_records`): a busy topic's late records amend the
same dates run after run, and recounting every file of a date each time grew with the date's
files (24 s of a run's 150 at a hundred topics), while a new run's files are all that changed.

The state, `_complete/<topic>.json`, remembers the newest complete date and the newest token
whose files were looked at: each step reads only the manifests committed since, to find files
in complete dates (late data) and dates with data that are not complete yet. A rewind (the
remembered token gone or replaced) is noticed, and the re-read runs' files amend their dates like
late data. A step retried within the same Airflow run announces again what its first attempt
announced, so a crash between saving the state and Airflow recording the events loses none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import TYPE_CHECKING, Literal

import fastavro
from cachetools import LRUCache, cached
from pydantic import BaseModel, Field, ValidationError

from cairn.errors import PermanentError
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline.rebuild import day_versions
from cairn.protocol import commit, manifest, tokens
from cairn.storage.layout import (
    completeness_key,
    date_folder,
    file_date,
    parse_data_key,
    success_key,
)
from cairn.storage.objects import Storage

if TYPE_CHECKING:
    from cairn.config import TopicConfig

log = logging.getLogger(__name__)

_DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CorruptState(PermanentError):
    """The completeness state is unreadable; delete it to have it rebuilt from the tokens."""


def cutoff(day: date, tz: tzinfo, lateness: timedelta) -> datetime:
    """When `day` (in `tz`) may be complete: its end plus the lateness allowance."""
    return datetime.combine(day + _DAY, time(), tzinfo=tz) + lateness


@dataclass(frozen=True)
class LogView:
    """What Kafka says of a topic: its high watermarks as of `checked_at` (taken before they were
    read), and `first_after(partitions, millis)`, the first offset after a Kafka time."""

    checked_at: datetime
    high: dict[int, int]
    first_after: Callable[[list[int], int], dict[int, int | None]]


def passed(position: dict[int, int], log: LogView, at: datetime) -> bool:
    """Whether every partition is archived past Kafka time `at` (rules 1 and 2, module doc)."""
    if at >= log.checked_at:
        return False
    if any(p not in position for p in log.high):  # a partition the archive has not reached
        return False
    behind = sorted(p for p, high in log.high.items() if position[p] < high)
    if not behind:
        return True
    first = log.first_after(behind, _millis(at))
    return all((f := first.get(p)) is not None and position[p] >= f for p in behind)


def complete_through(
    position: dict[int, int],
    log: LogView,
    tz: tzinfo,
    lateness: timedelta,
    after: date,
) -> date | None:
    """The newest complete date later than `after`, or None if there is none yet.

    Being past a time only gets harder as the time grows, so dates are bisected: a few Kafka
    requests even when years of dates wait.
    """
    low, high = after + _DAY, (log.checked_at - lateness).astimezone(tz).date()
    while high >= low and cutoff(high, tz, lateness) >= log.checked_at:
        high -= _DAY
    found = None
    while low <= high:
        mid = low + (high - low) // 2
        if passed(position, log, cutoff(mid, tz, lateness)):
            found, low = mid, mid + _DAY
        else:
            high = mid - _DAY
    return found


class Marker(BaseModel):
    """The `_SUCCESS` marker of a complete date."""

    topic: str
    date: date
    folder: str
    """The date folder, under `partitioned/<topic>/`."""
    records: int
    """Records in the date's partitioned folders."""
    folders: dict[str, int]
    """Records per partitioned folder (relative to `partitioned/<topic>/`)."""
    quarantined: int
    """Records quarantined on this date (processing date, `quarantine/<topic>/dt=<date>/`)."""
    files: int
    token_seq: int
    """The newest token when counted: its and all earlier runs' files are included."""
    rebuild_seq: int | None = None
    """The rebuild that last rewrote the date, if that is why the marker was rewritten."""
    cutoff: datetime
    completed_at: datetime
    updated_at: datetime
    amendments: int = 0
    """How often late records (or a rebuild) changed the date after it completed."""
    change: Literal["complete", "amended", "rebuilt"]


class State(BaseModel):
    """A topic's completeness so far (`_complete/<topic>.json`)."""

    topic: str
    through: date | None = None
    """The newest complete date: it and every date before it are complete."""
    since: date | None = None
    """The processing date of the first token: from it on, dates without data get markers too."""
    pending: list[date] = Field(default_factory=list)
    """Dates with data that are not complete yet."""
    seq: int = 0
    token_created_at: datetime | None = None
    run_id: str | None = None
    announced: list[date] = Field(default_factory=list)
    """What `run_id` announced (a retry of its step announces it again)."""


class Completion(BaseModel):
    """What one step marked: dates newly complete and complete dates whose files changed."""

    topic: str
    through: date | None = None
    completed: list[date] = Field(default_factory=list)
    amended: list[date] = Field(default_factory=list)

    @property
    def partition_keys(self) -> list[str]:
        """The dates to announce, as asset event partition keys (`YYYY-MM-DD`)."""
        return [d.isoformat() for d in sorted(set(self.completed) | set(self.amended))]


def complete_run(cfg: TopicConfig, storage: Storage, kafka: KafkaConf, run_id: str) -> Completion:
    """Mark the dates that became complete, re-mark complete dates that received files; after
    every archive run's commit (and when a run found nothing new: idle topics complete too)."""
    topic = cfg.topic
    assert topic is not None
    if not cfg.tracks_completeness or cfg.lateness is None:
        return Completion(topic=topic)
    state = load_state(storage, topic)
    newest = commit.newest(storage, topic)
    if newest is None:
        return Completion(topic=topic, through=state.through)
    fresh = _tokens_since(storage, topic, state, newest)
    tz = cfg.tzinfo
    since = state.since
    if since is None:
        oldest = fresh[0] if fresh else newest  # a token of another kind has no planned_at
        since = (oldest.planned_at or oldest.created_at).astimezone(tz).date()
    touched = _dates_written(storage, cfg, fresh)
    waiting = set(state.pending) | {
        d for d in touched if state.through is None or d > state.through
    }
    after = state.through or min(waiting | {since}) - _DAY
    view = _log_view(kafka, topic)
    through = complete_through(newest.next_offsets, view, tz, cfg.lateness, after) or state.through
    completed: set[date] = set()
    if through is not None and through > after:
        completed = {d for d in waiting if d <= through}
        first = max(since, after + _DAY)
        completed |= {first + i * _DAY for i in range((through - first).days + 1)}
    amended = {d for d in touched if state.through is not None and d <= state.through}
    for day in sorted(completed | amended):
        write_marker(storage, cfg, day, newest.seq, "amended" if day in amended else "complete")
    again = set(state.announced) if state.run_id == run_id else set()
    save_state(
        storage,
        State(
            topic=topic,
            through=through,
            since=since,
            pending=sorted(d for d in waiting if through is None or d > through),
            seq=newest.seq,
            token_created_at=newest.created_at,
            run_id=run_id,
            announced=sorted(completed | amended | again),
        ),
    )
    done = Completion(
        topic=topic, through=through, completed=sorted(completed), amended=sorted(amended | again)
    )
    if done.partition_keys:
        log.info("topic %s: complete through %s; marked %s", topic, through, done.partition_keys)
    return done


def rebuilt(cfg: TopicConfig, storage: Storage, done: tokens.Token) -> Completion:
    """Re-mark the complete dates a rebuild (token `done`) changed: its dates and those its
    records moved to."""
    topic = cfg.topic
    assert topic is not None and done.rebuilt is not None
    if not cfg.tracks_completeness:
        return Completion(topic=topic)
    state = load_state(storage, topic)
    changed = set(done.rebuilt.dates) | _file_dates(cfg, done.adds)
    amended = sorted(d for d in changed if state.through is not None and d <= state.through)
    newest = commit.newest(storage, topic)
    seq = newest.seq if newest else done.seq
    for day in amended:
        write_marker(storage, cfg, day, seq, "rebuilt", rebuild_seq=done.seq)
    return Completion(topic=topic, through=state.through, amended=amended)


def write_marker(
    storage: Storage,
    cfg: TopicConfig,
    day: date,
    token_seq: int,
    change: Literal["complete", "amended", "rebuilt"],
    rebuild_seq: int | None = None,
) -> Marker:
    """Count `day`'s files and (re)write its `_SUCCESS` marker."""
    topic, folder = cfg.topic, date_folder(cfg.path_format, day)
    assert topic is not None and folder is not None and cfg.lateness is not None
    key = success_key(topic, folder)
    before = read_marker(storage, topic, folder)
    folders: dict[str, int] = {}
    quarantined = files = 0
    for f, version in day_versions(storage, topic, cfg.path_format, day).items():
        records = count_records(storage, f.key, version)
        files += 1
        if f.kind == "quarantine":
            quarantined += records
        else:
            folders[f.folder] = folders.get(f.folder, 0) + records
    now = datetime.now(UTC)
    marker = Marker(
        topic=topic,
        date=day,
        folder=folder,
        records=sum(folders.values()),
        folders=dict(sorted(folders.items())),
        quarantined=quarantined,
        files=files,
        token_seq=token_seq,
        rebuild_seq=rebuild_seq,
        cutoff=cutoff(day, cfg.tzinfo, cfg.lateness),
        completed_at=before.completed_at if before else now,
        updated_at=now,
        amendments=(before.amendments + 1) if before else 0,
        change=change if before else "complete",
    )
    storage.write(key, marker.model_dump_json(indent=2).encode())
    return marker


def read_marker(storage: Storage, topic: str, folder: str) -> Marker | None:
    """A date's marker, or None if the date is not marked (or the marker is unreadable)."""
    try:
        return Marker.model_validate_json(storage.read(success_key(topic, folder)))
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError):
        log.warning("topic %s: unreadable marker in %s; it is rewritten", topic, folder)
        return None


COUNTED_FILES = 100_000
"""File versions whose record counts a process remembers (about 20 MB)."""


@cached(
    LRUCache(COUNTED_FILES),
    key=lambda storage, key, version: (storage.url, key, version),
    lock=threading.Lock(),
)
def count_records(storage: Storage, key: str, version: str) -> int:
    """Records in version `version` of an Avro file, from its block counts (blocks are not
    decoded); a version is counted once per process."""
    with storage.open_read(key) as f:
        return sum(block.num_records for block in fastavro.block_reader(f))


def load_state(storage: Storage, topic: str) -> State:
    key = completeness_key(topic)
    try:
        return State.model_validate_json(storage.read(key))
    except FileNotFoundError:
        return State(topic=topic)
    except (ValidationError, ValueError) as err:
        raise CorruptState(
            f"topic {topic!r}: {key} is unreadable ({err}); delete it and the next run rebuilds "
            "it from the tokens (dates complete so far are marked again)"
        ) from None


def last_complete(storage: Storage, topic: str) -> date | None:
    """The newest date marked complete (None: none yet, or the state is unreadable, which the
    next archive run reports and repairs)."""
    try:
        return load_state(storage, topic).through
    except CorruptState as err:
        log.warning("%s", err)
        return None


def save_state(storage: Storage, state: State) -> None:
    storage.write(completeness_key(state.topic), state.model_dump_json(indent=2).encode())


def _tokens_since(
    storage: Storage, topic: str, state: State, newest: tokens.Token
) -> list[tokens.Token]:
    """The archive tokens committed since the state's, oldest first (after a rewind: since the
    newest token that the rewind left). Reads only tokens above the state's."""
    base = state.seq
    if base and base <= newest.seq:
        kept = tokens.read(storage, topic, base)
        if kept is None or kept.created_at != state.token_created_at:
            log.info("topic %s: token %s changed (a rewind): re-reading later tokens", topic, base)
            base = _left_by_rewind(storage, topic, base, state.token_created_at)
    elif base:
        base = _left_by_rewind(storage, topic, newest.seq, state.token_created_at)
    found = (tokens.read(storage, topic, s) for s in tokens.seqs(storage, topic, after=base))
    return [t for t in found if t is not None and t.kind == "archive"]


def _left_by_rewind(storage: Storage, topic: str, below: int, remembered: datetime | None) -> int:
    """The newest token at or below `below` that existed when the state was saved."""
    for seq in range(below, 0, -1):
        token = tokens.read(storage, topic, seq)
        if token is not None and remembered is not None and token.created_at <= remembered:
            return seq
    return 0


def _dates_written(storage: Storage, cfg: TopicConfig, committed: list[tokens.Token]) -> set[date]:
    """The dates the runs of `committed` wrote partitioned or quarantine files into."""
    keys = (
        f.key
        for token in committed
        if token.manifest is not None
        for f in manifest.load(storage, token.manifest).files
        if f.kind != "backup"
    )
    return _file_dates(cfg, keys)


def _file_dates(cfg: TopicConfig, keys: Iterable[str]) -> set[date]:
    found = (parse_data_key(key) for key in keys)
    days = (file_date(f, cfg.path_format) for f in found if f is not None)
    return {day for day in days if day is not None}  # None: another path format's folder


def _log_view(kafka: KafkaConf, topic: str) -> LogView:
    checked_at = datetime.now(UTC)
    high = {p: w.high for p, w in cluster.fetch_watermarks(kafka, topic).items()}

    def first_after(partitions: list[int], millis: int) -> dict[int, int | None]:
        return cluster.offsets_after(kafka, topic, partitions, millis)

    return LogView(checked_at, high, first_after)


def _millis(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(milliseconds=1)
