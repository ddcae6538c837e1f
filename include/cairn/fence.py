"""The fence: of all the attempts that overlap on a topic, exactly one can change the archive.

Cairn keeps two histories per topic, each a chain of links `<seq:012d>.json` created with an
atomic create-if-absent: archive runs (`_tokens/<topic>/`, the offset tokens) and rebuild
operations (`_rebuilds/<topic>/`). Link `n` is planned from link `n - 1`, the newest. In the
Iceberg/Delta spirit an attempt at link `n`:

1. **claims** `n`: it creates `_claims/<topic>/<chain>/<n>-<k>.json` with the next free `k`
   (create-if-absent, so two planners never share a `k`). The newest claim on `n` is the live
   one; claiming fences out every older claim on `n`.
2. **checks** before every step that changes something (clean, Spark, verify, commit) that its
   claim is still live: link `n - 1` is still the newest (the same object, not one recreated
   after a rewind) and no newer claim on `n` exists. A stale plan (an old run cleared and re-run
   from its XCom, a backfill beside a scheduled run, a second deployment) fails fast here.
3. **stages** its files under its own `_attempts/<topic>/<attempt>/`, never in the data folders,
   so a fenced-out attempt (a zombie whose Spark job still writes) cannot touch the archive.
4. **commits** by creating link `n`, which names the attempt; only that attempt's staged files
   are then published into the data folders (`cairn.staging`).

Check and create are two requests, so an attempt fenced out a moment after its last check can
still win link `n`. That is safe because nothing deletes an attempt's staged files while link
`n` is undecided: they are discarded only once link `n` names another attempt or can no longer be
created (its base was rewound).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, ValidationError

from cairn.errors import PermanentError
from cairn.layout import (
    Chain,
    chain_folder,
    chain_key,
    claim_key,
    claim_numbers,
    claims_folder,
    link_seq,
)
from cairn.storage import ObjectExists, Storage

_CLAIM_TRIES = 20
_PREFIX: dict[str, str] = {"archive": "a", "rebuild": "r"}


class Fenced(PermanentError):
    """This attempt's claim is no longer live: another attempt planned, claimed or committed."""


class CorruptLink(PermanentError):
    """A link object is unreadable; it is never skipped, because that would move the position."""


class Link(BaseModel):
    """What the fence reads of a link (a token or a rebuild manifest)."""

    model_config = ConfigDict(extra="ignore")

    seq: PositiveInt
    created_at: datetime
    attempt_id: str | None = None


class Claim(BaseModel):
    """One attempt's claim on link `seq` of a chain, planned from link `base_seq` (0: none)."""

    topic: str
    chain: Literal["archive", "rebuild"]
    seq: PositiveInt
    k: PositiveInt
    attempt_id: str
    run_id: str
    base_seq: NonNegativeInt
    base_created_at: datetime | None
    created_at: datetime

    @property
    def key(self) -> str:
        return claim_key(self.topic, self.chain, self.seq, self.k)

    @property
    def label(self) -> str:
        return f"topic {self.topic!r} {self.chain} attempt {self.attempt_id} (link {self.seq})"


def attempt_numbers(attempt_id: str) -> tuple[Chain, int] | None:
    """(chain, seq) of an attempt id made by `claim`, or None for anything else."""
    parts = attempt_id.split("-")
    chains = {v: c for c, v in _PREFIX.items()}
    if len(parts) != 4 or parts[0] not in chains or not parts[1].isdigit():
        return None
    return chains[parts[0]], int(parts[1])  # type: ignore[return-value]


def link_seqs(storage: Storage, topic: str, chain: Chain) -> list[int]:
    """The seqs of a chain's links, oldest first."""
    found = (link_seq(key) for key in storage.children(chain_folder(topic, chain)))
    return sorted(seq for seq in found if seq is not None)


def read_link(storage: Storage, topic: str, chain: Chain, seq: int) -> Link | None:
    """Link `seq`, or None if it does not exist."""
    key = chain_key(topic, chain, seq)
    try:
        raw = storage.read(key)
    except FileNotFoundError:
        return None
    try:
        link = Link.model_validate_json(raw)
    except (ValidationError, ValueError) as err:
        raise CorruptLink(f"{key} is unreadable: {err}") from None
    if link.seq != seq:
        raise CorruptLink(f"{key} claims seq {link.seq}")
    return link


