"""A `memory://name/prefix` archive root: objects in this process's memory, for unit tests of
pure logic.

It keeps the same promises as the real stores (`tests/storage_promises.py` runs on it too): one
lock makes every change and every read of the shared store atomic, so an object appears whole,
of racing creates exactly one wins, and a listing sees every change made before it. Roots of
the same name share their objects, as two clients of one bucket do.
"""

from __future__ import annotations

import io
import itertools
import threading
from datetime import UTC, datetime
from typing import IO, Any, ClassVar
from urllib.parse import urlsplit

from cairn.storage.backend import Backend, ObjectExists, Stat


class InMemory(Backend):
    _objects: ClassVar[dict[str, tuple[bytes, int, datetime]]] = {}
    """Every memory root's objects by full path, with the write that made each (its version)
    and when it was made."""
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _writes: ClassVar[itertools.count[int]] = itertools.count(1)

    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        self.root = (parts.netloc + parts.path).rstrip("/")

    def read(self, key: str) -> bytes:
        with self._lock:
            found = self._objects.get(self._path(key))
        if found is None:
            raise FileNotFoundError(key)
        return found[0]

    def read_head(self, key: str, size: int) -> bytes:
        return self.read(key)[:size]

    def open_read(self, key: str) -> IO[bytes]:
        return io.BytesIO(self.read(key))

    def exists(self, key: str) -> bool:
        with self._lock:
            return self._path(key) in self._objects

    def stat(self, key: str) -> Stat:
        with self._lock:
            found = self._objects.get(self._path(key))
        if found is None:
            raise FileNotFoundError(key)
        return Stat(len(found[0]), f"{len(found[0])}:{found[1]}")

    def versions(self, folder: str) -> dict[str, str]:
        base = self._path(folder) + "/"
        with self._lock:
            found = [(p, d, n) for p, (d, n, _) in self._objects.items() if p.startswith(base)]
        start = len(self.root) + 1
        return {p[start:]: f"{len(d)}:{n}" for p, d, n in sorted(found)}

    def modified(self, folder: str) -> dict[str, datetime]:
        base = self._path(folder) + "/"
        with self._lock:
            found = [(p, when) for p, (_, _, when) in self._objects.items() if p.startswith(base)]
        start = len(self.root) + 1
        return {p[start:]: when for p, when in sorted(found)}

    def children(self, folder: str) -> list[str]:
        found = set()
        for key in self.versions(folder):
            name, slash, _ = key[len(folder) :].partition("/")
            found.add(folder + name + slash)
        return sorted(found)

    def publish(self, staged: str, key: str) -> None:
        with open(staged, "rb") as f:
            data = f.read()
        with self._lock:
            self._objects[self._path(key)] = (data, next(self._writes), datetime.now(UTC))

    def create(self, key: str, data: bytes) -> None:
        with self._lock:
            if self._path(key) in self._objects:
                raise ObjectExists(key)
            self._objects[self._path(key)] = (data, next(self._writes), datetime.now(UTC))

    def move(self, source: str, target: str) -> None:
        with self._lock:
            found = self._objects.pop(self._path(source), None)
            if found is None:
                raise FileNotFoundError(source)
            self._objects[self._path(target)] = found  # as a rename on disk: the same version

    def delete(self, key: str) -> None:
        with self._lock:
            if self._objects.pop(self._path(key), None) is None:
                raise FileNotFoundError(key)

    def delete_prefix(self, folder: str) -> None:
        base = self._path(folder) + "/"
        with self._lock:
            doomed = [p for p in self._objects if p.startswith(base)]
            for p in doomed:
                del self._objects[p]
        if not doomed:
            raise FileNotFoundError(folder)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}".rstrip("/")
