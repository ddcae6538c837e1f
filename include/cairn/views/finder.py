"""Finding a topic's records and files by Kafka coordinates or by date, reading only what is needed.

The token chain is ordered by position: per partition, each token's `next_offsets` is at least its
predecessor's. So a binary search over the chain finds the run that read an offset (a few token
reads however long the history), and that run's manifest names the backup file holding the offset
and the partitioned and quarantine files its records went to, with their offset spans: only files
whose span holds the offset are opened (a run that adopted rewound files after a rewind finds them
in the backup folder). A rebuild replaces a date's partitioned and quarantine files; its token lists
the files it removed and its manifest the files it wrote, with the backup files it re-derived from,
so what a key holds now is decided by the newest of the writes and removals that name it. A rewind
that deletes a rebuild's or seal's token leaves its files, the only copy of their records
(docs/protocol.md): its published manifest and its claim still say what it wrote and removed, and
the run that reads rewound offsets again lists the files it replaced in its token (one that could
not read them again adopted them, and their run's manifest, named in their headers, describes them).
A seal does the same with a date's files (`cairn.pipeline.seal`): its manifest says, per folder,
which backup files' offsets its sealed files hold, and each sealed file's header which of them it
holds itself, so a record is found in its sealed file by reading headers and that file.

The CLI and the overview page ask the same questions through `ArchiveIndex`, which reads each
token and manifest at most once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, ClassVar, TypeVar, cast

import fastavro
from pydantic import BaseModel, ValidationError

from cairn.config import TopicConfig
from cairn.datafiles.avro_file import read_header
from cairn.datafiles.file_entry import FileEntry
from cairn.datafiles.seal_writer import FolderResult, SealedFile
from cairn.datafiles.sealed_file import sources_of
from cairn.pipeline.rebuild import day_files, load_attempt
from cairn.pipeline.rebuild import load_claimed as load_rebuild_claim
from cairn.pipeline.seal import load_attempt as load_seal
from cairn.pipeline.seal import load_claimed as load_seal_claim
from cairn.protocol import commit, manifest, rewind, tokens
from cairn.protocol.commit import Claim
from cairn.protocol.manifest import Manifest
from cairn.protocol.tokens import Kind
from cairn.storage.layout import (
    DataFile,
    DataKind,
    legacy_rebuilds_folder,
    link_seq,
    manifests_folder,
    parse_data_key,
)
from cairn.storage.objects import Storage
from cairn.topics_file import LoadResult

F = TypeVar("F", FileEntry, SealedFile)


class NotArchived(LookupError):
    """The archive holds no such record or file; the message says why and what to try."""


@dataclass(frozen=True)
class SealedEntry:
    """A sealed file: the records of one folder, from many backup files and partitions."""

    key: str
    kind: DataKind
    records: int
    bytes: int


@dataclass(frozen=True)
class Located:
    """A data file as the archive's history describes it, and which link committed it."""

    entry: FileEntry | SealedEntry
    by: str
    """`token 12`, `rebuild 3` or `seal 14`."""
    committed_at: datetime

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def kind(self) -> DataKind:
        return self.entry.kind


@dataclass(frozen=True)
class FoundRecord:
    """A record's backup copy and, for topics that parse, where its parsed form went."""

    backup: Located
    record: dict[str, Any]
    output: Located | None
    """The partitioned or quarantine file holding it; None for raw topics or if it is missing."""
    output_record: dict[str, Any] | None


class Publication(BaseModel):
    """A rebuild's or seal's publication: what it removed, and which link committed it."""

    what: ClassVar[str]
    seq: int | None
    """Its token; None once a rewind deleted the token (`attempt_id` then names it)."""
    attempt_id: str | None = None
    created_at: datetime
    removed: list[str]

    @property
    def by(self) -> str:
        """`rebuild 3`, `seal 14`, or `rebuild r-…` for one whose token a rewind deleted."""
        if self.seq is None:
            return f"{self.what} {self.attempt_id} (its token rewound)"
        return f"{self.what} {self.seq}"


