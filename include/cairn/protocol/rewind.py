"""Rewinds: deleting the newest tokens so Kafka is read again, without ever losing a record.

A rewind only deletes tokens: the files of the runs it took back stay in the data folders,
readable, at or after the position ("rewound files"). The next run reads their offsets again and
its commit replaces exactly those files (`supersedes`), so every record is archived once again
afterwards, and a crash or a wait at any step in between leaves them readable. Files that cannot
be read again — Kafka's retention deleted their offsets, the topic is compacted (a re-read may
return fewer records), or they are sealed — are adopted by the run instead (`cairn.protocol.plan`):
kept as they are, with no gap declared for offsets the archive holds.

Finding rewound files is cheap when there are none, which is every run that follows a commit:
per backup partition folder, one listing of its generations and one `StartAfter` listing per
generation from the position (generations compare as numbers: `10_…` sorts before `9_…`). Only
when some exist are the parsed and quarantine folders listed, to find their files too.

`rewind` is what the CLI does, and it refuses what the next run would not re-read (`refusal`,
built on the same `cairn.protocol.plan.plan` the run uses): a rewind past retention, of a compacted
topic, into sealed data, or of every token of a `latest` topic.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import fastavro

from cairn.datafiles.avro_file import read_header, read_metadata
from cairn.datafiles.file_entry import FileEntry
from cairn.datafiles.sealed_file import sources_of
from cairn.errors import PermanentError
from cairn.kafka.cluster import TopicState
from cairn.protocol import commit, manifest, tokens
from cairn.protocol.plan import PlanError, Span, plan
from cairn.protocol.tokens import Token
from cairn.storage.layout import (
    DataFile,
    backup_folder,
    backup_partition,
    data_prefixes,
    manifest_key,
    parse_data_key,
    token_key,
)
from cairn.storage.objects import Storage

if TYPE_CHECKING:
    from cairn.config import TopicConfig

_HEADER_BYTES = 64 * 1024


class RewindRefused(PermanentError):
    """The rewind would lose records or strand the topic; nothing was deleted."""


def rewound_backups(
    storage: Storage, topic: str, position: Mapping[int, int]
) -> dict[int, list[DataFile]]:
    """Backup files at or after `position` (every generation), per partition in offset order."""
    found = {}
    for folder in storage.children(backup_folder(topic)):
        p = backup_partition(folder)
        if p is not None and (files := backups_from(storage, topic, p, position.get(p, 0))):
            found[p] = files
    return found


def backups_from(storage: Storage, topic: str, partition: int, start: int) -> list[DataFile]:
    """Backup files of `partition` whose first offset is at or after `start`, in offset order:
    one listing of the folder's generations, then one `StartAfter` listing per generation."""
    folder = backup_folder(topic, partition)
    found = []
    for gen in storage.name_heads(folder, "_"):
        beginning = f"{gen}{partition}_"
        floor = beginning + (f"{start - 1:020d}" if start else "")
        for key in storage.list_after(folder, floor, beginning=beginning):
            f = parse_data_key(key)
            if f is not None and f.kind == "backup" and f.offset >= start:
                found.append(f)
    return sorted(found, key=lambda f: (f.offset, f.gen))


@dataclass(frozen=True)
class Rewound:
    """What a rewind left at or after a position (`survey`)."""

    backups: dict[int, list[DataFile]]
    """The rewound backup files, per partition in offset order."""
    derived: list[DataFile] = field(default_factory=list)
    """The topic's parsed and quarantine files (listed only when there are rewound backups)."""
    sealed_sources: set[str] = field(default_factory=set)
    """Rewound backup files whose records sealed files hold: they are never read again."""


def survey(storage: Storage, topic: str, position: Mapping[int, int]) -> Rewound:
    """The rewound files at or after `position`: cheap when there are none (module doc); after a
    rewind, also the parsed and quarantine folders, and the headers of the sealed files."""
    backups = rewound_backups(storage, topic, position)
    if not backups:
        return Rewound(backups)
    derived = []
    for prefix in data_prefixes(topic)[1:]:
        derived += [f for f in map(parse_data_key, storage.list(prefix)) if f is not None]
    rewound = {f.key for files in backups.values() for f in files}
    sealed = set()
    for f in derived:
        if f.sealed:
            with storage.open_read(f.key) as data:
                sealed |= {s.source for s in sources_of(read_header(data).metadata) or []}
    return Rewound(backups, derived, rewound & sealed)


def spans(storage: Storage, rewound: Rewound) -> dict[int, list[Span]]:
    """The offsets each rewound backup file holds (its attempt's manifest says; the file itself
    when that is gone); those whose records are sealed are kept."""
    return {
        p: [Span(f.offset, _last(storage, f), f.key in rewound.sealed_sources) for f in files]
        for p, files in rewound.backups.items()
    }


def supersedes(rewound: Rewound, ranges: Mapping[int, tuple[int, int]]) -> list[str]:
    """Every file (backup, parsed, quarantine) holding rewound records in `ranges`: what the
    run's commit replaces (sealed files are never in a range the run reads: they are kept)."""
    found = []
    for f in [*(f for files in rewound.backups.values() for f in files), *rewound.derived]:
        if f.partition is None or f.first_offset is None or f.partition not in ranges:
            continue  # a sealed file (it has neither), or a partition the run does not read
        start, end = ranges[f.partition]
        if start <= f.first_offset < end:
            found.append(f.key)
    return sorted(found)


