"""One storage API for every kind of archive root: `file://`, `s3://` and, for unit tests,
`memory://`.

Everything Cairn writes goes through `Storage`, so the promises the archive depends on hold for
every root: an object appears whole or not at all, `create` is an atomic create-if-absent (how
tokens commit), and listings are never cached. Each kind of root is one `Backend` class
(`cairn.storage.backend`) that keeps them, chosen by the root's scheme in `BACKENDS`: a new
kind of store is one class and one line there.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

from cairn.storage.backend import Backend, ObjectExists
from cairn.storage.in_memory import InMemory
from cairn.storage.local_disk import LocalDisk
from cairn.storage.s3_bucket import S3Bucket

__all__ = ["BACKENDS", "ObjectExists", "Storage", "at_once"]

BACKENDS: dict[str, type[Backend]] = {"file": LocalDisk, "s3": S3Bucket, "memory": InMemory}
"""The backend of each archive root scheme."""
CONCURRENT_REQUESTS = 16
"""Requests a step that checks or moves many files sends at once (`Storage.sizes`, a commit's
publication): on S3 each takes a round trip, and a busy topic's run writes dozens of files."""

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def at_once(request: Callable[[_Item], _Result], items: Iterable[_Item]) -> list[_Result]:
    """`request` on each item, at most `CONCURRENT_REQUESTS` at a time in this process, results
    in the items' order.

    One item is sent from the caller's thread, more by one pool the whole process shares: a
    pool of their own per call (a verify's sizes, a commit's moves) started threads that cost
    more than the requests when hundreds of runs verified and committed in the triggerer at
    once (a 1,000-topic burst, benchmarks/fleet.py). `request` must not call `at_once`. Every
    request has ended when this returns or raises (the first failure, in the items' order), so
    no move of a failed publication goes on beside its retry."""
    items = list(items)
    if len(items) <= 1:
        return [request(item) for item in items]
    pool = _requests_pool()
    sent = [pool.submit(request, item) for item in items]
    wait(sent)
    return [future.result() for future in sent]