class Rebuild(Publication):
    """What a rebuild wrote and removed (a rebuild token, or a link of the `_rebuilds/` chain
    that rebuilds committed to before they joined the token chain)."""

    what = "rebuild"
    dates: list[date]
    sources: list[str]
    files: list[FileEntry]


class Sealing(Publication):
    """What a seal wrote (per folder, with the backup offsets it holds) and removed."""

    what = "seal"
    folders: list[FolderResult]

    def wrote(self, key: str) -> SealedFile | None:
        return next((f for folder in self.folders for f in folder.files if f.key == key), None)

    def holding(self, source: str, partition: int, offset: int) -> list[str]:
        """Its sealed files in the folders that hold `offset` of `source`'s partition."""
        return [
            f.key
            for folder in self.folders
            if any(
                s.source == source and s.partition == partition and s.first <= offset <= s.last
                for s in folder.spans
            )
            for f in folder.files
        ]


class ArchiveIndex:
    """One topic's committed history (its tokens and their manifests), read lazily once."""

    def __init__(self, storage: Storage, topic: str) -> None:
        self.storage, self.topic = storage, topic
        self.seqs = tokens.seqs(storage, topic)
        self._tokens: dict[int, tokens.Token] = {}
        self._manifests: dict[str, Manifest] = {}
        self._rebuilds: list[Rebuild] | None = None
        self._seals: list[Sealing] | None = None

    def token(self, seq: int) -> tokens.Token:
        if seq not in self._tokens:
            self._tokens[seq] = tokens.token_at(self.storage, self.topic, seq)
        return self._tokens[seq]

    def read_so_far(self) -> list[tokens.Token]:
        """The tokens this index has read (those the questions asked so far needed)."""
        return [self._tokens[seq] for seq in sorted(self._tokens)]

    def newest(self) -> tokens.Token | None:
        return self.token(self.seqs[-1]) if self.seqs else None

    def position(self) -> dict[int, int]:
        """The next offset to archive per partition (everything below it is archived)."""
        newest = self.newest()
        return dict(newest.next_offsets) if newest else {}

    def manifest(self, token: tokens.Token) -> Manifest | None:
        """The manifest of the archive run that committed `token` (None for a run that read
        nothing, or another kind of token)."""
        if token.manifest is None or token.kind != "archive":
            return None
        if token.manifest not in self._manifests:
            self._manifests[token.manifest] = manifest.load(self.storage, token.manifest)
        return self._manifests[token.manifest]

    def rebuilds(self) -> list[Rebuild]:
        """Every rebuild of the topic, oldest first: the rebuild tokens, the older chain, and
        those whose token a rewind deleted (their files stay, see `rewound`)."""
        if self._rebuilds is None:
            legacy = self.storage.list_after(legacy_rebuilds_folder(self.topic), "")
            found = [r for key in legacy if (r := _legacy_rebuild(self.storage, key))]
            for seq in self.seqs:
                token = self.token(seq)
                if token.kind != "rebuild" or token.rebuilt is None or token.manifest is None:
                    continue
                found.append(
                    Rebuild(
                        seq=seq,
                        attempt_id=token.attempt_id,
                        created_at=token.created_at,
                        dates=token.rebuilt.dates,
                        sources=token.rebuilt.sources,
                        files=load_attempt(self.storage, token.manifest).files,
                        removed=token.replaces,
                    )
                )
            for key, claim in self.rewound("rebuild"):
                chosen = load_rebuild_claim(self.storage, claim.key)
                written = load_attempt(self.storage, key)
                found.append(
                    Rebuild(
                        seq=None,
                        attempt_id=claim.attempt_id,
                        created_at=written.created_at,
                        dates=chosen.dates,
                        sources=[s.key for s in chosen.sources],
                        files=self._there(written.files),
                        removed=sorted(k for s in chosen.sources for k in s.files),
                    )
                )
            self._rebuilds = sorted(found, key=lambda r: r.created_at)
        return self._rebuilds

    def rewound(self, kind: Kind) -> Iterator[tuple[str, Claim]]:
        """(manifest key, claim) of each rebuild or seal that published (its manifest moved to
        `_manifests/` only then) and whose token a rewind deleted since. A rewind takes back
        positions, not what such a commit replaced, so its files stay, the only copy of their
        records below the position (docs/protocol.md); the finder and the audit count them while
        they are there (a run that read their offsets again replaced some, and a rewind since may
        have deleted the token that said so)."""
        standing = {self.token(seq).attempt_id for seq in self.seqs}
        folder = manifests_folder(self.topic)
        for key in self.storage.list_after(folder, "", beginning=commit.id_prefix(kind)):
            attempt_id = key.rsplit("/", 1)[-1].removesuffix(".json")
            if attempt_id in standing:
                continue
            claim = commit.load_claim(self.storage, self.topic, attempt_id)
            if claim is not None and claim.kind == kind:
                yield key, claim

    def _there(self, files: list[F]) -> list[F]:
        """Those of a rewound publication's `files` still in the data folders (`rewound`)."""
        return [f for f in files if self.storage.exists(f.key)]

    def covering(self, partition: int, offset: int) -> tokens.Token | None:
        """The token whose run read past `offset` first: the oldest with next offset > it."""
        lo, hi = 0, len(self.seqs)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.token(self.seqs[mid]).next_offsets.get(partition, 0) > offset:
                hi = mid
            else:
                lo = mid + 1
        return self.token(self.seqs[lo]) if lo < len(self.seqs) else None

    def backup_files(self, partition: int, start: int, end: int) -> Iterator[Located]:
        """Backup files of `partition` holding offsets in `[start, end)`, in offset order."""
        first = self.covering(partition, start)
        if first is None or start >= end:
            return
        for seq in self.seqs[self.seqs.index(first.seq) :]:
            token = self.token(seq)
            found = self.manifest(token)
            entries = [] if found is None else list(found.files)
            if partition in token.adopted:
                entries += self._adopted(partition, *token.adopted[partition])
            for e in sorted(entries, key=lambda e: e.first_offset):
                if (
                    e.kind == "backup"
                    and e.partition == partition
                    and e.last_offset >= start
                    and e.first_offset < end
                ):
                    kept = " (adopted)" if _adopts(token, e) else ""
                    yield Located(e, f"token {token.seq}{kept}", token.created_at)
            if token.next_offsets.get(partition, 0) >= end:
                return

    def _adopted(self, partition: int, first: int, end: int) -> list[FileEntry]:
        """The rewound backup files a run kept for `[first, end)` of `partition`."""
        found = rewind.backups_from(self.storage, self.topic, partition, first)
        entries = (
            rewind.entry_of(self.storage, f)
            for f in found
            if f.first_offset is not None and f.first_offset < end
        )
        return [e for e in entries if e is not None]

    def seals(self) -> list[Sealing]:
        """Every seal of the topic, oldest first (and those whose token a rewind deleted)."""
        if self._seals is None:
            found = []
            for seq in self.seqs:
                token = self.token(seq)
                if token.kind == "seal" and token.manifest is not None:
                    found.append(
                        Sealing(
                            seq=seq,
                            attempt_id=token.attempt_id,
                            created_at=token.created_at,
                            folders=load_seal(self.storage, token.manifest).folders,
                            removed=token.replaces,
                        )
                    )
            for key, claim in self.rewound("seal"):
                written = load_seal(self.storage, key)
                found.append(
                    Sealing(
                        seq=None,
                        attempt_id=claim.attempt_id,
                        created_at=written.created_at,
                        folders=[
                            f.model_copy(update={"files": self._there(f.files)})
                            for f in written.folders
                        ],
                        removed=sorted(load_seal_claim(self.storage, claim.key).versions()),
                    )
                )
            self._seals = sorted(found, key=lambda s: s.created_at)
        return self._seals

    def entry(self, key: str) -> Located | None:
        """What the history says `key` holds now; None if nothing committed it, or a later
        rebuild, seal or re-read of rewound offsets removed it."""
        named = parse_data_key(key)
        if named is None or named.topic != self.topic:
            return None
        events: list[tuple[datetime, Located | None]] = []
        if named.partition is not None and named.first_offset is not None:  # not sealed
            token = self.covering(named.partition, named.first_offset)
            found = self.manifest(token) if token else None
            written = [e for e in found.files if e.key == key] if found else []
            if token is not None and written:
                at = token.created_at
                events.append((at, Located(written[0], f"token {token.seq}", at)))
            elif token is not None and key in token.replaces:  # a rewound file, read again
                events.append((token.created_at, None))
            elif token is not None and _adopts(token, named):
                kept = rewind.entry_of(self.storage, named)
                at = token.created_at
                events += [(at, Located(kept, f"token {token.seq} (adopted)", at))] if kept else []
        if named.kind != "backup":  # rebuilds and seals replace partitioned and quarantine files
            for r in self.rebuilds():
                if rebuilt := next((e for e in r.files if e.key == key), None):
                    events.append((r.created_at, Located(rebuilt, r.by, r.created_at)))
                elif key in r.removed:
                    events.append((r.created_at, None))
            for sealing in self.seals():
                if sealed := sealing.wrote(key):
                    entry = SealedEntry(key, named.kind, sealed.records, sealed.bytes)
                    events.append(
                        (sealing.created_at, Located(entry, sealing.by, sealing.created_at))
                    )
                elif key in sealing.removed:
                    events.append((sealing.created_at, None))
        return max(events, key=lambda ev: ev[0])[1] if events else None

    def find(self, partition: int, offset: int) -> FoundRecord:
        """The record at `partition`/`offset`: its backup copy, then its partitioned or
        quarantine copy. Raises NotArchived saying why when the archive does not hold it."""
        where = f"topic {self.topic!r} partition {partition} offset {offset}"
        position = self.position()
        if offset >= position.get(partition, 0):
            raise NotArchived(
                f"{where} is not archived yet: the archive holds partition {partition} below "
                f"offset {position.get(partition, 0)} (token {self.seqs[-1] if self.seqs else '—'})"
            )
        for backup in self.backup_files(partition, offset, offset + 1):
            record = next(
                (r for r in read_records(self.storage, backup.key) if r["offset"] >= offset),
                None,
            )
            if record is not None and record["offset"] == offset:
                output, output_record = self._output(backup, partition, offset)
                return FoundRecord(backup, record, output, output_record)
        token = self.covering(partition, offset)
        gaps = [g for g in token.gaps if g.partition == partition] if token else []
        if token and any(g.from_offset <= offset < g.to_offset for g in gaps):
            raise NotArchived(
                f"{where} was lost to retention before archiving (a gap that "
                f"token {token.seq} records, accepted by accept_gaps)"
            )
        raise NotArchived(
            f"{where}: no archived record has this offset (token "
            f"{token.seq if token else '—'} read past it); Kafka offsets have holes: "
            "transaction markers, aborted transactions and compacted records"
        )

    def _output(
        self, backup: Located, partition: int, offset: int
    ) -> tuple[Located | None, dict[str, Any] | None]:
        """The partitioned or quarantine file (and row) holding the record now."""
        token = self.covering(partition, offset)
        found = self.manifest(token) if token else None
        keys = {e.key for e in found.files if e.kind != "backup"} if found else set()
        named = parse_data_key(backup.key)
        if token is not None and named is not None and _adopts(token, named):
            kept = rewind.written_by(self.storage, named)
            keys |= {e.key for e in kept.files if e.kind != "backup"} if kept else set()
        keys |= {e.key for r in self.rebuilds() if backup.key in r.sources for e in r.files}
        for sealing in self.seals():
            keys |= set(sealing.holding(backup.key, partition, offset))
        for key in sorted(keys):
            here = self.entry(key)
            if here is None or not self._may_hold(here, backup.key, partition, offset):
                continue
            row = _row_at(self.storage, here, partition, offset)
            if row is not None:
                return here, row
        return None, None

    def _may_hold(self, here: Located, source: str, partition: int, offset: int) -> bool:
        """Whether the file's offsets (a sealed file: its header's) take in `offset`."""
        e = here.entry
        if isinstance(e, FileEntry):
            return e.partition == partition and e.first_offset <= offset <= e.last_offset
        with self.storage.open_read(e.key) as f:
            spans = sources_of(read_header(f).metadata) or []
        return any(
            s.source == source and s.partition == partition and s.first <= offset <= s.last
            for s in spans
        )


