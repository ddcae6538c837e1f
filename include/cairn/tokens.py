"""Offset tokens: the only record of how far a topic has been archived.

Token `n` of a topic is the object `_tokens/<topic>/<n:012d>.json`; the newest one is the current
position. A run commits by creating token `n + 1` with a create-if-absent, so of two racing runs
exactly one wins and a failed run leaves the position untouched. Deleting the newest tokens
(`rewind`) moves the position back; the next run's cleanup then removes the output they covered.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError

from cairn.layout import token_key, token_seq
from cairn.storage import ObjectExists, Storage


class TokenError(Exception):
    """Base class for token problems that stop a run."""


class CorruptToken(TokenError):
    """A token object is unreadable; it is never skipped, because that would move the position."""


class CommitConflict(TokenError):
    """Another run (or a rewind) changed the position after this run was planned."""


class RewindRefused(TokenError):
    """The rewind would make Cairn re-read records Kafka no longer has."""


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


class Token(BaseModel):
    """The position after a committed run: read everything below `next_offsets` next time.

    `previous_offsets` is the `next_offsets` of the token this run was planned from (empty for the
    first run); commit compares it with the newest token to detect rewinds and racing runs.
    Partition keys are strings in JSON and ints here.
    """

    seq: PositiveInt
    topic: str
    generation: PositiveInt
    next_offsets: dict[NonNegativeInt, NonNegativeInt]
    previous_offsets: dict[NonNegativeInt, NonNegativeInt] = Field(default_factory=dict)
    counts: Counts = Field(default_factory=Counts)
    manifest: str | None = None
    run_id: str
    created_at: datetime
    planned_at: datetime
    gaps: list[Gap] = Field(default_factory=list)


def next_seq(prev: Token | None) -> int:
    return 1 if prev is None else prev.seq + 1


def newest(storage: Storage, topic: str) -> Token | None:
    """The current position; None if nothing was ever committed (or everything was rewound)."""
    seqs = _seqs(storage, topic)
    return _load(storage, topic, seqs[-1]) if seqs else None


def list_tokens(storage: Storage, topic: str) -> list[Token]:
    """All tokens of `topic`, oldest first."""
    return [_load(storage, topic, seq) for seq in _seqs(storage, topic)]


def commit(storage: Storage, token: Token) -> None:
    """Make `token` the newest, only if the position is still the one the run was planned from.

    The pre-check catches a rewind or another run that committed meanwhile; the atomic create
    catches a run that commits the same seq at the same moment.
    """
    current = newest(storage, token.topic)
    planned_from = token.seq - 1
    if (current.seq if current else 0) != planned_from or (
        current is not None and current.next_offsets != token.previous_offsets
    ):
        found = f"token {current.seq}" if current else "no token"
        raise CommitConflict(
            f"topic {token.topic!r}: cannot commit token {token.seq}: the run was planned from "
            f"token {planned_from} but the newest is now {found} (another run committed or the "
            "topic was rewound); this attempt's output is removed by the next run's cleanup"
        )
    try:
        storage.create(token_key(token.topic, token.seq), token.model_dump_json(indent=2).encode())
    except ObjectExists:
        raise CommitConflict(
            f"topic {token.topic!r}: token {token.seq} was committed by another run at the same "
            "time; this attempt's output is removed by the next run's cleanup"
        ) from None


def rewind(
    storage: Storage,
    topic: str,
    *,
    low_watermarks: Mapping[int, int] | None,
    count: int | None = None,
    to_seq: int | None = None,
    before: datetime | None = None,
) -> list[str]:
    """Delete the newest tokens so the next run re-reads from the newest remaining one.

    Give exactly one of: `count` (delete that many), `to_seq` (keep tokens up to it; 0 deletes
    all), `before` (delete tokens created at or after it). Deleting every token is allowed: the
    next run starts over under the topic's new-partition policy and its cleanup removes the
    topic's whole archive first, so it is only sound with the "earliest" policy.

    `low_watermarks` (Kafka's low watermark per partition) guards against rewinding past
    retention: the rewind is refused, deleting nothing, if an archived partition would have to be
    re-read from an offset Kafka no longer has (from 0 if the remaining token does not know it).
    Pass None only to skip that check knowingly, e.g. when Kafka is unreachable.

    Tokens are deleted newest first, so a crash midway leaves a valid, older newest token.
    Returns the deleted keys.
    """
    if sum(arg is not None for arg in (count, to_seq, before)) != 1:
        raise ValueError("rewind needs exactly one of count, to_seq, before")
    seqs = _seqs(storage, topic)
    if count is not None:
        if not 0 <= count <= len(seqs):
            raise ValueError(f"topic {topic!r}: cannot rewind {count} of {len(seqs)} tokens")
        keep = len(seqs) - count
    elif to_seq is not None:
        if to_seq != 0 and to_seq not in seqs:
            raise ValueError(f"topic {topic!r}: no token {to_seq} to rewind to")
        keep = sum(seq <= to_seq for seq in seqs)
    else:
        keep = len(seqs)
        while keep and _load(storage, topic, seqs[keep - 1]).created_at >= before:
            keep -= 1
    doomed = seqs[keep:]
    if not doomed:
        return []
    if low_watermarks is not None:
        target = _load(storage, topic, seqs[keep - 1]) if keep else None
        archived = _newest_readable(storage, topic, doomed)
        _check_rereadable(topic, target, archived, low_watermarks)
    deleted = []
    for seq in reversed(doomed):
        key = token_key(topic, seq)
        storage.delete(key)
        deleted.append(key)
    return deleted


def _newest_readable(storage: Storage, topic: str, seqs: list[int]) -> set[int]:
    """Partitions the newest readable of `seqs` knows: a superset of the older tokens'."""
    for seq in reversed(seqs):
        try:
            return set(_load(storage, topic, seq).next_offsets)
        except CorruptToken:
            continue
    return set()


def _check_rereadable(
    topic: str, target: Token | None, archived: set[int], low: Mapping[int, int]
) -> None:
    known = target.next_offsets if target else {}
    for partition in sorted(set(known) | archived):
        start = known.get(partition, 0)
        where = f"token {target.seq}" if target and partition in known else "the beginning"
        if partition not in low:
            raise RewindRefused(
                f"topic {topic!r} partition {partition}: rewinding to {where} would re-read a "
                "partition Kafka no longer has"
            )
        if start < low[partition]:
            raise RewindRefused(
                f"topic {topic!r} partition {partition}: rewinding to {where} would re-read "
                f"offsets [{start}, {low[partition]}) that Kafka has already deleted (retention); "
                "nothing was deleted. To re-derive archived output, rebuild the affected dates "
                "from the backup with the rebuild DAG instead (README, Operating)"
            )


def _seqs(storage: Storage, topic: str) -> list[int]:
    folder = token_key(topic, 0).rsplit("/", 1)[0] + "/"
    seqs = (token_seq(key) for key in storage.list(folder))
    return sorted(seq for seq in seqs if seq is not None)


def _load(storage: Storage, topic: str, seq: int) -> Token:
    key = token_key(topic, seq)
    try:
        token = Token.model_validate_json(storage.read(key))
    except (ValidationError, ValueError) as err:
        raise CorruptToken(f"token {key} is unreadable: {err}") from None
    if token.topic != topic or token.seq != seq:
        raise CorruptToken(f"token {key} claims topic {token.topic!r} seq {token.seq}")
    return token
