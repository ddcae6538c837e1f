"""One attempt's life (`cairn.protocol.attempt`), the same for every kind."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cairn.protocol import commit, tokens
from cairn.protocol.attempt import Attempts, Claimed
from cairn.protocol.format_version import Versioned
from cairn.protocol.tokens import RebuildPayload, Rebuilt
from cairn.storage.layout import token_key
from cairn.storage.objects import Storage
from tests.unit.conftest import commit_next


class Note(Claimed):
    """A kind's plan: here only a note."""

    note: str


class Saved(Versioned):
    attempt_id: str


class Unreadable(Exception):
    pass


REBUILD = Attempts("rebuild", Note, Saved, Unreadable, what="test manifest")


def claimed(storage: Storage) -> Note:
    base = commit.newest(storage, "orders")

    def made(claim: commit.Claim) -> Note:
        return Note(claim=claim, note="kept")

    return REBUILD.claim(storage, "orders", base, "run", made, timedelta(hours=1))


def test_the_claim_holds_the_plan_and_a_later_step_reads_it_back(storage):
    commit_next(storage, {0: 5})
    note = claimed(storage)

    assert REBUILD.load(storage, note.claim.key) == note
    assert note.claim.kind == "rebuild" and note.claim.base_seq == 1


def test_save_stages_the_manifest_only_while_the_claim_is_live(storage):
    commit_next(storage, {0: 5})
    note = claimed(storage)
    key = REBUILD.save(storage, note, Saved(attempt_id=note.attempt_id))

    assert REBUILD.load_attempt(note.staged(storage), key) == Saved(attempt_id=note.attempt_id)
    note.staged(storage).delete(key)
    for seq in tokens.seqs(storage, "orders"):  # a rewind below what the rebuild read
        storage.delete(token_key("orders", seq))
    with pytest.raises(commit.Conflict):
        REBUILD.save(storage, note, Saved(attempt_id=note.attempt_id))
    assert not note.staged(storage).exists(key)


def test_an_unreadable_manifest_raises_the_kinds_error_naming_it(storage):
    storage.write("_manifests/orders/x.json", b"{oops")

    with pytest.raises(Unreadable, match=r"test manifest _manifests/orders/x\.json"):
        REBUILD.load_attempt(storage, "_manifests/orders/x.json")


def test_a_commit_refused_for_good_discards_the_attempt(storage):
    commit_next(storage, {0: 5})
    note = claimed(storage)
    rebuilt = Rebuilt(dates=[], snapshot_seq=1, sources=[])

    def change() -> commit.Change:
        return commit.replacing({"gone.avro": "1:1"}, {}, RebuildPayload(rebuilt=rebuilt))

    with pytest.raises(commit.Conflict):
        REBUILD.commit(storage, note, change)
    held = commit.load_claim(storage, "orders", note.attempt_id)
    assert held is not None and held.withdrawn_at is not None
