"""The one commit protocol on a real local archive root: claims, requirements, the atomic create,
publication, and which token counts after races with hand rewinds."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, date, datetime

import pytest

from cairn.protocol import commit, leftovers, tokens
from cairn.protocol.commit import BrokenPublication, Change, Conflict, Fenced
from cairn.protocol.tokens import CorruptToken
from cairn.storage.layout import (
    attempt_prefix,
    backup_key,
    head_key,
    parse_data_key,
    partitioned_key,
    pending_key,
    quarantine_key,
    token_key,
)
from cairn.storage.objects import Storage
from tests.unit.conftest import T0, claim_body, claim_next, commit_next

TOPIC = "orders"
HOUR = "dt=2024-05-01/hr=00"
KEYS = [
    backup_key(TOPIC, 1, 0, 0),
    partitioned_key(TOPIC, 1, 0, 0, HOUR),
    quarantine_key(TOPIC, 1, 0, 3, date(2024, 5, 1)),
]
ARCHIVE = [commit.SamePosition(), commit.NewestClaim()]


def stage(storage: Storage, claim: commit.Claim, keys: list[str]) -> dict[str, int]:
    """Write each key into the attempt's staging area; returns key → size."""
    staged = commit.staged(storage, claim)
    for key in keys:
        staged.write(key, f"{claim.attempt_id}:{key}".encode())
    return {key: len(f"{claim.attempt_id}:{key}") for key in keys}


def data_files(storage: Storage) -> dict[str, bytes]:
    return {k: storage.read(k) for k in storage.list() if parse_data_key(k)}


def archive(storage: Storage, claim: commit.Claim, position: dict, keys=(), **kw) -> tokens.Token:
    """Commit `claim` as an archive run that staged `keys` and ends at `position`."""
    adds = stage(storage, claim, list(keys))
    change = Change(requirements=ARCHIVE, adds=adds, position=position, **kw)
    return commit.commit(storage, claim, lambda: change)


def created_unpublished(
    storage: Storage, claim: commit.Claim, adds: dict[str, int], position: dict
) -> tokens.Token:
    """Commit `claim` as an archive run whose commit task dies right after creating its token."""
    real_publish = commit.publish
    commit.publish = lambda *_: None
    try:
        change = Change(requirements=ARCHIVE, adds=adds, position=position)
        return commit.commit(storage, claim, lambda: change)
    finally:
        commit.publish = real_publish


def test_first_commit_becomes_newest_and_records_the_head(storage):
    assert commit.newest(storage, TOPIC) is None
    token = archive(storage, claim_next(storage), {0: 10, 3: 7}, KEYS)

    assert commit.newest(storage, TOPIC) == token == commit.settle(storage, TOPIC)
    stored = json.loads(storage.read(token_key(TOPIC, 1)))
    assert stored["next_offsets"] == {"0": 10, "3": 7} and stored["kind"] == "archive"
    assert json.loads(storage.read(head_key(TOPIC))) == {"seq": 1}
    assert set(data_files(storage)) == set(KEYS)
    assert not storage.list("_attempts/") and not storage.list("_publishing/")


def test_runs_planned_from_the_same_position_exactly_one_commits(storage):
    barrier = threading.Barrier(8)
    won, lost = [], []

    def attempt(i: int) -> None:
        barrier.wait()
        claim = commit.claim(storage, TOPIC, "archive", None, f"run-{i}", claim_body)
        try:
            won.append(archive(storage, claim, {0: 10 * (i + 1)}))
        except Fenced as err:
            lost.append(str(err))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(won) == 1 and len(lost) == 7
    assert all("'orders'" in msg for msg in lost)
    assert tokens.list_tokens(storage, TOPIC) == won


def test_a_retried_commit_returns_its_token_and_creates_no_other(storage):
    claim = claim_next(storage)
    first = archive(storage, claim, {0: 10}, KEYS)

    again = commit.commit(
        storage, claim, lambda: Change(requirements=ARCHIVE, adds={}, position={0: 99})
    )

    assert again == first and [t.seq for t in tokens.list_tokens(storage, TOPIC)] == [1]