def _adopts(token: tokens.Token, f: DataFile | FileEntry) -> bool:
    """Whether `token` kept run file `f` as it was: rewound offsets it could not read again."""
    first = f.first_offset
    span = token.adopted.get(f.partition) if f.partition is not None else None
    return span is not None and first is not None and span[0] <= first < span[1]


def _legacy_rebuild(storage: Storage, key: str) -> Rebuild | None:
    if link_seq(key) is None:
        return None
    try:
        return Rebuild.model_validate_json(storage.read(key))
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def read_records(storage: Storage, key: str) -> Iterator[dict[str, Any]]:
    """The records of one Avro data file, streamed."""
    with storage.open_read(key) as f:
        yield from cast(Iterator[dict[str, Any]], fastavro.reader(f))


def coordinates(kind: str, row: dict[str, Any]) -> tuple[int, int]:
    """(partition, offset) of a row of a data file of `kind`."""
    if kind == "partitioned":
        return row["_kafka_partition"], row["_kafka_offset"]
    return row["partition"], row["offset"]


def date_files(storage: Storage, cfg: TopicConfig, day: date) -> list[DataFile]:
    """A date's partitioned files (folders of the topic's path format) and quarantine files."""
    return day_files(storage, cfg.topic_name, cfg.path_format, day)


