"""An attempt's life, once for every kind: claim, work (each step first checks the claim is
live), save what the work staged, then commit or be discarded.

Archive runs, rebuilds and seals are kinds of one attempt, as pyiceberg's updates are kinds of one
transaction. A kind supplies only what differs: what its claim stores (a `Claimed` model: the
plan or selection the later steps and the Spark job read by reference), what its Spark job saves
(a `Versioned` attempt manifest), and, when it commits, the `Change` its result makes with its
typed token payload (`cairn.protocol.tokens.Payload`). `Attempts` does the rest through
`cairn.protocol.commit`, the one commit site; an attempt refused or fenced there is discarded
(`cairn.protocol.leftovers.refused`). docs/protocol.md describes the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from pydantic import BaseModel

from cairn.protocol import commit, format_version, leftovers
from cairn.protocol.commit import Change, Claim, Outside
from cairn.protocol.format_version import Versioned
from cairn.protocol.tokens import Kind, Token
from cairn.storage.layout import manifest_key
from cairn.storage.objects import Storage


class Claimed(BaseModel):
    """What an attempt's claim object holds: its claim, then the kind's plan or selection."""

    claim: Claim

    @property
    def attempt_id(self) -> str:
        return self.claim.attempt_id

    @property
    def manifest_key(self) -> str:
        """Where the attempt's manifest is staged, and published when it commits."""
        return manifest_key(self.claim.topic, self.claim.attempt_id)

    def staged(self, storage: Storage) -> Storage:
        """Where this attempt's files wait until its token commits."""
        return commit.staged(storage, self.claim)

    def check_live(self, storage: Storage) -> None:
        """Raise Fenced or Conflict unless the attempt may still commit: every step asks first,
        so a stale attempt fails fast instead of touching the archive."""
        commit.check_live(storage, self.claim)


P = TypeVar("P", bound=Claimed)
R = TypeVar("R", bound=Versioned)


@dataclass(frozen=True)
class Attempts(Generic[P, R]):
    """The life of one kind's attempts: `claimed` is what its claim stores, `saved` its manifest;
    an unreadable manifest raises `unreadable` (naming it `what`)."""

    kind: Kind
    claimed: type[P]
    saved: type[R]
    unreadable: type[Exception]
    what: str

    def claim(
        self,
        storage: Storage,
        topic: str,
        base: Token | None,
        run_id: str,
        made: Callable[[Claim], P],
        lifetime: timedelta,
        outside: Sequence[Outside] = (),
    ) -> P:
        """Claim the token after `base` (`cairn.protocol.commit.claim`); the claim object holds
        `made(claim)` whole, so the later steps and the Spark job read it by its key."""

        def body(claim: Claim) -> bytes:
            return made(claim).model_dump_json().encode()

        return made(commit.claim(storage, topic, self.kind, base, run_id, body, lifetime, outside))

    def load(self, storage: Storage, claim_key: str) -> P:
        """What the claim at `claim_key` holds (how a later step or the Spark job receives it)."""
        return self.claimed.model_validate_json(storage.read(claim_key))

    def save(self, storage: Storage, claimed: P, attempt: R) -> str:
        """Stage the attempt's manifest (what its work staged, for the commit to check), only
        while its claim is live. Returns the manifest's key."""
        claimed.check_live(storage)
        staged = claimed.staged(storage)
        staged.write(claimed.manifest_key, attempt.model_dump_json(indent=2).encode())
        return claimed.manifest_key

    def load_attempt(self, storage: Storage, key: str) -> R:
        """The manifest at `key` (in `storage`: the attempt's staging area until it commits)."""
        return format_version.load(storage, key, self.saved, self.unreadable, self.what)

    def commit(
        self,
        storage: Storage,
        claimed: P,
        change: Callable[[], Change],
        elsewhere: leftovers.Elsewhere | None = None,
    ) -> Token:
        """Commit the attempt through the one commit site (`change` checks its work and says what
        it changes), or discard it if that is refused for good (`elsewhere`: what removes its
        files outside the archive root). Safe to retry: one that committed returns its token."""
        with leftovers.refused(storage, claimed.claim, elsewhere):
            return commit.commit(storage, claimed.claim, change)