def test_a_run_planned_before_a_rewind_is_fenced_naming_both_positions(storage):
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    stale = claim_next(storage)
    storage.delete(token_key(TOPIC, 2))  # a rewind by hand

    with pytest.raises(Fenced, match=r"position \{0: 20\} \(token 2\).*token 1 at \{0: 10\}"):
        archive(storage, stale, {0: 30}, KEYS)
    assert commit.newest(storage, TOPIC).seq == 1 and not data_files(storage)


def test_a_run_commits_on_a_chain_rewritten_to_the_same_position_but_not_to_another(storage):
    """Position equality is the requirement: the re-read chain holds the same offsets below."""
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    same, other = claim_next(storage), claim_next(storage, run_id="other")
    storage.delete(token_key(TOPIC, 2))
    commit_next(storage, {0: 20})  # the same offsets read again: another token 2

    with pytest.raises(Fenced, match="fenced out by a newer attempt"):
        archive(storage, same, {0: 30})
    assert archive(storage, other, {0: 30}).seq == 3


def test_an_older_claim_that_passed_its_check_can_still_win_and_the_newer_yields(
    storage, monkeypatch
):
    older = claim_next(storage)
    newer = claim_next(storage)
    with monkeypatch.context() as patched:  # older checked just before newer claimed
        patched.setattr(commit.NewestClaim, "check", lambda *_: None)
        won = archive(storage, older, {0: 5}, KEYS)

    with pytest.raises(Fenced, match="stale"):
        archive(storage, newer, {0: 5}, KEYS)
    assert commit.newest(storage, TOPIC) == won


def test_a_rebuild_commits_after_archive_runs_that_committed_meanwhile(storage):
    commit_next(storage, {0: 10})
    storage.write(KEYS[1], b"the archive's file")
    rebuild = claim_next(storage, kind="rebuild")
    new_key = partitioned_key(TOPIC, 2, 0, 0, HOUR)
    adds = stage(storage, rebuild, [new_key])
    commit_next(storage, {0: 20})  # an archive run commits while the rebuild works
    old = {KEYS[1]: storage.version(KEYS[1])}
    change = Change(
        requirements=[
            commit.NotRewound(),
            commit.FilesCurrent(old),
            commit.NothingOverwritten(adds, old),
        ],
        adds=adds,
        replaces=list(old),
    )

    done = commit.commit(storage, rebuild, lambda: change)

    assert done.seq == 3 and done.kind == "rebuild" and done.next_offsets == {0: 20}
    assert set(data_files(storage)) == {new_key}


def test_a_rebuild_whose_files_changed_or_would_overwrite_others_changes_nothing(storage):
    commit_next(storage, {0: 10})
    storage.write(KEYS[1], b"selected")
    storage.write(KEYS[0], b"not selected")
    rebuild = claim_next(storage, kind="rebuild")
    adds = stage(storage, rebuild, [KEYS[0]])
    changed = Change(
        requirements=[commit.FilesCurrent({KEYS[1]: "3:stale"})], adds=adds, replaces=[KEYS[1]]
    )
    foreign = Change(
        requirements=[commit.NothingOverwritten(adds, [KEYS[1]])], adds=adds, replaces=[KEYS[1]]
    )

    with pytest.raises(Conflict, match="was written again"):
        commit.commit(storage, rebuild, lambda: changed)
    with pytest.raises(Conflict, match="which it did not select"):
        commit.commit(storage, rebuild, lambda: foreign)
    assert commit.newest(storage, TOPIC).seq == 1
    assert data_files(storage) == {KEYS[0]: b"not selected", KEYS[1]: b"selected"}


def test_a_rebuild_planned_before_a_rewind_below_its_position_is_refused(storage):
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    rebuild = claim_next(storage, kind="rebuild")
    storage.delete(token_key(TOPIC, 2))

    with pytest.raises(Conflict, match="rewound below"):
        commit.check_live(storage, rebuild)
    with pytest.raises(Conflict, match="rewound below"):
        commit.commit(storage, rebuild, lambda: Change(requirements=[commit.NotRewound()], adds={}))


