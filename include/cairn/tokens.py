"""Offset tokens: the only record of how far a topic has been archived.

Token `n` of a topic is the object `_tokens/<topic>/<n:012d>.json`; the newest one is the current
position. Tokens are the archive chain of `cairn.fence`: a run claims token `n + 1`, and commits
by creating it with a create-if-absent, so of overlapping runs exactly one wins and a failed run
leaves the position untouched. Deleting the newest tokens (`rewind`) moves the position back; the
next run's cleanup then removes the output they covered.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError

from cairn import fence
from cairn.errors import PermanentError
from cairn.layout import token_key
from cairn.storage import Storage


class CorruptToken(PermanentError):
    """A token object is unreadable; it is never skipped, because that would move the position."""


class RewindRefused(PermanentError):
    """The rewind would lose records: Kafka can no longer return some of what it would re-read."""


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
    attempt_id: str | None = None
    """The attempt (`cairn.fence`) whose staged files this token publishes."""
    topic_id: str | None = None
    """Kafka's id of the topic read, so a topic deleted and recreated is never taken for it."""
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


def token_at(storage: Storage, topic: str, seq: int) -> Token:
    """Token `seq` of `topic` (CorruptToken if unreadable, FileNotFoundError if absent)."""
    return _load(storage, topic, seq)


def list_tokens(storage: Storage, topic: str) -> list[Token]:
    """All tokens of `topic`, oldest first."""
    return [_load(storage, topic, seq) for seq in _seqs(storage, topic)]


def commit(storage: Storage, token: Token, claim: fence.Claim) -> bool:
    """Make `token` the newest if `claim` is still live; True if created now, False if this
    attempt had already committed it (a retry). Raises `fence.Fenced` if another attempt won."""
    if (token.seq, token.attempt_id) != (claim.seq, claim.attempt_id):
        raise ValueError(f"token {token.seq} does not belong to {claim.label}")
    return fence.commit(storage, claim, token.model_dump_json(indent=2).encode())


def rewind(
    storage: Storage,
    topic: str,
    *,
    low_watermarks: Mapping[int, int] | None,
    compacted: bool = False,
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
    A `compacted` topic (`cleanup.policy` with `compact`) is refused whenever the rewound runs
    read anything: compaction may have removed records they archived, so a re-read would lose
    them. Pass None only to skip these checks knowingly, e.g. when Kafka is unreachable.

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
        if compacted and any(_read_anything(storage, topic, seq) for seq in doomed):
            raise RewindRefused(
                f"topic {topic!r} is compacted (cleanup.policy=compact): re-reading the rewound "
                "runs could return fewer records than they archived, and cleanup would delete "
                "the only copy of the rest; nothing was deleted. Rebuild the affected dates from "
                "the backup instead (README, Operating)"
            )
    deleted = []
    for seq in reversed(doomed):
        key = token_key(topic, seq)
        storage.delete(key)
        deleted.append(key)
    return deleted


def _read_anything(storage: Storage, topic: str, seq: int) -> bool:
    try:
        return _load(storage, topic, seq).counts.read > 0
    except CorruptToken:
        return True


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
    return fence.link_seqs(storage, topic, "archive")


def _load(storage: Storage, topic: str, seq: int) -> Token:
    key = token_key(topic, seq)
    try:
        token = Token.model_validate_json(storage.read(key))
    except (ValidationError, ValueError) as err:
        raise CorruptToken(f"token {key} is unreadable: {err}") from None
    if token.topic != topic or token.seq != seq:
        raise CorruptToken(f"token {key} claims topic {token.topic!r} seq {token.seq}")
    return token