def _requests_pool() -> ThreadPoolExecutor:
    """This process's pool (a forked child makes its own: the parent's threads are not in it)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            pool = ThreadPoolExecutor(CONCURRENT_REQUESTS, thread_name_prefix="cairn-storage")
            _pool = (os.getpid(), pool)
        return _pool[1]


class Storage:
    """An archive root (`file:///path`, `s3://bucket/prefix` or `memory://name`) and the objects
    under it.

    Keys are relative, `/`-separated paths such as `_tokens/orders/000000000001.json`.
    `options` go to the backend (for S3: `cairn.storage.s3_access.s3_options`).
    """

    def __init__(self, url: str, **options: Any) -> None:
        scheme = urlsplit(url).scheme
        if scheme not in BACKENDS:
            schemes = ", ".join(f"{s}://" for s in BACKENDS)
            raise ValueError(f"archive root {url!r}: scheme must be one of {schemes}")
        self.url = url.rstrip("/")
        self.options = options
        self.backend = BACKENDS[scheme](self.url, **options)

    def read(self, key: str) -> bytes:
        return self.backend.read(_key(key))

    def read_head(self, key: str, size: int) -> bytes:
        """The first `size` bytes of `key` (all of it if smaller): one ranged request."""
        return self.backend.read_head(_key(key), size)

    def exists(self, key: str) -> bool:
        return self.backend.exists(_key(key))

    def write(self, key: str, data: bytes) -> None:
        """Write a whole object, replacing any previous one."""
        with self.open_write(key) as out:
            out.write(data)

    def create(self, key: str, data: bytes) -> None:
        """Create `key` only if absent; raise ObjectExists if it is already there."""
        self.backend.create(_key(key), data)

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[IO[bytes]]:
        """Stream an object; it becomes visible whole on success and not at all on error.

        The bytes go to a local staging file first, so an open writer holds no upload buffer in
        memory; the backend then publishes the finished file (a rename on local disk; on S3 one
        PUT, or a multipart upload, which S3 publishes only when it completes).
        """
        checked = _key(key)
        staged = self.backend.staging_file(checked)
        try:
            with open(staged, "wb") as out:
                yield out
            self.backend.publish(staged, checked)
        finally:
            if os.path.exists(staged):
                os.unlink(staged)

    def open_read(self, key: str) -> IO[bytes]:
        return self.backend.open_read(_key(key))

    def list(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` (recursively), sorted; empty if the prefix does not exist."""
        return list(self.versions(prefix))

    def versions(self, prefix: str = "") -> dict[str, str]:
        """Keys under `prefix` (recursively), sorted, with their versions (`version`): one
        listing, no request per key."""
        return self.backend.versions(_folder(prefix))

    def modified(self, prefix: str = "") -> dict[str, datetime]:
        """Keys under `prefix` (recursively) with when each was last written: one listing."""
        return self.backend.modified(_folder(prefix))

    def version(self, key: str) -> str:
        """What changes whenever `key` is written again: its size and ETag on S3 (a content
        digest), its size, inode and modification time on local disk. FileNotFoundError if
        absent."""
        return self.backend.stat(_key(key)).version

    def list_after(self, prefix: str, start_after: str, beginning: str = "") -> builtins.list[str]:
        """Keys directly in folder `prefix` whose names begin with `beginning` and sort after
        `start_after`, sorted.

        On S3 this is one `StartAfter` listing (narrowed to `beginning`), so finding the few
        files past a position costs the same however long the folder's history is.
        """
        return self.backend.list_after(_folder(prefix), start_after, beginning)

    def holds_any(self, prefix: str) -> bool:
        """Whether anything is under folder `prefix` (S3: one listing of at most one key)."""
        return self.backend.holds_any(_folder(prefix))

    def name_heads(self, prefix: str, delimiter: str) -> set[str]:
        """The distinct beginnings of the names directly in folder `prefix`, up to and including
        the first `delimiter` (`10_`, `9_` for data files: their generations). On S3 this is one
        `Delimiter` listing, however many names share each beginning."""
        return self.backend.name_heads(_folder(prefix), delimiter)

    def children(self, prefix: str) -> builtins.list[str]:
        """Keys and sub-folders (with a trailing `/`) directly in folder `prefix`, sorted."""
        return self.backend.children(_key(prefix) + "/")

    def child(self, prefix: str) -> Storage:
        """The same root narrowed to `prefix`: what it writes lands under `prefix`."""
        return Storage(f"{self.url}/{prefix.strip('/')}", **self.options)

    def move(self, source: str, target: str) -> None:
        """Put `source` at `target` (replacing it) and remove `source`.

        A rename on local disk; on S3 a server-side copy then a delete (no bytes pass through
        here). A missing `source` whose `target` exists counts as already moved, so a retried
        move is harmless.
        """
        try:
            self.backend.move(_key(source), _key(target))
        except FileNotFoundError:
            if not self.backend.exists(_key(target)):
                raise

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under folder `prefix`; a missing folder is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.backend.delete_prefix(_key(prefix) + "/")

    def size(self, key: str) -> int:
        return self.backend.stat(_key(key)).size

    def sizes(self, keys: Iterable[str]) -> dict[str, int | None]:
        """Each key's size, None if it is missing: one request each, `CONCURRENT_REQUESTS` at
        a time."""

        def size(key: str) -> int | None:
            try:
                return self.size(key)
            except FileNotFoundError:
                return None

        keys = list(keys)
        return dict(zip(keys, at_once(size, keys), strict=True))

    def delete(self, key: str) -> None:
        """Delete `key`; deleting a missing object is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.backend.delete(_key(key))


def _key(key: str) -> str:
    """`key` without surrounding slashes; refuses keys that would escape the root."""
    clean = key.strip("/")
    if not clean or any(part in ("", ".", "..") for part in clean.split("/")):
        raise ValueError(f"invalid storage key {key!r}")
    return clean


def _folder(prefix: str) -> str:
    """The folder `prefix` as backends take it: `a/b/`, or empty for the whole root."""
    return _key(prefix) + "/" if prefix.strip("/") else ""