def test_publish_moves_the_files_deletes_what_it_replaces_and_checks_every_size(storage):
    storage.write(KEYS[2], b"rewound quarantine")
    replaced = backup_key(TOPIC, 1, 0, 7)
    storage.write(replaced, b"rewound backup")
    claim = claim_next(storage)
    stage(storage, claim, [backup_key(TOPIC, 1, 0, 99)])  # staged, but not in the commit

    archive(storage, claim, {0: 9}, KEYS[:2], replaces=[KEYS[2], replaced])

    assert set(data_files(storage)) == set(KEYS[:2])
    assert not storage.list(attempt_prefix(TOPIC, claim.attempt_id))


def test_publish_moves_a_runs_files_at_once(storage, monkeypatch):
    """On S3 each move is a copy, a delete and a size check: a run's files move together, not
    one after another."""
    claim = claim_next(storage)
    adds = stage(storage, claim, KEYS)
    together = threading.Barrier(len(KEYS), timeout=5)
    real_move = storage.move

    def move(source: str, target: str) -> None:
        if target in adds:
            together.wait()  # returns only once every file's move has begun
        real_move(source, target)

    monkeypatch.setattr(storage, "move", move)
    commit.commit(storage, claim, lambda: Change(requirements=ARCHIVE, adds=adds, position={0: 4}))
    assert data_files(storage) == {key: storage.read(key) for key in KEYS}
    assert not storage.list(attempt_prefix(TOPIC, claim.attempt_id))


@pytest.mark.parametrize("moved", [0, 1, 2])
def test_a_commit_that_crashed_while_publishing_is_finished_by_the_next_settle(
    storage, monkeypatch, moved
):
    claim = claim_next(storage)
    adds = stage(storage, claim, KEYS)
    calls = []
    counting = threading.Lock()  # publish moves several files at once
    real_move = storage.move

    def crash(source: str, target: str) -> None:
        with counting:
            calls.append(target)
            dead = len(calls) > moved
        if dead:
            raise ConnectionError("the commit task died")
        real_move(source, target)

    monkeypatch.setattr(storage, "move", crash)
    with pytest.raises(ConnectionError):
        commit.commit(
            storage, claim, lambda: Change(requirements=ARCHIVE, adds=adds, position={0: 4})
        )
    monkeypatch.setattr(storage, "move", real_move)
    assert storage.exists(pending_key(TOPIC, claim.attempt_id))
    assert len(set(data_files(storage)) & set(KEYS)) == moved  # half published

    assert commit.settle(storage, TOPIC).attempt_id == claim.attempt_id
    assert set(data_files(storage)) == set(KEYS)
    assert not storage.exists(pending_key(TOPIC, claim.attempt_id))


def test_a_rewind_racing_a_commit_withdraws_its_token_and_publishes_nothing(storage, monkeypatch):
    """A passes its requirements; token 1 is deleted by hand; A's create of token 2 succeeds,
    but A stands on nothing: its token is withdrawn, its files are not published, its pending
    mark is gone, and the next settle finds no token."""
    commit_next(storage, {0: 10})
    a = claim_next(storage)
    adds = stage(storage, a, KEYS)
    real = commit.SamePosition.check

    def rewind_then_check(self, storage_, claim_, newest):
        real(self, storage_, claim_, newest)
        if claim_ is a:
            storage.delete(token_key(TOPIC, 1))

    monkeypatch.setattr(commit.SamePosition, "check", rewind_then_check)
    with pytest.raises(Fenced, match="token 1 was deleted while this attempt committed"):
        commit.commit(storage, a, lambda: Change(requirements=ARCHIVE, adds=adds, position={0: 20}))

    assert tokens.seqs(storage, TOPIC) == [] and not data_files(storage)
    assert not storage.exists(pending_key(TOPIC, a.attempt_id))
    assert commit.settle(storage, TOPIC) is None


