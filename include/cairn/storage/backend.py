"""The storage seam: what one kind of object store does for `cairn.storage.objects.Storage`.

`Storage` is the API the rest of Cairn calls; it checks keys, picks a backend by the archive
root's scheme (`BACKENDS`), stages streamed writes and tolerates retried deletes and moves. A
backend works on checked keys relative to its root and keeps the promises the archive rests on,
which `tests/storage_promises.py` checks for every backend:

- an object appears whole or not at all (`publish`, `create`, `move`);
- `create` is an atomic create-if-absent: of racing creates of one key exactly one succeeds, the
  others raise `ObjectExists`. That is how tokens commit;
- listings are never cached: each sees every write and delete that finished before it.

`list_after`, `name_heads` and `holds_any` are defined here over `children` and `versions`; a
backend whose store answers them in fewer requests overrides them (S3: one `StartAfter`,
`Delimiter` or `MaxKeys` listing, however long a folder's history).
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from typing import IO, Any, NamedTuple


class ObjectExists(Exception):
    """`create` lost: the object was already there."""


class Stat(NamedTuple):
    size: int
    version: str
    """Changes whenever the object is written again (`Storage.version`)."""


class Backend(ABC):
    """One kind of object store under one root. Folders are `prefix/` (empty: the root)."""

    @abstractmethod
    def __init__(self, url: str, **options: Any) -> None:
        """The backend of archive root `url`; `options` are the root's (S3: s3fs options)."""

    @abstractmethod
    def read(self, key: str) -> bytes:
        """The whole object; FileNotFoundError if absent."""

    @abstractmethod
    def read_head(self, key: str, size: int) -> bytes:
        """The first `size` bytes (all of them if fewer), in one request."""

    @abstractmethod
    def open_read(self, key: str) -> IO[bytes]: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def stat(self, key: str) -> Stat:
        """FileNotFoundError if absent."""

    @abstractmethod
    def versions(self, folder: str) -> dict[str, str]:
        """Every key under `folder`, recursively, with its version; empty if there is none."""

    @abstractmethod
    def children(self, folder: str) -> list[str]:
        """Keys and sub-folders (with a trailing `/`) directly in `folder`, sorted."""

    def staging_file(self, key: str) -> str:
        """A new local file where `Storage.open_write` streams `key` before `publish`."""
        handle, staged = tempfile.mkstemp(prefix="cairn-", suffix=".part")
        os.close(handle)
        return staged

    @abstractmethod
    def publish(self, staged: str, key: str) -> None:
        """Make the finished local file `staged` the object `key`, whole, replacing any other."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Atomically create `key` only if absent; raise ObjectExists if it is there."""

    @abstractmethod
    def move(self, source: str, target: str) -> None:
        """Put `source` at `target` (replacing it), then remove `source`; FileNotFoundError if
        `source` is absent."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """FileNotFoundError if absent."""

    @abstractmethod
    def delete_prefix(self, folder: str) -> None:
        """Every object under `folder`; FileNotFoundError if there is none."""

    def list_after(self, folder: str, start_after: str, beginning: str) -> list[str]:
        """Keys directly in `folder` whose names begin with `beginning` and sort after
        `start_after`, sorted."""
        bound = folder + start_after
        return [
            k
            for k in self.children(folder)
            if k > bound and not k.endswith("/") and k.startswith(folder + beginning)
        ]

    def name_heads(self, folder: str, delimiter: str) -> set[str]:
        """The distinct beginnings of the names directly in `folder`, up to and including the
        first `delimiter`."""
        names = (k[len(folder) :] for k in self.children(folder) if not k.endswith("/"))
        return {n.split(delimiter, 1)[0] + delimiter for n in names if delimiter in n}

    def holds_any(self, folder: str) -> bool:
        return bool(self.versions(folder))
