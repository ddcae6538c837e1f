"""What local disk and S3 share: the reads, listings and deletes of a `Backend` over an fsspec
filesystem. Only how each store creates, publishes and moves an object atomically differs, and
that is each one's own class (`local_disk`, `s3_bucket`)."""

from __future__ import annotations

import contextlib
from typing import IO, Any

from fsspec import AbstractFileSystem

from cairn.storage.backend import Backend, Stat


class FsspecStore(Backend):
    """Keys under `root`, a path of the filesystem `fs`."""

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        self.fs, self.root = fs, root

    def path(self, key: str) -> str:
        """The filesystem path of `key` (a folder's with its trailing `/` dropped)."""
        return f"{self.root}/{key}".rstrip("/")

    def read(self, key: str) -> bytes:
        return self.fs.cat_file(self.path(key))

    def read_head(self, key: str, size: int) -> bytes:
        return self.fs.cat_file(self.path(key), start=0, end=size)

    def open_read(self, key: str) -> IO[bytes]:
        return self.fs.open(self.path(key), "rb")

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.path(key))

    def stat(self, key: str) -> Stat:
        info = self.fs.info(self.path(key))
        return Stat(info["size"], _version(info))

    def versions(self, folder: str) -> dict[str, str]:
        try:
            found = self.fs.find(self.path(folder), detail=True)
        except FileNotFoundError:
            return {}
        start = len(self.root) + 1
        return {  # `find` may answer a folder whose objects are gone (SeaweedFS) with itself
            path[start:]: _version(info)
            for path, info in sorted(found.items())
            if path.startswith(self.root + "/") and info["type"] == "file"
        }

    def children(self, folder: str) -> list[str]:
        base = self.path(folder)
        try:
            entries = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        start = len(self.root) + 1
        found = []
        for entry in entries:
            name = entry["name"].rstrip("/")
            if not name.startswith(self.root + "/") or name == base:
                continue
            key = name[start:]
            found.append(key + "/" if entry["type"] == "directory" else key)
        return sorted(found)

    def publish(self, staged: str, key: str) -> None:
        self.fs.put_file(staged, self.path(key))

    def move(self, source: str, target: str) -> None:
        """A server-side copy, then a delete: no bytes pass through here."""
        self.fs.copy(self.path(source), self.path(target))
        with contextlib.suppress(FileNotFoundError):  # a retried move may find it gone
            self.delete(source)

    def delete(self, key: str) -> None:
        self.fs.rm_file(self.path(key))

    def delete_prefix(self, folder: str) -> None:
        self.fs.rm(self.path(folder), recursive=True)


def _version(info: dict[str, Any]) -> str:
    """Size and ETag on S3 (a content digest), size, inode and modification time on disk."""
    tag = str(info.get("ETag") or f"{info.get('ino')}:{info.get('mtime')}").strip('"')
    return f"{info['size']}:{tag}"