def test_a_token_deleted_below_a_published_one_is_a_hole_not_a_rewind(storage, caplog):
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    third = commit_next(storage, {0: 30})
    storage.delete(token_key(TOPIC, 2))  # a token that is not the newest, deleted by hand

    with caplog.at_level(logging.WARNING):
        assert commit.settle(storage, TOPIC) == third
    assert "token 2 below the newest token 3 is missing: a hole in the history" in caplog.text
    assert tokens.seqs(storage, TOPIC) == [1, 3]
    assert commit_next(storage, {0: 40}).seq == 4


def test_a_token_still_publishing_above_a_missing_one_does_not_count_and_is_removed(
    storage, caplog
):
    """A commit created token 3 on token 2, a rewind deleted token 2, and the commit died before
    it saw that or published: token 3 does not count, and its offsets are read again."""
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    claim = claim_next(storage)
    adds = stage(storage, claim, KEYS)
    third = created_unpublished(storage, claim, adds, {0: 30})
    storage.delete(token_key(TOPIC, 2))

    with caplog.at_level(logging.WARNING):
        assert commit.settle(storage, TOPIC).seq == 1
    assert f"token 3 ({third.attempt_id}) stands above a missing or replaced token 2" in caplog.text
    assert tokens.seqs(storage, TOPIC) == [1] and not data_files(storage)


def test_a_token_removed_by_settle_mid_publication_is_finished_first_never_left_half_done(
    storage, monkeypatch
):
    """A commit created token 3 on token 2, a rewind raced it and deleted token 2 after its
    check, and the commit died having moved one file of a publication that replaces a rewound
    file: the settle that removes token 3 first finishes it, so the rewound file's records are
    not in it and in token 3's files at once (the next run reads them again and replaces those)."""
    commit_next(storage, {0: 10})
    commit_next(storage, {0: 20})
    rewound = backup_key(TOPIC, 1, 0, 20)
    storage.write(rewound, b"a rewound run's file")
    claim = claim_next(storage)
    adds = stage(storage, claim, KEYS)
    real_move, moved = storage.move, []

    def dies(source: str, target: str) -> None:
        if moved:
            raise ConnectionError("the commit task died")
        moved.append(target)
        real_move(source, target)

    monkeypatch.setattr(storage, "move", dies)
    change = Change(requirements=ARCHIVE, adds=adds, replaces=[rewound], position={0: 30})
    with pytest.raises(ConnectionError):
        commit.commit(storage, claim, lambda: change)
    monkeypatch.undo()
    assert set(data_files(storage)) == {*moved, rewound}  # half done
    storage.delete(token_key(TOPIC, 2))

    assert commit.settle(storage, TOPIC).seq == 1
    assert tokens.seqs(storage, TOPIC) == [1]
    assert set(data_files(storage)) == set(KEYS)  # whole: at the position, read again next
    assert not storage.list("_attempts/") and not storage.list("_publishing/")


def test_a_token_whose_staged_files_vanished_is_never_published_as_done(storage, caplog):
    commit_next(storage, {0: 10})
    claim = claim_next(storage)
    adds = stage(storage, claim, KEYS)
    created_unpublished(storage, claim, adds, {0: 20})
    storage.delete_prefix(attempt_prefix(TOPIC, claim.attempt_id))  # staging deleted by hand

    with pytest.raises(BrokenPublication, match="promises files that are neither staged"):
        commit.publish(storage, commit.newest(storage, TOPIC))
    with caplog.at_level(logging.WARNING):
        assert commit.settle(storage, TOPIC).seq == 1
    assert "token 2" in caplog.text and "cannot be published" in caplog.text
    assert not data_files(storage)


