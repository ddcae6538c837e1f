"""The fence on a real local archive root: claims, liveness, commits and the fate of attempts."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from cairn import fence
from cairn.fence import Claim, CorruptLink, Fenced
from cairn.layout import Chain, chain_key
from cairn.storage import Storage
from tests.unit.conftest import T0

TOPIC = "orders"


def claim(storage: Storage, base: fence.Link | None, chain: Chain = "archive") -> Claim:
    return fence.claim(storage, TOPIC, chain, base, "run", lambda c: c.model_dump_json().encode())


def link(mine: Claim, created_at: datetime = T0) -> bytes:
    """The smallest link body the fence reads."""
    made = fence.Link(seq=mine.seq, created_at=created_at, attempt_id=mine.attempt_id)
    return made.model_dump_json().encode()


def commit(storage: Storage, mine: Claim, created_at: datetime = T0) -> fence.Link:
    assert fence.commit(storage, mine, link(mine, created_at))
    return fence.read_link(storage, TOPIC, mine.chain, mine.seq)


def test_claims_on_a_link_are_numbered_in_order_and_hold_their_body(storage):
    first, second, third = (claim(storage, None) for _ in range(3))

    assert [(c.seq, c.k, c.base_seq) for c in (first, second, third)] == [
        (1, 1, 0),
        (1, 2, 0),
        (1, 3, 0),
    ]
    assert second.key == "_claims/orders/archive/000000000001-000002.json"
    assert Claim.model_validate_json(storage.read(second.key)) == second
    assert fence.attempt_numbers(second.attempt_id) == ("archive", 1)
    assert len({c.attempt_id for c in (first, second, third)}) == 3

    after = claim(storage, commit(storage, third))
    assert (after.seq, after.k, after.base_seq) == (2, 1, 1)


def test_concurrent_claimers_get_distinct_numbers(storage):
    barrier = threading.Barrier(8)
    made: list[Claim] = []

    def claimer() -> None:
        barrier.wait()
        made.append(claim(storage, None))

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(c.k for c in made) == list(range(1, 9))
    assert len(storage.list("_claims/orders/archive/")) == 8


def test_a_newer_claim_fences_the_older_out(storage):
    older = claim(storage, None)
    fence.check_live(storage, older)
    newer = claim(storage, None)

    with pytest.raises(Fenced, match=r"fenced out by a newer attempt .*claim 2 > 1"):
        fence.check_live(storage, older)
    with pytest.raises(Fenced):
        fence.commit(storage, older, link(older))
    assert fence.newest_link(storage, TOPIC, "archive") is None
    fence.check_live(storage, newer)


def test_an_older_claim_checked_just_before_being_fenced_can_still_win(storage, monkeypatch):
    """Check and create are two requests: the newer claim lands between them."""
    older, newer = claim(storage, None), []
    real_check = fence.check_live

    def checked_then_overtaken(store: Storage, mine: Claim) -> None:
        real_check(store, mine)
        newer.append(claim(store, None))

    monkeypatch.setattr(fence, "check_live", checked_then_overtaken)
    assert fence.commit(storage, older, link(older))
    monkeypatch.undo()

    [late] = newer
    with pytest.raises(Fenced, match="planned from link 0 but the newest is now link 1"):
        fence.commit(storage, late, link(late))
    assert fence.decided_for(storage, TOPIC, "archive", 1) == older.attempt_id
    assert fence.fate(storage, TOPIC, late.attempt_id) == "dead"


def test_the_atomic_create_decides_when_both_checks_passed(storage, monkeypatch):
    first, second = claim(storage, None), claim(storage, None)
    commit(storage, second)
    monkeypatch.setattr(fence, "check_live", lambda *_: None)  # first's check ran long ago

    with pytest.raises(Fenced, match="another attempt committed link 1 first"):
        fence.commit(storage, first, link(first))
    assert fence.decided_for(storage, TOPIC, "archive", 1) == second.attempt_id


def test_commit_is_idempotent_for_the_attempt_that_made_the_link(storage):
    mine = claim(storage, None)
    body = link(mine)
    assert fence.commit(storage, mine, body) is True
    claim(storage, fence.read_link(storage, TOPIC, "archive", 1))  # the next run claims link 2

    # a retry after a lost response: success, and the link is not rewritten
    assert fence.commit(storage, mine, link(mine, T0 + timedelta(hours=1))) is False
    assert storage.read(chain_key(TOPIC, "archive", 1)) == body


def test_a_link_recreated_after_a_rewind_fences_claims_planned_from_the_old_one(storage):
    old = commit(storage, claim(storage, None), created_at=T0)
    planned = claim(storage, old)  # link 2, planned from the old link 1
    storage.delete(chain_key(TOPIC, "archive", 1))  # a rewind
    commit(storage, claim(storage, None), created_at=T0 + timedelta(hours=1))  # a new link 1

    with pytest.raises(Fenced, match="planned from link 1 but the newest is now link 1"):
        fence.check_live(storage, planned)
    with pytest.raises(Fenced):
        fence.commit(storage, planned, link(planned))
    assert fence.link_seqs(storage, TOPIC, "archive") == [1]


def test_fate_of_committed_dead_open_and_rewound_away_attempts(storage):
    lost, won = claim(storage, None), claim(storage, None)
    first = commit(storage, won)
    second_try = claim(storage, first)
    rebuilding = claim(storage, None, chain="rebuild")

    def fate(c: Claim | str) -> str:
        return fence.fate(storage, TOPIC, c if isinstance(c, str) else c.attempt_id)

    assert (fate(won), fate(lost), fate(second_try)) == ("committed", "dead", "open")
    assert fate(rebuilding) == "open"  # judged on its own chain, which has no link yet
    assert fate("manual-backfill") == "open"  # not made by a claim: not ours to judge

    third_try = claim(storage, commit(storage, second_try))
    assert fate(third_try) == "open"
    storage.delete(chain_key(TOPIC, "archive", 2))  # a rewind takes link 2 away

    assert fate(third_try) == "dead"  # planned from a link that no longer exists
    assert fate(second_try) == "open"  # its link is undecided again
    assert fate(won) == "committed"


def test_a_corrupt_link_is_an_error_naming_its_key_never_skipped(storage):
    mine = claim(storage, None)
    storage.write(chain_key(TOPIC, "archive", 1), b"{not json")

    with pytest.raises(CorruptLink, match=r"_tokens/orders/000000000001\.json"):
        fence.newest_link(storage, TOPIC, "archive")
    with pytest.raises(CorruptLink):
        fence.check_live(storage, mine)
