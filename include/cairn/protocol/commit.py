"""The commit protocol's one commit site: where an attempt's work becomes part of the archive.

Every change to a topic's data folders (an archive run, a rebuild, a seal) is an *attempt* that
becomes one token of the topic's chain (`cairn.protocol.tokens`). This module holds what an
attempt goes through: its claim (`claim`, `Claim`: the plan, under `_claims/`; `check_live`
before every later step), its staging (`staged`), the requirements its change must meet
(`Requirement`: `SamePosition`, `NewestClaim`, `NotRewound`, `FilesCurrent`, `NothingOverwritten`,
`InTime`, each with one `check`), `commit` (settle the newest token, check the requirements, mark
the publication pending, create the next token if absent) and `publish`, which moves the staged
files into place; `settle` finds the newest token that counts and finishes a publication a crash
left. What an attempt that never commits leaves is removed by `cairn.protocol.leftovers`.

docs/protocol.md describes the protocol once: the steps, which token counts, what an attempt
leaves behind, what a rewind does to files, and what each costs.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from pydantic import BaseModel, Field, NonNegativeInt, PositiveInt, ValidationError

from cairn.errors import PermanentError
from cairn.protocol import tokens
from cairn.protocol.format_version import Versioned, naming
from cairn.protocol.tokens import Kind, Payload, Token
from cairn.storage.layout import (
    attempt_prefix,
    claim_key,
    claim_numbers,
    claims_folder,
    head_key,
    manifest_key,
    parse_data_key,
    pending_key,
    token_key,
)
from cairn.storage.objects import ObjectExists, Storage, at_once

log = logging.getLogger(__name__)

_TRIES = 20
_PREFIX: dict[str, str] = {"archive": "a", "rebuild": "r", "seal": "s"}
_KIND: dict[str, Kind] = {v: k for k, v in _PREFIX.items()}  # type: ignore[misc]
_ATTEMPT_RE = re.compile(r"([ars])-(\d{12})-(\d{6})-[0-9a-f]+")
LIFETIME = timedelta(days=1)
"""How long an attempt may take from its claim to its commit, unless its topic says otherwise
(`attempt_timeout`)."""


class Fenced(PermanentError):
    """This attempt may not commit: another attempt planned, claimed or committed meanwhile."""


class Conflict(PermanentError):
    """A requirement of the attempt no longer holds: what it was planned on has changed."""


class BrokenPublication(PermanentError):
    """A committed token promises a file that is neither staged nor in its data folder."""


class HalfPublished(PermanentError):
    """A publication a hand rewind cut short that can no longer be finished safely
    (`finish_rewound`)."""


class Outside(BaseModel):
    """Where an attempt writes files outside the archive root (a seal's table files): in
    `folder` under `root` (a URL), each named after the attempt (its id, then `-`)."""

    root: str
    folder: str


class Claim(Versioned):
    """One attempt's claim: planned from token `base_seq` (0: none) at position `base_offsets`."""

    topic: str
    kind: Kind
    seq: PositiveInt
    """The token after the one planned from (the token it commits, unless it rebases)."""
    k: PositiveInt
    attempt_id: str
    run_id: str
    base_seq: NonNegativeInt
    base_created_at: datetime | None
    base_offsets: dict[NonNegativeInt, NonNegativeInt] = Field(default_factory=dict)
    created_at: datetime
    deadline: datetime | None = None
    """Its commit is refused after this (None: a claim made before Cairn recorded deadlines,
    `created_at` + `LIFETIME`)."""
    outside: list[Outside] = Field(default_factory=list)
    withdrawn_at: datetime | None = None
    """Set when the attempt was found over (`cairn.protocol.leftovers`): it never commits."""
    withdrawn_because: str | None = None

    @property
    def key(self) -> str:
        return claim_key(self.topic, self.kind, self.seq, self.k)

    @property
    def label(self) -> str:
        return f"topic {self.topic!r} {self.kind} attempt {self.attempt_id} (token {self.seq})"

    @property
    def due(self) -> datetime:
        return self.deadline or self.created_at + LIFETIME


def claim(
    storage: Storage,
    topic: str,
    kind: Kind,
    base: Token | None,
    run_id: str,
    body: Callable[[Claim], bytes],
    lifetime: timedelta = LIFETIME,
    outside: Sequence[Outside] = (),
) -> Claim:
    """Claim the token after `base` (the newest token the attempt planned from).

    `body(claim)` is what the claim object holds: the attempt's whole plan, so the later steps
    (and the Spark job) read it by reference instead of carrying it in arguments. The attempt
    must commit within `lifetime`; `outside` names what it writes outside the archive root.
    """
    seq = (base.seq if base else 0) + 1
    for _ in range(_TRIES):
        k = max(_claims_on(storage, topic, kind, seq), default=0) + 1
        now = datetime.now(UTC)
        made = Claim(
            topic=topic,
            kind=kind,
            seq=seq,
            k=k,
            attempt_id=f"{id_prefix(kind)}{seq:012d}-{k:06d}-{secrets.token_hex(3)}",
            run_id=run_id,
            base_seq=base.seq if base else 0,
            base_created_at=base.created_at if base else None,
            base_offsets=base.next_offsets if base else {},
            created_at=now,
            deadline=now + lifetime,
            outside=list(outside),
        )
        try:
            storage.create(made.key, body(made))
            return made
        except ObjectExists:
            continue  # another planner took this k at the same moment: take the next one
    raise Fenced(f"topic {topic!r}: could not claim {kind} token {seq} in {_TRIES} tries")


def id_prefix(kind: Kind) -> str:
    """How the ids of `kind`'s attempts begin (their manifests sort together)."""
    return f"{_PREFIX[kind]}-"


def load_claim(storage: Storage, topic: str, attempt_id: str) -> Claim | None:
    """The claim of `attempt_id` as it is stored now (None: there is none, or it is unreadable)."""
    found = _ATTEMPT_RE.fullmatch(attempt_id)
    if found is None:
        return None
    stored = _claim_at(storage, claim_key(topic, _KIND[found[1]], int(found[2]), int(found[3])))
    return stored if stored is not None and stored.attempt_id == attempt_id else None


def _claim_at(storage: Storage, key: str) -> Claim | None:
    try:
        with naming(key):  # a newer format is never taken for absent: a sweep would remove it
            return Claim.model_validate(json.loads(storage.read(key))["claim"])
    except (FileNotFoundError, ValueError, KeyError, TypeError, ValidationError):
        return None


def withdraw(storage: Storage, claim: Claim, why: str) -> None:
    """Mark the claim withdrawn: its attempt's commit is refused from now on (the claim stays,
    the record of the attempt)."""
    body = json.loads(storage.read(claim.key))
    body["claim"]["withdrawn_at"] = datetime.now(UTC).isoformat()
    body["claim"]["withdrawn_because"] = why
    storage.write(claim.key, json.dumps(body).encode())


def staged(storage: Storage, claim: Claim) -> Storage:
    """Where the attempt writes: its files keep their final keys below its prefix."""
    return storage.child(attempt_prefix(claim.topic, claim.attempt_id))


# --- requirements --------------------------------------------------------------------------


class Requirement(Protocol):
    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        """Raise Fenced or Conflict unless the attempt may still commit on `newest`."""


@dataclass(frozen=True)
class SamePosition:
    """An archive run read from its base position: nothing else may have moved it since."""

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        now = newest.next_offsets if newest else {}
        if now != claim.base_offsets:
            where = f"token {newest.seq}" if newest else "no token"
            raise Fenced(
                f"{claim.label} is stale: it was planned from position "
                f"{_offsets(claim.base_offsets)} (token {claim.base_seq}), but the newest is now "
                f"{where} at {_offsets(now)} (another run committed, or the topic was rewound). "
                "Nothing of this attempt was published; the next run plans afresh"
            )


@dataclass(frozen=True)
class NewestClaim:
    """Of the archive runs planned from one token, the newest claim is the live one."""

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        newer = max(_claims_on(storage, claim.topic, claim.kind, claim.seq), default=0)
        if newer > claim.k:
            raise Fenced(
                f"{claim.label} was fenced out by a newer attempt on the same token (claim "
                f"{newer} > {claim.k}: a concurrent or re-planned run). Nothing of this attempt "
                "was published"
            )


@dataclass(frozen=True)
class NotRewound:
    """A rebuild or seal replaces files below its base position: a rewind below it since
    (those offsets are to be read again) makes its work stale."""

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        now = newest.next_offsets if newest else {}
        behind = {p: o for p, o in claim.base_offsets.items() if now.get(p, 0) < o}
        if behind:
            raise Conflict(
                f"{claim.label}: the topic was rewound below the position it worked from "
                f"({_offsets(behind)} → {_offsets(now)}); nothing was changed. Run it again once "
                "the archive has caught up"
            )


@dataclass(frozen=True)
class FilesCurrent:
    """The files an attempt replaces are still the ones it read (nothing replaced them since)."""

    files: Mapping[str, str]
    """key → `Storage.version` when selected."""

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        changed = []
        for key, version in sorted(self.files.items()):
            try:
                if storage.version(key) != version:
                    changed.append(f"{key} was written again")
            except FileNotFoundError:
                changed.append(f"{key} is gone")
        if changed:
            raise Conflict(
                f"{claim.label}: the files it replaces changed since it selected them "
                f"({'; '.join(changed[:5])}): another commit replaced them. Nothing was changed; "
                "run it again"
            )


@dataclass(frozen=True)
class NothingOverwritten:
    """The files an attempt adds overwrite nothing but what it replaces."""

    adds: Iterable[str]
    replaces: Iterable[str]

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        allowed = set(self.replaces)
        foreign = [key for key in self.adds if key not in allowed and storage.exists(key)]
        if foreign:
            raise Conflict(
                f"{claim.label}: its files would replace {', '.join(sorted(foreign)[:5])}, "
                "which it did not select; nothing was changed"
            )


@dataclass(frozen=True)
class InTime:
    """An attempt commits before its deadline: one past it is over, and its leftovers may go."""

    def check(self, storage: Storage, claim: Claim, newest: Token | None) -> None:
        if datetime.now(UTC) > claim.due:
            raise Fenced(
                f"{claim.label} is past its deadline {claim.due:%Y-%m-%d %H:%M:%S} UTC (the "
                "topic's attempt_timeout after its claim): nothing of it was published; the next "
                "run plans afresh"
            )


def live_requirements(kind: Kind) -> list[Requirement]:
    """What every step of an attempt checks before it changes anything (cheap checks only)."""
    first = [SamePosition(), NewestClaim()] if kind == "archive" else [NotRewound()]
    return [*first, InTime()]


def check_live(storage: Storage, claim: Claim) -> None:
    """Raise Fenced or Conflict unless the attempt may still commit (its claim is live)."""
    newest = _newest(storage, claim.topic, claim.base_seq)
    for requirement in live_requirements(claim.kind):
        requirement.check(storage, claim, newest)


# --- the commit site -----------------------------------------------------------------------


@dataclass
class Change:
    """What an attempt asks the commit site to do."""

    requirements: list[Requirement]
    adds: dict[str, int]
    """Final keys (and sizes) of the staged files to publish."""
    replaces: list[str] = field(default_factory=list)
    """Keys in the data folders to delete once every added file is in place."""
    position: dict[int, int] | None = None
    """The position after the commit (archive runs); None carries the newest token's over."""
    payload: Payload = field(default_factory=Payload)
    """The kind's own token fields (counts, manifest, gaps, ...)."""


def replacing(old: dict[str, str], new: dict[str, int], payload: Payload) -> Change:
    """A change that replaces files (a rebuild, a seal): `new` (key: size) takes the place of
    `old` (key: version as selected) only if those are still the files there, nothing else is
    overwritten, and the topic was not rewound meanwhile."""
    return Change(
        requirements=[NotRewound(), FilesCurrent(old), NothingOverwritten(new, old)],
        adds=new,
        replaces=sorted(old),
        payload=payload,
    )


class Pending(BaseModel):
    """A pending mark: `attempt_id` is about to create token `seq`, or has and is publishing."""

    attempt_id: str
    seq: PositiveInt | None = None
    at: datetime | None = None
    """When it was written (None: a mark written before Cairn recorded it)."""
    token: Token | None = None
    """The token it creates: what its publication moves and deletes, even once a rewind deleted
    the token (None: a mark written before Cairn recorded it)."""
    publishing: bool = False
    """Set before a publication that replaces files moves its first file: its token was created,
    so the publication is finished, never left half done (`finish_rewound`)."""


def commit(storage: Storage, claim: Claim, prepare: Callable[[], Change]) -> Token:
    """Commit `claim`'s attempt: the one place a token is created. Returns its token.

    Safe to retry at any point: a token that already names this attempt is success, and its
    publication is finished (`prepare`, which checks the attempt's work and says what to
    change, runs only when it has not committed yet). Raises Fenced or Conflict (nothing
    changed, and no pending mark of it left) if a requirement fails or its claim was withdrawn;
    Conflict too when it published and a rewind deleted its token since (a publication the
    rewind cut short is finished first: `finish_rewound`).
    """
    done = committed(storage, claim)
    if done is not None:
        log.info("%s was already committed as token %s", claim.label, done.seq)
        publish(storage, done)
        return done
    _check_held(storage, claim)  # a withdrawn attempt's staging may be gone: say so first
    try:
        change = prepare()
    except (FileNotFoundError, PermanentError):  # its staged files may have been published
        if finish_rewound(storage, claim.topic, claim.attempt_id) is not None or storage.exists(
            manifest_key(claim.topic, claim.attempt_id)  # moved there as it published
        ):
            raise _rewound(claim) from None
        raise
    replaces = sorted(set(change.replaces) - set(change.adds))
    mark = pending_key(claim.topic, claim.attempt_id)
    for _ in range(_TRIES):
        newest = settle(storage, claim.topic, hint=claim.base_seq)
        try:
            for requirement in [*change.requirements, InTime()]:
                requirement.check(storage, claim, newest)
        except (Fenced, Conflict):
            # No token names it: an earlier try's create failed or lost, or a rewind deleted it
            if finish_rewound(storage, claim.topic, claim.attempt_id) is None:
                storage.delete(mark)
            raise
        token = Token(
            **dict(change.payload),
            seq=(newest.seq if newest else 0) + 1,
            topic=claim.topic,
            kind=claim.kind,
            next_offsets=change.position if change.position is not None else _position(newest),
            previous_offsets=claim.base_offsets,
            base_created_at=newest.created_at if newest else None,
            attempt_id=claim.attempt_id,
            adds=change.adds,
            replaces=replaces,
            run_id=claim.run_id,
            created_at=datetime.now(UTC),
        )
        pending = Pending(
            attempt_id=claim.attempt_id, seq=token.seq, at=datetime.now(UTC), token=token
        )
        storage.write(mark, pending.model_dump_json().encode())
        try:
            _check_held(storage, claim)  # after the mark: see cairn.protocol.leftovers
        except Fenced:
            storage.delete(mark)
            raise
        try:
            storage.create(
                token_key(claim.topic, token.seq), token.model_dump_json(indent=2).encode()
            )
        except ObjectExists:
            continue  # another commit took this seq: check the requirements against it
        if not _stands(storage, token):  # a hand rewind removed the token it was created on
            _remove(storage, token, "was created on a token that a rewind removed meanwhile")
            storage.delete(mark)  # nobody published it
            raise Fenced(
                f"{claim.label}: token {token.seq - 1} was deleted while this attempt committed "
                f"on it (a rewind); token {token.seq} was withdrawn and nothing was published"
            )
        publish(storage, token)
        storage.write(head_key(claim.topic), json.dumps({"seq": token.seq}).encode())
        return token
    storage.delete(mark)
    raise Fenced(f"{claim.label}: {_TRIES} other commits took the next token first")


def committed(storage: Storage, claim: Claim) -> Token | None:
    """The token that names this attempt, if it committed (looked for above its base only)."""
    for seq in tokens.seqs(storage, claim.topic, after=claim.base_seq):
        token = tokens.read(storage, claim.topic, seq)
        if token is not None and token.attempt_id == claim.attempt_id:
            return token
    return None


def publish(storage: Storage, token: Token) -> None:
    """Finish the token's publication if it is pending; idempotent, so a retry finishes it.

    Raises BrokenPublication if a promised file is neither staged nor in its data folder with
    its size (its staged files were deleted before they were published).
    """
    if token.attempt_id is None:
        return
    marker = pending_key(token.topic, token.attempt_id)
    prefix = attempt_prefix(token.topic, token.attempt_id)
    mark = pending_mark(storage, token.topic, token.attempt_id)
    if mark is None:
        if token.base_created_at is None:  # written before Cairn 0.2 (see _finish_legacy)
            _finish_legacy(storage, prefix)
        return  # published: the mark goes only once every file was checked in place
    if token.replaces and not mark.publishing:
        began = mark.model_copy(update={"token": token, "publishing": True})
        storage.write(marker, began.model_dump_json().encode())
    # on S3 a copy, a delete and a size check each: one at a time, a busy topic's dozens of
    # files (late records fill many hours' folders) took most of its commit step
    moved = at_once(lambda add: _move_in(storage, prefix, *add), sorted(token.adds.items()))
    problems = [problem for problem in moved if problem]
    if token.manifest is not None:
        try:
            storage.move(prefix + token.manifest, token.manifest)
        except FileNotFoundError:
            problems.append(f"its manifest {token.manifest} is missing")
    if problems:
        raise BrokenPublication(
            f"topic {token.topic!r} token {token.seq} ({token.attempt_id}) promises files that "
            f"are neither staged nor in place: {'; '.join(problems[:5])}"
        )
    for key in sorted(token.replaces, key=_backups_last):
        storage.delete(key)
    storage.delete_prefix(prefix)  # before the mark: staging without a mark was never committed
    storage.delete(marker)


def _move_in(storage: Storage, prefix: str, key: str, size: int) -> str | None:
    """Move one promised file from the attempt's staging into place; what is wrong, if any."""
    try:
        storage.move(prefix + key, key)
        now = storage.size(key)
    except FileNotFoundError:
        return f"{key} is missing"
    return None if now == size else f"{key} has {now} bytes, the token says {size}"


def pending_mark(storage: Storage, topic: str, attempt_id: str) -> Pending | None:
    """The attempt's pending mark, if it has one."""
    try:
        raw = storage.read(pending_key(topic, attempt_id))
    except FileNotFoundError:
        return None
    try:
        return Pending.model_validate_json(raw)
    except (ValidationError, ValueError):
        return Pending(attempt_id=attempt_id)  # a mark of an older Cairn: its bare attempt id


def finish_rewound(storage: Storage, topic: str, attempt_id: str) -> Token | None:
    """Finish a publication that replaces files and began (`Pending.publishing`) and whose
    token a hand rewind deleted (`tokens rewind` and `settle` finish it before they delete its
    token). Some new files may be in place with the old ones not all deleted: a record in two
    files. Finished, it is as a commit that published and was rewound after (docs/protocol.md,
    "What a rewind does to files"). Returns the token it finished; None when nothing had begun
    (the data folders are as they were before the attempt). Raises HalfPublished, finishing
    nothing, once another attempt planned or committed since: that attempt saw the half-done
    publication, so finishing it now could overwrite its files or double its records."""
    mark = pending_mark(storage, topic, attempt_id)
    if mark is None or not mark.publishing or mark.token is None:
        return None
    since = _planned_since(storage, mark)
    if since:
        raise HalfPublished(
            f"topic {topic!r} token {mark.token.seq} ({attempt_id}) was deleted by hand while it "
            f"was being published, and {since} since: its publication is left as it is, some "
            "new files in place and some files it replaces not deleted (`cairn verify` names "
            "them); rewind with `cairn tokens rewind`, which finishes a publication first"
        )
    return _finish(storage, mark.token, "was deleted by hand while it was being published")


def finish_pending(storage: Storage, token: Token) -> None:
    """Finish `token`'s publication if it is pending, before a rewind deletes the token: a
    publication is never left half done (a record in a new file and an old one)."""
    if token.attempt_id and pending_mark(storage, token.topic, token.attempt_id) is not None:
        _finish(storage, token, "is being deleted by a rewind while its publication is pending")


def _finish(storage: Storage, token: Token, why: str) -> Token | None:
    """Finish `token`'s publication as it is removed (None: its staged files are gone)."""
    log.warning(
        "topic %s: token %s (%s) %s: its publication is finished first, as a commit that "
        "published and was then rewound",
        token.topic,
        token.seq,
        token.attempt_id,
        why,
    )
    try:
        publish(storage, token)
    except BrokenPublication as err:
        log.error("topic %s: %s; the files moved so far stay where they are", token.topic, err)
        return None
    return token


def _planned_since(storage: Storage, mark: Pending) -> str | None:
    """What planned or committed since `mark`'s publication began: a token created after it,
    or another attempt's claim above the newest token made after it (one listing per kind)."""
    assert mark.token is not None and mark.at is not None
    topic, began = mark.token.topic, mark.at
    newest = _newest(storage, topic, None)
    if newest is not None and newest.created_at > began:
        return f"token {newest.seq} was committed"
    floor = _claim_floor((newest.seq if newest else 0) + 1)
    for kind in _PREFIX:
        for key in storage.list_after(claims_folder(topic, kind), floor):
            other = _claim_at(storage, key)
            if other and other.attempt_id != mark.attempt_id and other.created_at > began:
                return f"{other.label} was planned"
    return None


def settle(storage: Storage, topic: str, hint: int | None = None) -> Token | None:
    """The newest token that counts, with its publication finished (docs/protocol.md, "Which
    token counts"); tokens that do not count are removed, with a warning naming them."""
    while True:
        newest = _newest(storage, topic, hint)
        if newest is None:
            return None
        below = _below(storage, newest)
        mark = None
        if below != "stands" and newest.attempt_id is not None:
            mark = pending_mark(storage, topic, newest.attempt_id)
        if below == "replaced" or (below == "missing" and mark is not None):
            why = f"stands above a missing or replaced token {newest.seq - 1}"
            if mark is not None and mark.publishing:  # it moved files: finish, never half done
                _finish(storage, newest, why)
            _remove(storage, newest, why)
        else:
            if below == "missing":
                log.warning(
                    "topic %s: token %s below the newest token %s is missing: a hole in the "
                    "history, not a rewind (a rewind deletes the newest tokens first), so the "
                    "position stays at token %s",
                    topic,
                    newest.seq - 1,
                    newest.seq,
                    newest.seq,
                )
            try:
                publish(storage, newest)
                return newest
            except BrokenPublication as err:
                _remove(storage, newest, f"cannot be published ({err})")
        hint = newest.seq - 1


def newest(storage: Storage, topic: str) -> Token | None:
    """The newest token as it stands (for reading the position; a commit uses `settle`)."""
    return _newest(storage, topic, None)


# --- helpers -------------------------------------------------------------------------------


def _newest(storage: Storage, topic: str, hint: int | None) -> Token | None:
    """The newest token, found from `hint` (a seq believed to exist) or the recorded head.

    One listing from the hint finds it when nothing was rewound; after a rewind, listings from
    ever further below (1, 2, 4, ... seqs) find the newest that is left.
    """
    if hint is None:
        hint = _recorded_head(storage, topic)
    if not hint:
        found = tokens.seqs(storage, topic)
        return tokens.read(storage, topic, found[-1]) if found else None
    step = 1
    while True:
        after = max(0, hint - step)
        found = tokens.seqs(storage, topic, after=after)
        if found:
            token = tokens.read(storage, topic, found[-1])
            if token is not None:
                return token
            continue  # deleted between the listing and the read: list again
        if after == 0:
            return None
        step *= 2


def _rewound(claim: Claim) -> Conflict:
    """The attempt published (or `finish_rewound` just finished it), and a rewind deleted its
    token since: a retry of its commit has nothing more to do."""
    return Conflict(
        f"{claim.label} published, and a rewind deleted its token since: its files stay as any "
        'rewound commit\'s (docs/protocol.md, "What a rewind does to files"); nothing more is '
        "committed"
    )


def _check_held(storage: Storage, claim: Claim) -> None:
    """Raise Fenced if the claim was withdrawn (`cairn.protocol.leftovers`) or is gone."""
    held = load_claim(storage, claim.topic, claim.attempt_id)
    if held is None or held.withdrawn_at is not None:
        raise Fenced(
            f"{claim.label} was withdrawn ({held.withdrawn_because if held else 'no claim'}): "
            "nothing of it was published; the next run plans afresh"
        )


def _recorded_head(storage: Storage, topic: str) -> int | None:
    try:
        return int(json.loads(storage.read(head_key(topic)))["seq"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _below(storage: Storage, token: Token) -> Literal["stands", "missing", "replaced"]:
    """Whether `token` stands on the token it was created on (tokens written before Cairn
    recorded that, and the first token, stand), or that token is missing or another now."""
    if token.seq == 1 or token.base_created_at is None:
        return "stands"
    below = tokens.read(storage, token.topic, token.seq - 1)
    if below is None:
        return "missing"
    return "stands" if below.created_at == token.base_created_at else "replaced"


def _stands(storage: Storage, token: Token) -> bool:
    return _below(storage, token) == "stands"


def _remove(storage: Storage, token: Token, why: str) -> None:
    log.warning(
        "topic %s: token %s (%s) %s: it does not count and is removed; its offsets are read "
        "again, and its files stay until a commit holds them again",
        token.topic,
        token.seq,
        token.attempt_id,
        why,
    )
    storage.delete(token_key(token.topic, token.seq))


def _finish_legacy(storage: Storage, prefix: str) -> None:
    """Finish a publication that a commit made before the upgrade left half done: it is listed
    in the attempt's `_publication.json` instead of the token."""
    try:
        done = json.loads(storage.read(prefix + "_publication.json"))
    except FileNotFoundError:
        return
    for key in done.get("move", []):
        storage.move(prefix + key, key)
    for key in done.get("delete", []):
        storage.delete(key)
    storage.delete_prefix(prefix)


def _position(newest: Token | None) -> dict[int, int]:
    return dict(newest.next_offsets) if newest else {}


def _backups_last(key: str) -> tuple[bool, str]:
    found = parse_data_key(key)
    return (found is not None and found.kind == "backup", key)


def _claims_on(storage: Storage, topic: str, kind: str, seq: int) -> list[int]:
    """The claim numbers `k` on token `seq` (one listing that starts at `seq`'s claims)."""
    keys = storage.list_after(claims_folder(topic, kind), _claim_floor(seq))
    found = (claim_numbers(key) for key in keys)
    return [n[1] for n in found if n is not None and n[0] == seq]


def _claim_floor(seq: int) -> str:
    """A name sorting just before every claim on `seq`."""
    return f"{seq - 1:012d}-999999.json"


def _offsets(offsets: Mapping[int, int]) -> str:
    return "{" + ", ".join(f"{p}: {o}" for p, o in sorted(offsets.items())) + "}"
