"""What attempts that never commit leave, and the sweep that removes it, on a real local archive
root: refused and fenced attempts, failed token creates, attempts past their deadline, files
outside the archive root, and the handshake that keeps a sweep off a commit under way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cairn.protocol import commit, leftovers
from cairn.protocol.commit import Change, Fenced
from cairn.storage.layout import pending_key, token_key
from cairn.storage.objects import Storage
from tests.unit.conftest import claim_next, commit_next
from tests.unit.test_commit import ARCHIVE, KEYS, TOPIC, created_unpublished, stage

LATER = timedelta(days=1, minutes=1)
"""Past every attempt's deadline (`commit.LIFETIME`)."""


def left(storage: Storage) -> list[str]:
    """What is in the staging area and the pending marks."""
    return storage.list(f"_attempts/{TOPIC}/") + storage.list(f"_publishing/{TOPIC}/")


def mark(storage: Storage, claim: commit.Claim, at: datetime) -> None:
    """The pending mark a commit writes before it creates its token."""
    pending = commit.Pending(attempt_id=claim.attempt_id, seq=claim.seq, at=at)
    storage.write(pending_key(TOPIC, claim.attempt_id), pending.model_dump_json().encode())


class FailingCreate(Storage):
    """The archive root, where creating a token fails as an S3 error would (or first lets
    `before` commit, so the create loses the race)."""

    def __init__(self, url: str, before=None) -> None:
        super().__init__(url)
        self.before = before

    def create(self, key: str, data: bytes) -> None:
        if key.startswith("_tokens/") and self.before is None:
            raise ConnectionError("the token's create failed")
        if key.startswith("_tokens/") and self.before is not None:
            before, self.before = self.before, None
            before()
        super().create(key, data)


def test_a_commit_that_lost_the_race_and_was_then_refused_leaves_nothing(storage, monkeypatch):
    commit_next(storage, {0: 10})
    winner, loser = claim_next(storage, run_id="w"), claim_next(storage, run_id="l")
    stage(storage, winner, KEYS[:1])
    adds = stage(storage, loser, KEYS)

    def the_winner_commits_first() -> None:
        with monkeypatch.context() as patched:  # it passed its check before the loser claimed
            patched.setattr(commit.NewestClaim, "check", lambda *_: None)
            change = Change(requirements=ARCHIVE, adds={}, position={0: 15})
            commit.commit(storage, winner, lambda: change)

    racing = FailingCreate(storage.url, before=the_winner_commits_first)
    change = Change(requirements=ARCHIVE, adds=adds, position={0: 20})
    with pytest.raises(Fenced, match="stale"), leftovers.refused(racing, loser):
        commit.commit(racing, loser, lambda: change)

    assert commit.newest(storage, TOPIC).attempt_id == winner.attempt_id
    assert left(storage) == []
    assert "stale" in commit.load_claim(storage, TOPIC, loser.attempt_id).withdrawn_because


def test_a_failed_create_is_kept_while_it_may_be_retried_and_removed_once_it_cannot(storage):
    commit_next(storage, {0: 10})
    a = claim_next(storage)
    adds = stage(storage, a, KEYS)
    change = Change(requirements=ARCHIVE, adds=adds, position={0: 20})
    with pytest.raises(ConnectionError):
        commit.commit(FailingCreate(storage.url), a, lambda: change)
    now = datetime.now(UTC)

    assert leftovers.sweep(storage, TOPIC) == []  # its mark is fresh: a create may be under way
    assert leftovers.sweep(storage, TOPIC, now=now + leftovers.MARGIN) == []  # a retry may win
    commit_next(storage, {0: 12})  # the next run commits: the position moved past a's base

    assert leftovers.sweep(storage, TOPIC, now=now + leftovers.MARGIN) == [a.attempt_id]
    assert left(storage) == []
    with pytest.raises(Fenced, match="stale"):  # a late retry of a's commit task
        commit.commit(storage, a, lambda: change)


def test_an_attempt_that_died_before_its_commit_is_removed_past_its_deadline(storage):
    commit_next(storage, {0: 10})
    rebuild = claim_next(storage, kind="rebuild")
    stage(storage, rebuild, KEYS)

    assert leftovers.sweep(storage, TOPIC) == []  # live: it may still commit
    assert leftovers.sweep(storage, TOPIC, now=datetime.now(UTC) + LATER) == [rebuild.attempt_id]
    assert left(storage) == []
    with pytest.raises(Fenced, match="withdrawn"):
        commit.commit(storage, rebuild, lambda: Change(requirements=[], adds={}))
    assert not storage.exists(token_key(TOPIC, 2))


