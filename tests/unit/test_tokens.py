"""Offset tokens on a real local archive root: commits through the fence, rewinds, corruption."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from cairn import fence, tokens
from cairn.fence import Fenced
from cairn.layout import token_key
from cairn.storage import Storage
from cairn.tokens import CorruptToken, Counts, RewindRefused, Token
from tests.unit.conftest import T0, claim_next, commit_next, make_token


def commit_chain(storage: Storage, *positions: dict[int, int], **fields) -> list[Token]:
    """Commit tokens 1..n, each claimed and planned from the one before, as real runs would."""
    return [commit_next(storage, position, **fields) for position in positions]


def test_first_commit_becomes_newest_with_string_partition_keys(storage):
    assert tokens.newest(storage, "orders") is None
    assert tokens.next_seq(None) == 1
    [token] = commit_chain(storage, {0: 10, 3: 7})

    assert tokens.newest(storage, "orders") == token
    assert tokens.next_seq(token) == 2
    stored = json.loads(storage.read(token_key("orders", 1)))
    assert stored["next_offsets"] == {"0": 10, "3": 7}
    assert stored["attempt_id"] == token.attempt_id


def test_runs_planned_from_the_same_position_exactly_one_commits(storage):
    barrier = threading.Barrier(8)
    won, lost = [], []

    def attempt(i: int) -> None:
        barrier.wait()
        claim = fence.claim(storage, "orders", "archive", None, f"run-{i}", lambda c: b"{}")
        token = make_token(1, {0: 10 * (i + 1)}, attempt_id=claim.attempt_id)
        try:
            tokens.commit(storage, token, claim)
            won.append(token)
        except Fenced as err:
            lost.append(str(err))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(won) == 1 and len(lost) == 7
    assert all("'orders'" in msg and "(link 1)" in msg for msg in lost)
    assert tokens.list_tokens(storage, "orders") == won


def test_commit_retried_by_the_same_attempt_succeeds_without_rewriting(storage):
    claim = claim_next(storage)
    token = make_token(1, {0: 10}, attempt_id=claim.attempt_id)
    assert tokens.commit(storage, token, claim) is True

    retried = token.model_copy(update={"created_at": T0 + timedelta(days=1)})
    assert tokens.commit(storage, retried, claim) is False
    assert tokens.newest(storage, "orders") == token


@pytest.mark.parametrize("update", [{"seq": 2}, {"attempt_id": "a-000000000001-000009-abcdef"}])
def test_commit_refuses_a_token_that_is_not_its_claims(storage, update):
    claim = claim_next(storage)
    token = make_token(1, {0: 10}, attempt_id=claim.attempt_id).model_copy(update=update)

    with pytest.raises(ValueError, match="does not belong to"):
        tokens.commit(storage, token, claim)
    assert tokens.newest(storage, "orders") is None


def test_commit_refuses_a_run_planned_before_a_rewind(storage):
    chain = commit_chain(storage, {0: 10}, {0: 20}, {0: 30})
    stale_claim = claim_next(storage)
    stale_run = make_token(4, {0: 40}, chain[-1].next_offsets, attempt_id=stale_claim.attempt_id)
    tokens.rewind(storage, "orders", count=2, low_watermarks=None)

    with pytest.raises(Fenced, match="planned from link 3 but the newest is now link 1"):
        tokens.commit(storage, stale_run, stale_claim)
    assert tokens.newest(storage, "orders") == chain[0]


def test_commit_refuses_when_history_was_rewritten_to_the_same_seq(storage):
    chain = commit_chain(storage, {0: 10}, {0: 20})
    stale_claim = claim_next(storage)
    stale_run = make_token(3, {0: 40}, chain[-1].next_offsets, attempt_id=stale_claim.attempt_id)
    tokens.rewind(storage, "orders", count=1, low_watermarks=None)
    rewritten = commit_next(storage, {0: 15}, created_at=T0 + timedelta(days=1))
    assert rewritten.seq == 2

    with pytest.raises(Fenced):
        tokens.commit(storage, stale_run, stale_claim)
    assert tokens.newest(storage, "orders") == rewritten


def test_list_and_newest_ignore_foreign_keys_and_other_topics(storage):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3})
    storage.write("_tokens/orders/README.md", b"hello")
    storage.write("_tokens/orders/000000000009.json.tmp", b"{}")
    storage.write("_tokens/orders/old/000000000009.json", b"{}")
    commit_next(storage, {0: 999}, topic="orders-eu")

    assert tokens.list_tokens(storage, "orders") == chain
    assert tokens.newest(storage, "orders") == chain[-1]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"seq": 3}', json.dumps({"seq": 2, "topic": "orders"}).encode()],
)
def test_corrupt_newest_token_is_an_error_naming_the_key(storage, content):
    commit_chain(storage, {0: 1}, {0: 2})
    storage.write(token_key("orders", 3), content)

    with pytest.raises(CorruptToken, match=r"_tokens/orders/000000000003\.json"):
        tokens.newest(storage, "orders")
    with pytest.raises(CorruptToken):
        tokens.list_tokens(storage, "orders")


def test_token_claiming_another_seq_is_corrupt(storage):
    commit_chain(storage, {0: 1})
    storage.write(token_key("orders", 2), make_token(5, {0: 9}).model_dump_json().encode())

    with pytest.raises(CorruptToken, match="claims topic 'orders' seq 5"):
        tokens.newest(storage, "orders")


def test_corrupt_newest_token_can_be_rewound_away(storage):
    chain = commit_chain(storage, {0: 1}, {0: 2})
    storage.write(token_key("orders", 3), b"garbage")

    deleted = tokens.rewind(storage, "orders", count=1, low_watermarks={0: 0})
    assert deleted == [token_key("orders", 3)]
    assert tokens.newest(storage, "orders") == chain[-1]


def test_rewind_by_count_deletes_newest_first(storage):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3}, {0: 4}, {0: 5})

    deleted = tokens.rewind(storage, "orders", count=2, low_watermarks={0: 0})
    assert deleted == [token_key("orders", 5), token_key("orders", 4)]
    assert tokens.list_tokens(storage, "orders") == chain[:3]


def test_rewind_to_seq_keeps_that_token_newest(storage):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3}, {0: 4})

    assert len(tokens.rewind(storage, "orders", to_seq=2, low_watermarks=None)) == 2
    assert tokens.newest(storage, "orders") == chain[1]
    assert tokens.rewind(storage, "orders", to_seq=2, low_watermarks=None) == []


def test_rewind_to_zero_deletes_every_token(storage):
    commit_chain(storage, {0: 1}, {0: 2})

    assert len(tokens.rewind(storage, "orders", to_seq=0, low_watermarks={0: 0})) == 2
    assert tokens.newest(storage, "orders") is None


def test_rewind_before_a_time_deletes_tokens_created_at_or_after_it(storage):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3}, {0: 4})
    # token n was created at T0 + n hours

    deleted = tokens.rewind(storage, "orders", before=T0 + timedelta(hours=3), low_watermarks=None)
    assert deleted == [token_key("orders", 4), token_key("orders", 3)]
    assert tokens.newest(storage, "orders") == chain[1]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"count": 1, "to_seq": 1}, {"count": 4}, {"count": -1}, {"to_seq": 7}],
)
def test_invalid_rewinds_delete_nothing(storage, kwargs):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3})

    with pytest.raises(ValueError):
        tokens.rewind(storage, "orders", low_watermarks=None, **kwargs)
    assert tokens.list_tokens(storage, "orders") == chain


def test_rewind_past_retention_is_refused_and_deletes_nothing(storage):
    chain = commit_chain(storage, {0: 100, 1: 5}, {0: 200, 1: 9})

    with pytest.raises(RewindRefused, match=r"partition 0.*\[100, 150\).*retention"):
        tokens.rewind(storage, "orders", count=1, low_watermarks={0: 150, 1: 0})
    assert tokens.list_tokens(storage, "orders") == chain

    assert tokens.rewind(storage, "orders", count=1, low_watermarks={0: 100, 1: 5}) == [
        token_key("orders", 2)
    ]


@pytest.mark.parametrize(
    ("low", "allowed"),
    [({0: 0, 1: 0}, True), ({0: 0, 1: 3}, False), ({0: 0}, False)],
)
def test_rewinding_before_a_partition_existed_needs_it_whole_in_kafka(storage, low, allowed):
    commit_chain(storage, {0: 10}, {0: 20, 1: 8})  # partition 1 appeared in run 2

    if allowed:
        assert len(tokens.rewind(storage, "orders", count=1, low_watermarks=low)) == 1
    else:
        with pytest.raises(RewindRefused, match="partition 1"):
            tokens.rewind(storage, "orders", count=1, low_watermarks=low)
        assert tokens.newest(storage, "orders").seq == 2


def test_rewind_all_needs_every_partition_whole_in_kafka(storage):
    commit_chain(storage, {0: 10})

    with pytest.raises(RewindRefused, match=r"the beginning.*\[0, 4\)"):
        tokens.rewind(storage, "orders", to_seq=0, low_watermarks={0: 4})
    assert tokens.newest(storage, "orders").seq == 1


def test_crash_midway_through_a_rewind_leaves_a_consistent_newest(storage, monkeypatch):
    chain = commit_chain(storage, {0: 1}, {0: 2}, {0: 3}, {0: 4})
    real_delete, calls = storage.delete, []

    def crash_on_second(key: str) -> None:
        calls.append(key)
        if len(calls) == 2:
            raise OSError("connection lost")
        real_delete(key)

    monkeypatch.setattr(storage, "delete", crash_on_second)
    with pytest.raises(OSError):
        tokens.rewind(storage, "orders", to_seq=1, low_watermarks=None)

    assert tokens.newest(storage, "orders") == chain[2]


def test_rewind_ignores_partitions_that_were_never_archived(storage):
    commit_chain(storage, {0: 10}, {0: 20})

    assert len(tokens.rewind(storage, "orders", count=1, low_watermarks={0: 0, 1: 500})) == 1


def test_rewinding_a_compacted_topic_is_refused_once_the_rewound_runs_read_anything(storage):
    commit_chain(storage, {0: 10})  # read nothing: only recorded a position
    chain = commit_chain(storage, {0: 20}, counts=Counts(read=10))

    with pytest.raises(RewindRefused, match="compacted"):
        tokens.rewind(storage, "orders", count=1, low_watermarks={0: 0}, compacted=True)
    assert tokens.newest(storage, "orders") == chain[-1]


def test_rewinding_a_compacted_topic_over_runs_that_read_nothing_is_allowed(storage):
    commit_chain(storage, {0: 10}, counts=Counts(read=10))
    commit_chain(storage, {0: 10, 1: 0})  # a new partition appeared, nothing read

    deleted = tokens.rewind(storage, "orders", count=1, low_watermarks={0: 0, 1: 0}, compacted=True)
    assert deleted == [token_key("orders", 2)]