def test_settle_checks_and_sweeps_never_list_the_whole_chain_nor_other_topics_attempts(storage):
    for i in range(30):
        commit_next(storage, {0: i + 1})
    calls: list[tuple[str, str]] = []

    class Counting(Storage):  # a listing on S3 is one of these calls
        def list_after(self, prefix, start_after, beginning=""):
            calls.append((prefix, start_after))
            return super().list_after(prefix, start_after, beginning)

        def list(self, prefix=""):
            calls.append((prefix, "*"))
            return super().list(prefix)

        def children(self, prefix):
            calls.append((prefix, "/"))
            return super().children(prefix)

    counting = Counting(storage.url)
    claim = claim_next(counting)
    calls.clear()
    commit.settle(counting, TOPIC)
    commit.check_live(counting, claim)
    leftovers.sweep(counting, TOPIC, spare=claim.attempt_id)

    tokens_listed = [c for c in calls if c[0].startswith("_tokens/") and c[1] != "/"]
    assert all(c[1] >= f"{29:012d}" for c in tokens_listed), calls
    swept = {c[0] for c in calls if c[0].startswith(("_attempts/", "_publishing/"))}
    assert swept == {f"_attempts/{TOPIC}/", f"_publishing/{TOPIC}/"}
    assert {c[0] for c in calls if c[1] == "*"} == swept  # only this topic's staging and marks


def test_newest_is_found_below_a_recorded_head_a_rewind_left_behind(storage):
    for i in range(20):
        commit_next(storage, {0: i + 1})
    for seq in range(20, 6, -1):
        storage.delete(token_key(TOPIC, seq))

    assert commit.newest(storage, TOPIC).seq == 6
    storage.delete(head_key(TOPIC))
    assert commit.newest(storage, TOPIC).seq == 6


def test_a_sweep_removes_fenced_attempts_and_leaves_pending_newer_and_own_ones_alone(storage):
    commit_next(storage, {0: 1})
    older, pending, mine, newer = (claim_next(storage, run_id=str(i)) for i in range(4))
    for claim in (older, pending, mine, newer):
        stage(storage, claim, KEYS[:1])
    mark = commit.Pending(attempt_id=pending.attempt_id, seq=2, at=datetime.now(UTC))
    storage.write(pending_key(TOPIC, pending.attempt_id), mark.model_dump_json().encode())

    assert leftovers.sweep(storage, TOPIC, spare=mine.attempt_id) == [older.attempt_id]
    assert sorted(storage.children(f"_attempts/{TOPIC}/")) == sorted(
        attempt_prefix(TOPIC, c.attempt_id) for c in (pending, mine, newer)
    )
    assert "fenced out" in commit.load_claim(storage, TOPIC, older.attempt_id).withdrawn_because


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"seq": 3}', json.dumps({"seq": 2, "topic": "orders"}).encode()],
)
def test_a_corrupt_newest_token_is_an_error_naming_the_key_never_skipped(storage, content):
    commit_next(storage, {0: 1})
    commit_next(storage, {0: 2})
    storage.write(token_key(TOPIC, 3), content)

    with pytest.raises(CorruptToken, match=r"_tokens/orders/000000000003\.json"):
        commit.settle(storage, TOPIC)


def test_foreign_keys_and_other_topics_are_not_tokens(storage):
    chain = [commit_next(storage, {0: i}) for i in (1, 2, 3)]
    storage.write("_tokens/orders/README.md", b"hello")
    storage.write("_tokens/orders/000000000009.json.tmp", b"{}")
    storage.write("_tokens/orders/old/000000000009.json", b"{}")
    commit_next(storage, {0: 999}, topic="orders-eu")

    assert tokens.list_tokens(storage, TOPIC) == chain
    assert commit.newest(storage, TOPIC) == chain[-1]


def test_a_publication_left_half_done_before_the_upgrade_is_finished(storage):
    """Tokens written before Cairn recorded their base listed their files in the attempt's
    `_publication.json`; one a crash left half published is finished by the next settle."""
    attempt = "a-000000000001-000001-abcdef"
    prefix = attempt_prefix(TOPIC, attempt)
    for key in KEYS:
        storage.write(prefix + key, b"old")
    storage.write(prefix + "_publication.json", json.dumps({"move": KEYS}).encode())
    old = tokens.Token(
        seq=1, topic=TOPIC, next_offsets={0: 4}, attempt_id=attempt, run_id="r", created_at=T0
    )
    storage.create(token_key(TOPIC, 1), old.model_dump_json(exclude={"base_created_at"}).encode())

    assert commit.settle(storage, TOPIC).seq == 1
    assert set(data_files(storage)) == set(KEYS) and not storage.list(prefix)