class Interleaved(Storage):
    """The archive root, calling `hook` once right after the first write under `point`."""

    def __init__(self, url: str, point: str, hook) -> None:
        super().__init__(url)
        self.point, self.hook = point, hook

    def write(self, key: str, data: bytes) -> None:
        super().write(key, data)
        if key.startswith(self.point) and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()

    def create(self, key: str, data: bytes) -> None:
        if key.startswith(self.point) and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        super().create(key, data)


@pytest.mark.parametrize("at", ["_publishing/", "_tokens/"])
def test_a_sweep_never_removes_what_a_commit_under_way_may_publish(storage, monkeypatch, at):
    """A was fenced out by B, but its commit passed its checks a moment before B claimed. A sweep
    withdraws A's claim right after A wrote its pending mark (A then reads its claim and stops)
    or right before A creates its token (A read its claim before: it commits). Either way the
    sweep leaves A's files to A, and nothing is published half."""
    commit_next(storage, {0: 10})
    a = claim_next(storage, run_id="a")
    claim_next(storage, run_id="b")
    adds = stage(storage, a, KEYS)
    swept: list[bool] = []

    def sweep_now() -> None:
        swept.append(leftovers.abandon(storage, TOPIC, a.attempt_id, "fenced out"))

    racing = Interleaved(storage.url, at, sweep_now)
    monkeypatch.setattr(commit.NewestClaim, "check", lambda *_: None)  # checked before b claimed
    change = Change(requirements=ARCHIVE, adds=adds, position={0: 20})
    if at == "_publishing/":
        with pytest.raises(Fenced, match="withdrawn"):
            commit.commit(racing, a, lambda: change)
        assert commit.newest(storage, TOPIC).seq == 1 and not any(map(storage.exists, KEYS))
    else:
        assert commit.commit(racing, a, lambda: change).seq == 2
        assert all(storage.exists(key) for key in KEYS)

    assert swept == [False]  # it found a fresh mark: it removed nothing
    monkeypatch.undo()
    leftovers.sweep(storage, TOPIC)
    assert left(storage) == []


def test_a_pending_mark_whose_token_is_the_newest_is_left_to_settle(storage):
    commit_next(storage, {0: 10})
    a = claim_next(storage)
    created_unpublished(storage, a, stage(storage, a, KEYS), {0: 9})

    assert leftovers.sweep(storage, TOPIC, now=datetime.now(UTC) + LATER) == []
    assert commit.settle(storage, TOPIC).attempt_id == a.attempt_id
    assert left(storage) == [] and all(storage.exists(key) for key in KEYS)


def test_files_written_outside_the_archive_root_go_only_where_they_can_be_reached(
    storage, tmp_path
):
    table = Storage((tmp_path / "table").as_uri())
    commit_next(storage, {0: 10})
    outside = [commit.Outside(root=table.url, folder="data/_event_date=2024-05-01")]
    seal = commit.claim(
        storage,
        TOPIC,
        "seal",
        commit.newest(storage, TOPIC),
        "s",
        lambda c: f'{{"claim": {c.model_dump_json()}}}'.encode(),
        outside=outside,
    )
    stage(storage, seal, KEYS[1:2])
    mine = f"data/_event_date=2024-05-01/{seal.attempt_id}-00000-000.parquet"
    other = "data/_event_date=2024-05-01/s-000000000002-000009-abcdef-00000-000.parquet"
    for key in (mine, other):
        table.write(key, b"parquet")
    later = datetime.now(UTC) + LATER

    def remove(folder: str, attempt_id: str) -> None:
        for key in table.list_after(folder, "", beginning=attempt_id):
            table.delete(key)

    assert leftovers.sweep(storage, TOPIC, now=later) == []  # the table is out of reach here
    assert commit.load_claim(storage, TOPIC, seal.attempt_id).withdrawn_at is not None
    assert leftovers.sweep(storage, TOPIC, {table.url: remove}, now=later) == [seal.attempt_id]

    assert table.list() == [other] and left(storage) == []


def test_a_pending_mark_an_older_cairn_left_is_removed_once_its_attempt_is_over(storage):
    commit_next(storage, {0: 10})
    a = claim_next(storage)
    stage(storage, a, KEYS)
    storage.write(pending_key(TOPIC, a.attempt_id), a.attempt_id.encode())  # its bare id

    assert leftovers.sweep(storage, TOPIC) == []
    commit_next(storage, {0: 11})
    assert leftovers.sweep(storage, TOPIC) == [a.attempt_id]
    assert left(storage) == []
