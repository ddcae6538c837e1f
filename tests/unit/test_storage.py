"""The storage promises (`tests/storage_promises.py`) on local disk and in memory, and what the
storage API does with a root it has no backend for."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from cairn.storage.objects import CONCURRENT_REQUESTS, Storage, at_once
from tests.forked import in_fork
from tests.storage_promises import StoragePromises


class TestLocalDisk(StoragePromises):
    @pytest.fixture
    def storage(self, tmp_path) -> Storage:
        return Storage(f"file://{tmp_path}/archive")


class TestInMemory(StoragePromises):
    @pytest.fixture
    def storage(self) -> Storage:
        return Storage(f"memory://test-{uuid.uuid4().hex}")


def test_a_root_is_served_by_the_backend_its_scheme_names(tmp_path) -> None:
    assert type(Storage(f"file://{tmp_path}").backend).__name__ == "LocalDisk"
    assert type(Storage("memory://roots").backend).__name__ == "InMemory"
    with pytest.raises(ValueError, match=r"'gs://bucket/x': scheme must be one of file://, s3://"):
        Storage("gs://bucket/x")
    with pytest.raises(ValueError, match="no bucket"):
        Storage("s3:///prefix")


def test_sizes_are_asked_at_once(monkeypatch) -> None:
    """A verify asks one size per file the run wrote: on S3 each is a round trip, so they go
    together, not one after another."""
    storage = Storage(f"memory://test-{uuid.uuid4().hex}")
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        storage.write(key, key.encode())
    together = threading.Barrier(len(keys), timeout=5)
    stat = storage.backend.stat

    def waiting_stat(key: str):
        together.wait()  # returns only once every key's request has begun
        return stat(key)

    monkeypatch.setattr(storage.backend, "stat", waiting_stat)
    assert storage.sizes(keys) == {key: 2 for key in keys}


def test_one_request_is_sent_from_the_callers_thread_many_together_in_order() -> None:
    """A commit of one file starts no thread (hundreds of runs commit at once in the
    triggerer); more than one go together, up to `CONCURRENT_REQUESTS`, answers in order."""
    caller = threading.get_ident()
    assert at_once(lambda item: (item, threading.get_ident()), ["only"]) == [("only", caller)]
    assert at_once(str, []) == []
    count = CONCURRENT_REQUESTS + 4
    together = threading.Barrier(CONCURRENT_REQUESTS, timeout=5)

    def request(item: int) -> tuple[int, int]:
        if item < CONCURRENT_REQUESTS:
            together.wait()  # only returns once CONCURRENT_REQUESTS requests are in flight
        return item, threading.get_ident()

    answers = at_once(request, range(count))
    assert [item for item, _ in answers] == list(range(count))
    assert caller not in {thread for _, thread in answers}


def test_a_failed_request_raises_only_once_every_request_has_ended() -> None:
    """A publication that fails is retried: none of its moves may still be going on then."""
    ended = []

    def request(item: int) -> int:
        if item == 0:
            raise ConnectionError("S3 hiccup")
        time.sleep(0.2)
        ended.append(item)
        return item

    with pytest.raises(ConnectionError, match="hiccup"):
        at_once(request, range(4))
    assert sorted(ended) == [1, 2, 3]


def test_requests_share_one_pool_per_process_and_a_forked_child_makes_its_own() -> None:
    """Hundreds of verifies and commits at once in the triggerer start no threads of their
    own; a child forked after the pool started (the parent's threads are not in it) still
    gets its answers."""

    def name(_: int) -> str:
        time.sleep(0.01)
        return threading.current_thread().name

    first, again = set(at_once(name, range(40))), set(at_once(name, range(40)))
    assert len(first | again) <= CONCURRENT_REQUESTS
    assert all(thread.startswith("cairn-storage") for thread in first | again)
    assert in_fork(
        lambda: at_once(lambda item: item * 2, range(20)) == list(range(0, 40, 2)),
        10,
        "the forked child's requests never ran: it used its parent's pool",
    )
