"""What an attempt leaves behind until it commits, and the sweep that removes it once the attempt
can never commit.

Until it commits, an attempt of the commit protocol (`cairn.protocol.commit`: an archive run, a
rebuild, a seal) has:
- its claim `_claims/<topic>/<kind>/<seq>-<k>.json`, its plan. It stays as the record of the
  attempt; a withdrawn claim says when and why the attempt was given up;
- its staging `_attempts/<topic>/<attempt>/`: its files and its manifest, under their final keys;
- its pending mark `_publishing/<topic>/<attempt>.json`, from its commit's first try to create
  a token until its publication is whole;
- files it wrote outside the archive root, named after it, in the folders its claim names
  (`commit.Outside`: a seal's table files).
A commit moves the staged files and manifest into place, then removes the staging and, last,
the mark. What an attempt that never commits leaves is removed here: by `abandon` when it is
refused, and by `sweep` for attempts that died at any step. Every archive run sweeps in its
clean step, every rebuild and seal when it selects, and a seal's commit step also reaches the
table's location.

**Over.** An attempt can never commit when its claim was withdrawn, it is past its deadline (its
topic's `attempt_timeout` after its claim: `commit` refuses it after that), or its live
requirements fail (`commit.live_requirements`: an archive run fenced by a newer claim, or planned
from a position that has moved; a rebuild or seal planned before a rewind). With a pending mark,
only once the mark is older than `MARGIN` and the newest token does not name it: a commit
rewrites its mark at every try, so it is not between its mark and its token's create, and a
token that names it is `commit.settle`'s to publish.

**Nothing live is removed.** `abandon` first withdraws the claim, then looks at the pending mark
again; a commit writes its mark, then reads its claim (`commit.commit`). So either the commit
sees the withdrawal and stops, removing its own mark, or `abandon` sees a fresh mark and leaves
everything for a later sweep: staged files are never removed while a commit might publish them.
What a committed attempt published is in the data folders and `_manifests/`, where neither looks;
files outside the archive root go only through the place's own `Remover`, which keeps what is
referred to there (a seal's table files in a snapshot), and only where the caller reaches it. A
publication that began and whose token a hand rewind deleted is finished first
(`commit.finish_rewound`), never left with a record in a new file and an old one.

**Costs.** A sweep lists what is in `_attempts/<topic>/` and `_publishing/<topic>/`: only the
files of attempts that are running or not yet swept. It reads the claim of each (at most `BATCH`
a sweep, the rest at the next): never the chain or the history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from cairn.errors import PermanentError
from cairn.protocol import commit
from cairn.protocol.commit import Claim, Conflict, Fenced
from cairn.protocol.tokens import Token
from cairn.storage.layout import (
    attempt_prefix,
    attempts_folder,
    check_id,
    pending_key,
    publishing_folder,
)
from cairn.storage.objects import Storage

log = logging.getLogger(__name__)

MARGIN = timedelta(minutes=10)
"""A pending mark younger than this may belong to a commit that is creating its token."""
BATCH = 50
"""At most this many attempts are looked at in one sweep."""

Remover = Callable[[str, str], None]
"""Removes what an attempt (its id, the second argument) wrote in a folder (the first) of a place
outside the archive root, but what something there still refers to (a table snapshot: a zombie
of a committed seal may rewrite its files)."""
Elsewhere = Mapping[str, Remover]
"""The places outside the archive root a caller can reach, by root URL (`commit.Outside.root`)."""


def sweep(
    storage: Storage,
    topic: str,
    elsewhere: Elsewhere | None = None,
    spare: str | None = None,
    now: datetime | None = None,
) -> list[str]:
    """Remove what every attempt of `topic` that is over left (module doc), but `spare` (the
    caller's own attempt); an attempt whose outside files are not in `elsewhere` keeps them, and
    its staging, for a sweep that reaches them. Returns the attempts it removed."""
    now = now or datetime.now(UTC)
    found = _names(storage, attempts_folder(topic)) | _names(storage, publishing_folder(topic))
    found.discard(spare or "")
    if not found:
        return []
    newest = commit.newest(storage, topic)
    removed = []
    for attempt_id in sorted(found)[:BATCH]:
        claim = commit.load_claim(storage, topic, attempt_id)
        why = over(storage, topic, attempt_id, claim, newest, now)
        if why is not None and abandon(storage, topic, attempt_id, why, elsewhere, now):
            log.info("topic %s: removed what attempt %s left: %s", topic, attempt_id, why)
            removed.append(attempt_id)
    return removed


def over(
    storage: Storage,
    topic: str,
    attempt_id: str,
    claim: Claim | None,
    newest: Token | None,
    now: datetime,
) -> str | None:
    """Why the attempt can never commit (module doc), or None while it may."""
    if _committing(storage, topic, attempt_id, now, newest):
        return None
    if claim is None:
        return "it has no claim"
    if claim.withdrawn_at is not None:
        return f"withdrawn: {claim.withdrawn_because}"
    if now > claim.due:
        return f"past its deadline {claim.due:%Y-%m-%d %H:%M:%S} UTC"
    try:
        for requirement in commit.live_requirements(claim.kind):
            requirement.check(storage, claim, newest)
    except (Fenced, Conflict) as err:
        return str(err)
    return None


def abandon(
    storage: Storage,
    topic: str,
    attempt_id: str,
    why: str,
    elsewhere: Elsewhere | None = None,
    now: datetime | None = None,
) -> bool:
    """Withdraw the attempt (it never commits after this), then remove its files outside the
    archive root, its staging and its pending mark. False, removing nothing, while a commit of it
    may be under way (a fresh mark, or the newest token names it) or its outside files are out
    of `elsewhere`'s reach: a later sweep finishes it."""
    now = now or datetime.now(UTC)
    claim = commit.load_claim(storage, topic, attempt_id)
    if claim is not None and claim.withdrawn_at is None:
        commit.withdraw(storage, claim, why)
    if _committing(storage, topic, attempt_id, now):
        return False
    places = elsewhere or {}
    outside = claim.outside if claim is not None else []
    if any(o.root not in places for o in outside):
        return False
    try:
        commit.finish_rewound(storage, topic, attempt_id)  # a publication a rewind cut short
    except commit.HalfPublished as err:  # left as it is: its staging holds no record's only copy
        log.error("%s", err)
    for o in outside:
        places[o.root](o.folder, attempt_id)
    storage.delete_prefix(attempt_prefix(topic, attempt_id))
    storage.delete(pending_key(topic, attempt_id))
    return True


@contextmanager
def refused(storage: Storage, claim: Claim, elsewhere: Elsewhere | None = None) -> Iterator[None]:
    """Abandon the attempt when the block fails for good (a PermanentError: it was refused or
    fenced, its work is wrong), so a refused attempt leaves nothing for a sweep."""
    try:
        yield
    except PermanentError as err:
        abandon(storage, claim.topic, claim.attempt_id, str(err), elsewhere)
        raise


def _names(storage: Storage, folder: str) -> set[str]:
    """The attempt ids of the objects under `folder`: its own folders, or its `.json` marks. The
    objects, not the folders: an object store may list a folder whose objects are all gone."""
    names = set()
    for key in storage.list(folder):
        name = key[len(folder) :].split("/", 1)[0].removesuffix(".json")
        try:
            names.add(check_id(name))
        except ValueError:
            continue
    return names


def _committing(
    storage: Storage, topic: str, attempt_id: str, now: datetime, newest: Token | None = None
) -> bool:
    """Whether a commit of the attempt may be under way: it has a pending mark younger than
    `MARGIN`, or one that the newest token names (read unless given)."""
    mark = commit.pending_mark(storage, topic, attempt_id)
    if mark is None:
        return False
    if mark.at is not None and now - mark.at < MARGIN:
        return True
    newest = newest or commit.newest(storage, topic)
    return newest is not None and newest.attempt_id == attempt_id