def newest_link(storage: Storage, topic: str, chain: Chain) -> Link | None:
    seqs = link_seqs(storage, topic, chain)
    return read_link(storage, topic, chain, seqs[-1]) if seqs else None


def claim(
    storage: Storage,
    topic: str,
    chain: Chain,
    base: Link | None,
    run_id: str,
    body: Callable[[Claim], bytes],
) -> Claim:
    """Claim the link after `base` (the newest link the attempt planned from).

    `body(claim)` is what the claim object holds: the attempt's whole plan, so the later steps
    (and the Spark job) read it by reference instead of carrying it in arguments.
    """
    seq = (base.seq if base else 0) + 1
    for _ in range(_CLAIM_TRIES):
        k = max(_claims_on(storage, topic, chain, seq), default=0) + 1
        made = Claim(
            topic=topic,
            chain=chain,
            seq=seq,
            k=k,
            attempt_id=f"{_PREFIX[chain]}-{seq:012d}-{k:06d}-{secrets.token_hex(3)}",
            run_id=run_id,
            base_seq=base.seq if base else 0,
            base_created_at=base.created_at if base else None,
            created_at=datetime.now(UTC),
        )
        try:
            storage.create(made.key, body(made))
            return made
        except ObjectExists:
            continue  # another planner took this k at the same moment: take the next one
    raise Fenced(f"topic {topic!r}: could not claim {chain} link {seq} in {_CLAIM_TRIES} tries")


def check_live(storage: Storage, mine: Claim) -> None:
    """Raise Fenced unless `mine` is still the live claim on its link."""
    newest = newest_link(storage, mine.topic, mine.chain)
    now = (newest.seq, newest.created_at) if newest else (0, None)
    if now != (mine.base_seq, mine.base_created_at):
        found = f"link {newest.seq}" if newest else "no link"
        raise Fenced(
            f"{mine.label} is stale: it was planned from link {mine.base_seq} but the newest is "
            f"now {found} (another attempt committed, or the topic was rewound). Nothing of this "
            "attempt was published; the next run plans afresh"
        )
    newer = _claims_on(storage, mine.topic, mine.chain, mine.seq)
    if max(newer, default=0) > mine.k:
        raise Fenced(
            f"{mine.label} was fenced out by a newer attempt on the same link (claim "
            f"{max(newer)} > {mine.k}: a concurrent or re-planned run). Nothing of this attempt "
            "was published"
        )


def commit(storage: Storage, mine: Claim, body: bytes) -> bool:
    """Create link `mine.seq` naming this attempt; True if created now, False if it already was.

    "The link is mine" is success, so a retry after a lost response (or after a later step
    failed) finishes instead of reporting a conflict.
    """
    if decided_for(storage, mine.topic, mine.chain, mine.seq) == mine.attempt_id:
        return False
    check_live(storage, mine)
    try:
        storage.create(chain_key(mine.topic, mine.chain, mine.seq), body)
    except ObjectExists:
        if decided_for(storage, mine.topic, mine.chain, mine.seq) == mine.attempt_id:
            return False
        raise Fenced(
            f"{mine.label}: another attempt committed link {mine.seq} first; nothing of this "
            "attempt was published"
        ) from None
    return True


def decided_for(storage: Storage, topic: str, chain: Chain, seq: int) -> str | None:
    """The attempt link `seq` names, or None if the link does not exist."""
    link = read_link(storage, topic, chain, seq)
    return None if link is None else link.attempt_id


Fate = Literal["committed", "dead", "open"]


def fate(storage: Storage, topic: str, attempt_id: str) -> Fate:
    """Whether an attempt's link names it, can never name it, or may still (`open`)."""
    numbers = attempt_numbers(attempt_id)
    if numbers is None:
        return "open"  # not made by `claim`: not ours to judge
    chain, seq = numbers
    seqs = link_seqs(storage, topic, chain)
    top = seqs[-1] if seqs else 0
    if seq > top + 1:
        return "dead"  # planned from a link that was rewound away
    if seq == top + 1:
        return "open"
    return "committed" if decided_for(storage, topic, chain, seq) == attempt_id else "dead"


def _claims_on(storage: Storage, topic: str, chain: Chain, seq: int) -> list[int]:
    """The claim numbers `k` on link `seq` (one listing that starts at `seq`'s claims)."""
    keys = storage.list_after(claims_folder(topic, chain), f"{seq - 1:012d}-999999.json")
    found = (claim_numbers(key) for key in keys)
    return [n[1] for n in found if n is not None and n[0] == seq]