def refusal(
    storage: Storage, cfg: TopicConfig, target: Token | None, state: TopicState
) -> str | None:
    """Why a rewind to `target` (None: no token left) would not be read again safely, or None.

    The same planning the next run does: refused if it would keep rewound files instead of
    reading them again, or fail (a retention gap), or if it deletes every token of a topic that
    starts at `latest` (token 1 records where archiving began).
    """
    topic = cfg.topic_name
    if target is None and cfg.new_partition_start == "latest":
        return (
            f"topic {topic!r} starts at the end of Kafka (new_partition_start: latest): token 1 "
            "records where its archive began, so a rewind keeps it (--to-seq 1)"
        )
    position = target.next_offsets if target else {}
    rewound = survey(storage, topic, position)
    try:
        planned = plan(
            topic,
            target,
            state.watermarks,
            2**62,
            cfg.new_partition_start,
            cfg.accept_gaps,
            state.topic_id,
            rewound=spans(storage, rewound),
            compacted=state.compacted,
            planned_before=True,
        )
    except PlanError as err:
        return str(err)
    if planned.adopted:
        where = ", ".join(
            f"partition {p} [{a}, {b})" for p, (a, b) in sorted(planned.adopted.items())
        )
        why = (
            "the topic is compacted (cleanup.policy=compact): a re-read could return fewer records"
            if state.compacted
            else "Kafka no longer holds them (retention), or they are sealed"
        )
        return (
            f"topic {topic!r}: the next run could not read again what the rewound runs archived "
            f"({where}): {why}. Rewind less, or re-derive the output from the backup with the "
            "rebuild DAG (docs/recovery.md)"
        )
    return None


def rewind(
    storage: Storage,
    cfg: TopicConfig,
    state: TopicState | None,
    *,
    count: int | None = None,
    to_seq: int | None = None,
    before: datetime | None = None,
) -> list[str]:
    """Delete the newest tokens so the next run reads again from the newest one left.

    Give exactly one of: `count` (take back that many archive runs, with any rebuild or seal
    tokens above them), `to_seq` (keep tokens up to it; 0 deletes all), `before` (delete tokens
    created at or after it). Refused, deleting nothing, when the next run would not read the
    rewound offsets again (`refusal`); pass `state` None only to skip that check knowingly (Kafka
    unreachable). Tokens are deleted newest first, so a crash midway leaves a consistent chain,
    and a token's pending publication is finished before it goes (`commit.finish_pending`).
    Returns the deleted keys.
    """
    if sum(arg is not None for arg in (count, to_seq, before)) != 1:
        raise ValueError("rewind needs exactly one of count, to_seq, before")
    topic = cfg.topic_name
    chain = [tokens.token_at(storage, topic, seq) for seq in tokens.seqs(storage, topic)]
    if count is not None:
        runs = [i for i, t in enumerate(chain) if t.kind == "archive"]
        if not 0 <= count <= len(runs):
            raise ValueError(f"topic {topic!r}: cannot rewind {count} of {len(runs)} runs")
        keep = runs[-count] if count else len(chain)
    elif to_seq is not None:
        if to_seq != 0 and to_seq not in {t.seq for t in chain}:
            raise ValueError(f"topic {topic!r}: no token {to_seq} to rewind to")
        keep = sum(t.seq <= to_seq for t in chain)
    else:
        assert before is not None  # exactly one of the three was given
        keep = len(chain)
        while keep and chain[keep - 1].created_at >= before:
            keep -= 1
    doomed = chain[keep:]
    if not doomed:
        return []
    if state is not None:
        why = refusal(storage, cfg, chain[keep - 1] if keep else None, state)
        if why is not None:
            raise RewindRefused(f"{why}; nothing was deleted")
    deleted = []
    for token in reversed(doomed):
        commit.finish_pending(storage, token)  # a commit cut short: never left half published
        key = token_key(topic, token.seq)
        storage.delete(key)
        deleted.append(key)
    return deleted


def written_by(storage: Storage, f: DataFile) -> manifest.Manifest | None:
    """The manifest of the archive run that wrote `f`: a backup file names that run in its
    header (`cairn.attempt`), a parsed or quarantine file names its backup file (`cairn.source`).
    None when they do not (a rebuild's file), or the manifest is gone."""
    try:
        meta = read_metadata(storage.read_head(f.key, _HEADER_BYTES))
        source = meta.get("cairn.source")
        if f.kind != "backup" and source:
            meta = read_metadata(storage.read_head(source, _HEADER_BYTES))
        attempt = meta.get("cairn.attempt")
        return manifest.load(storage, manifest_key(f.topic, attempt)) if attempt else None
    except (FileNotFoundError, EOFError, ValueError, manifest.CorruptManifest):
        return None


def entry_of(storage: Storage, f: DataFile) -> FileEntry | None:
    """What the archive run that wrote `f` recorded of it (`written_by`)."""
    found = written_by(storage, f)
    return next((e for e in found.files if e.key == f.key), None) if found else None


def _last(storage: Storage, f: DataFile) -> int:
    """The last offset in backup file `f`: from its attempt's manifest, else read from it."""
    entry = entry_of(storage, f)
    if entry is not None:
        return entry.last_offset
    last = f.offset
    with storage.open_read(f.key) as data:
        for record in cast(Iterator[dict[str, Any]], fastavro.reader(data)):
            last = record["offset"]
    return last
