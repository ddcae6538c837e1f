"""Offset tokens: a topic's chain of commits, and the only record of how far it is archived.

Token `n` of a topic is the object `_tokens/<topic>/<n:012d>.json`. Every change to a topic's data
folders is one token, created by the one commit site (`cairn.protocol.commit`): an archive run
(`kind: archive`) moves the position; a rebuild (`rebuild`) or a seal replaces files and carries the
position over unchanged. So the newest token is always the position, and deleting the newest
tokens (a rewind, `cairn.protocol.rewind`) moves it back. Each token names the token it was
committed on (`base_created_at`), so a token left above a missing or replaced one is recognised as
such.

This module is the token's format and how to read it; `cairn.protocol.commit` decides which token
counts.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError

from cairn.errors import PermanentError
from cairn.protocol.format_version import Versioned, naming
from cairn.storage.layout import chain_folder, link_seq, token_key
from cairn.storage.objects import Storage

Kind = Literal["archive", "rebuild", "seal"]
"""What a commit did: read Kafka (and moved the position), or replaced files below it."""


class CorruptToken(PermanentError):
    """A token object is unreadable; it is never skipped, because that would move the position."""


class Gap(BaseModel):
    """Offsets `[from_offset, to_offset)` of a partition lost to retention and knowingly skipped."""

    partition: NonNegativeInt
    from_offset: NonNegativeInt
    to_offset: NonNegativeInt


class Counts(BaseModel):
    """What a run read and wrote."""

    read: NonNegativeInt = 0
    backup: NonNegativeInt = 0
    partitioned: NonNegativeInt = 0
    quarantined: NonNegativeInt = 0
    bytes: NonNegativeInt = 0
    files: NonNegativeInt = 0


class Rebuilt(BaseModel):
    """What a rebuild token re-derived (its files are in its attempt's manifest)."""

    dates: list[date]
    snapshot_seq: NonNegativeInt
    """The newest token when the rebuild selected its files (it re-derived records below it)."""
    sources: list[str]
    """The backup files it re-parsed."""


class Sealed(BaseModel):
    """What a seal token did: the date whose files it merged (its proof is in the date folder's
    `_SEALED` and in the attempt's manifest)."""

    date: date
    files_before: NonNegativeInt
    files_after: NonNegativeInt
    partitioned: NonNegativeInt
    quarantined: NonNegativeInt
    checksum: str


class Payload(BaseModel):
    """What a kind's commit says on its token besides the chain (`Token` fields of the same
    names); each kind of attempt has its own, so a token field is set only by the kind that
    means it."""

    generation: PositiveInt = 1
    manifest: str | None = None


class ArchivePayload(Payload):
    """An archive run's token fields: what it read and wrote, and what it skipped or kept."""

    counts: Counts = Field(default_factory=Counts)
    topic_id: str | None = None
    planned_at: datetime | None = None
    gaps: list[Gap] = Field(default_factory=list)
    adopted: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]] = Field(
        default_factory=dict
    )


class RebuildPayload(Payload):
    rebuilt: Rebuilt


class SealPayload(Payload):
    sealed: Sealed


class Token(Versioned):
    """One commit: the position after it, and what it did to the data folders.

    Partition keys are strings in JSON and ints here. `previous_offsets` is the position the
    commit's attempt planned from; `adds` and `replaces` are its publication
    (`cairn.protocol.commit`).
    """

    seq: PositiveInt
    topic: str
    kind: Kind = "archive"
    next_offsets: dict[NonNegativeInt, NonNegativeInt]
    previous_offsets: dict[NonNegativeInt, NonNegativeInt] = Field(default_factory=dict)
    base_created_at: datetime | None = None
    """`created_at` of token `seq - 1` when this one was created on it (None: the first token,
    or a token written before Cairn recorded it)."""
    generation: PositiveInt = 1
    counts: Counts = Field(default_factory=Counts)
    manifest: str | None = None
    """The attempt's manifest: what it read and wrote, file by file."""
    attempt_id: str | None = None
    """The attempt (`cairn.protocol.commit`) whose staged files this token publishes."""
    adds: dict[str, NonNegativeInt] = Field(default_factory=dict)
    """Keys (and sizes) of the files this token put into the data folders."""
    replaces: list[str] = Field(default_factory=list)
    """Keys of the files it removed from them (rewound, rebuilt or sealed files)."""
    adopted: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]] = Field(
        default_factory=dict
    )
    """Offsets `[from, to)` per partition that a rewind left archived and this run kept rather
    than re-read (Kafka no longer holds them, the topic is compacted, or they are sealed)."""
    topic_id: str | None = None
    """Kafka's id of the topic read, so a topic deleted and recreated is never taken for it."""
    run_id: str
    created_at: datetime
    planned_at: datetime | None = None
    gaps: list[Gap] = Field(default_factory=list)
    rebuilt: Rebuilt | None = None
    sealed: Sealed | None = None


def read(storage: Storage, topic: str, seq: int) -> Token | None:
    """Token `seq`, or None if it does not exist (CorruptToken if unreadable)."""
    key = token_key(topic, seq)
    try:
        raw = storage.read(key)
    except FileNotFoundError:
        return None
    try:
        with naming(key):
            token = Token.model_validate_json(raw)
    except (ValidationError, ValueError) as err:
        raise CorruptToken(f"token {key} is unreadable: {err}") from None
    if token.topic != topic or token.seq != seq:
        raise CorruptToken(f"token {key} claims topic {token.topic!r} seq {token.seq}")
    return token


def token_at(storage: Storage, topic: str, seq: int) -> Token:
    """Token `seq` of `topic` (CorruptToken if unreadable, FileNotFoundError if absent)."""
    token = read(storage, topic, seq)
    if token is None:
        raise FileNotFoundError(token_key(topic, seq))
    return token


def seqs(storage: Storage, topic: str, after: int = 0) -> list[int]:
    """The seqs of the topic's tokens above `after`, oldest first: one listing that starts at
    `after`, so asking for the newest few costs the same however long the chain is."""
    keys = storage.list_after(chain_folder(topic), f"{after:012d}.json")
    return sorted(seq for seq in map(link_seq, keys) if seq is not None and seq > after)


def list_tokens(storage: Storage, topic: str) -> list[Token]:
    """All tokens of `topic`, oldest first (the whole chain: for people, never for a run)."""
    return [token_at(storage, topic, seq) for seq in seqs(storage, topic)]