def quarantine_records(storage: Storage, keys: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, record) of each quarantined record in the files `keys`, file by file."""
    for key in keys:
        for row in read_records(storage, key):
            yield key, row


def _row_at(storage: Storage, here: Located, partition: int, offset: int) -> dict[str, Any] | None:
    """The file's row of `partition`/`offset`. A run's or rebuild's file holds one partition in
    offset order, so its scan stops past the offset; a sealed file is read through."""
    ordered = isinstance(here.entry, FileEntry)
    for row in read_records(storage, here.key):
        p, o = coordinates(here.kind, row)
        if p == partition and o == offset:
            return row
        if ordered and o > offset:
            return None
    return None


def archived_topics(storage: Storage) -> list[str]:
    """Topics with a token chain under this root (what topic patterns match without Kafka)."""
    folders = storage.children("_tokens/")
    return sorted(f.rstrip("/").rsplit("/", 1)[-1] for f in folders if f.endswith("/"))


def configured_topics(
    loaded: LoadResult, storage_for: Callable[[TopicConfig], Storage]
) -> LoadResult:
    """Every concrete topic of the topics files: exact entries, and the topics that pattern
    entries match among those archived under their roots (`storage_for` opens a root)."""
    entries = loaded.topics
    names: set[str] = set()
    for root in {e.archive_root for e in entries if e.pattern is not None}:
        cfg = next(e for e in entries if e.archive_root == root)
        names |= set(archived_topics(storage_for(cfg)))
    return loaded.resolve(names)
