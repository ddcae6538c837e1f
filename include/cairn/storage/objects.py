"""One storage API for `file://` and `s3://` archive roots, on top of fsspec.

Everything Cairn writes goes through here, so the two promises the archive depends on hold for
both kinds of root: an object appears whole or not at all, and `create` is an atomic
create-if-absent (S3 `If-None-Match: *`, a hard link on local disk) that is how tokens commit.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import urlsplit

import fsspec

# Partial local writes live here, outside every data prefix, until they are renamed into place.
STAGING_DIR = "_staging"


class ObjectExists(Exception):
    """`create` lost: the object was already there."""


class Storage:
    """An archive root (`file:///path` or `s3://bucket/prefix`) and the objects under it.

    Keys are relative, `/`-separated paths such as `_tokens/orders/000000000001.json`.
    `options` go to the fsspec filesystem (for S3: `cairn.storage.s3_access.s3_options`).
    """

    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("file", "s3"):
            raise ValueError(f"archive root {url!r}: scheme must be file:// or s3://")
        self.url = url.rstrip("/")
        self.options = options
        self.is_local = parts.scheme == "file"
        if self.is_local:
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
            self.root = os.path.abspath(parts.path)
        else:
            if not parts.netloc:
                raise ValueError(f"archive root {url!r}: no bucket")
            # No listing cache, no shared instance: another process (a Spark task, a racing run)
            # may have changed the bucket since, and every decision here must see it as it is.
            self.fs = fsspec.filesystem(
                "s3", skip_instance_cache=True, use_listings_cache=False, **options
            )
            self.root = (parts.netloc + parts.path).rstrip("/")

    def path(self, key: str) -> str:
        """The filesystem path of `key`; refuses keys that would escape the root."""
        clean = key.strip("/")
        if not clean or any(part in ("", ".", "..") for part in clean.split("/")):
            raise ValueError(f"invalid storage key {key!r}")
        return f"{self.root}/{clean}"

    def read(self, key: str) -> bytes:
        return self.fs.cat_file(self.path(key))

    def read_head(self, key: str, size: int) -> bytes:
        """The first `size` bytes of `key` (all of it if smaller): one ranged request."""
        return self.fs.cat_file(self.path(key), start=0, end=size)

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.path(key))

    def write(self, key: str, data: bytes) -> None:
        """Write a whole object, replacing any previous one."""
        with self.open_write(key) as out:
            out.write(data)

    def create(self, key: str, data: bytes) -> None:
        """Create `key` only if absent; raise ObjectExists if it is already there."""
        if self.is_local:
            staged = self._staged(key)
            self.fs.pipe_file(staged, data)
            target = self.path(key)
            self.fs.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(staged, target)
            except FileExistsError:
                raise ObjectExists(key) from None
            finally:
                os.unlink(staged)
            return
        try:
            self.fs.pipe_file(self.path(key), data, mode="create")
        except (FileExistsError, OSError) as err:
            if _is_precondition_failure(err):
                raise ObjectExists(key) from None
            raise

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[IO[bytes]]:
        """Stream an object; it becomes visible whole on success and not at all on error.

        The bytes go to a local staging file first, so an open writer holds no upload buffer in
        memory. Locally it is then renamed into place; on S3 it is uploaded in one PUT (or a
        multipart upload, which S3 publishes only when it completes).
        """
        target = self.path(key)
        if self.is_local:
            staged = self._staged(key)
            self.fs.makedirs(os.path.dirname(staged), exist_ok=True)
        else:
            handle, staged = tempfile.mkstemp(prefix="cairn-", suffix=".part")
            os.close(handle)
        try:
            with open(staged, "wb") as out:
                yield out
            if self.is_local:
                self.fs.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(staged, target)
            else:
                self.fs.put_file(staged, target)
        finally:
            if os.path.exists(staged):
                os.unlink(staged)

    def open_read(self, key: str) -> IO[bytes]:
        return self.fs.open(self.path(key), "rb")

    def list(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` (recursively), sorted; empty if the prefix does not exist."""
        base = self.path(prefix) if prefix.strip("/") else self.root
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        start = len(self.root) + 1
        keys = (p[start:] for p in found if p.startswith(self.root + "/"))
        return sorted(k for k in keys if not k.startswith(STAGING_DIR + "/"))

    def versions(self, prefix: str = "") -> dict[str, str]:
        """Keys under `prefix` (recursively) with their versions (`version`): one listing, no
        request per key."""
        base = self.path(prefix) if prefix.strip("/") else self.root
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        start = len(self.root) + 1
        return {
            path[start:]: _version(info)
            for path, info in sorted(found.items())
            if path.startswith(self.root + "/") and not path[start:].startswith(STAGING_DIR + "/")
        }

    def version(self, key: str) -> str:
        """What changes whenever `key` is written again: its size and ETag on S3 (a content
        digest), its size, inode and modification time on local disk. FileNotFoundError if
        absent."""
        return _version(self.fs.info(self.path(key)))

    def list_after(self, prefix: str, start_after: str, beginning: str = "") -> list[str]:
        """Keys directly in folder `prefix` whose names begin with `beginning` and sort after
        `start_after`, sorted.

        On S3 this is one `StartAfter` listing (narrowed to `beginning`), so finding the few
        files past a position costs the same however long the folder's history is.
        """
        folder = prefix.rstrip("/") + "/"
        bound = folder + start_after
        if self.is_local:
            return [
                k
                for k in self.children(folder)
                if k > bound and not k.endswith("/") and k.startswith(folder + beginning)
            ]
        bucket, _, key_root = self.root.partition("/")
        strip = len(key_root) + 1 if key_root else 0
        folder_key = f"{key_root}/{folder}" if key_root else folder
        kwargs = {"Bucket": bucket, "Prefix": folder_key + beginning, "Delimiter": "/"}
        kwargs["StartAfter"] = folder_key + start_after
        found: list[str] = []
        while True:
            reply = self.fs.call_s3("list_objects_v2", **kwargs)
            found += [item["Key"][strip:] for item in reply.get("Contents", [])]
            if not reply.get("IsTruncated"):
                return sorted(found)
            kwargs["ContinuationToken"] = reply["NextContinuationToken"]

    def holds_any(self, prefix: str) -> bool:
        """Whether anything is under folder `prefix` (S3: one listing of at most one key)."""
        folder = prefix.rstrip("/") + "/"
        if self.is_local:
            return bool(self.list(folder))
        bucket, _, key_root = self.root.partition("/")
        folder_key = f"{key_root}/{folder}" if key_root else folder
        reply = self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=folder_key, MaxKeys=1)
        return bool(reply.get("Contents"))

    def name_heads(self, prefix: str, delimiter: str) -> set[str]:
        """The distinct beginnings of the names directly in folder `prefix`, up to and including
        the first `delimiter` (`10_`, `9_` for data files: their generations). On S3 this is one
        `Delimiter` listing, however many names share each beginning."""
        folder = prefix.rstrip("/") + "/"
        if self.is_local:
            names = (k[len(folder) :] for k in self.children(folder) if not k.endswith("/"))
            return {n.split(delimiter, 1)[0] + delimiter for n in names if delimiter in n}
        bucket, _, key_root = self.root.partition("/")
        folder_key = f"{key_root}/{folder}" if key_root else folder
        kwargs = {"Bucket": bucket, "Prefix": folder_key, "Delimiter": delimiter}
        found: set[str] = set()
        while True:
            reply = self.fs.call_s3("list_objects_v2", **kwargs)
            heads = (item["Prefix"][len(folder_key) :] for item in reply.get("CommonPrefixes", []))
            found |= {head for head in heads if "/" not in head}
            if not reply.get("IsTruncated"):
                return found
            kwargs["ContinuationToken"] = reply["NextContinuationToken"]

    def children(self, prefix: str) -> list[str]:
        """Keys and sub-folders (with a trailing `/`) directly in folder `prefix`, sorted."""
        base = self.path(prefix)
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

    def child(self, prefix: str) -> Storage:
        """The same root narrowed to `prefix`: what it writes lands under `prefix`."""
        return Storage(f"{self.url}/{prefix.strip('/')}", **self.options)

    def move(self, source: str, target: str) -> None:
        """Put `source` at `target` (replacing it) and remove `source`.

        A rename on local disk; on S3 a server-side copy then a delete (no bytes pass through
        here). A missing `source` whose `target` exists counts as already moved, so a retried
        move is harmless.
        """
        src, dst = self.path(source), self.path(target)
        if self.is_local:
            self.fs.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.replace(src, dst)
            except FileNotFoundError:
                if not os.path.exists(dst):
                    raise
            return
        try:
            self.fs.copy(src, dst)
        except FileNotFoundError:
            if not self.fs.exists(dst):
                raise
            return
        self.delete(source)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under folder `prefix`; a missing folder is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(prefix), recursive=True)

    def size(self, key: str) -> int:
        return self.fs.size(self.path(key))

    def delete(self, key: str) -> None:
        """Delete `key`; deleting a missing object is not an error."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path(key))

    def _staged(self, key: str) -> str:
        return self.path(f"{STAGING_DIR}/{uuid.uuid4().hex}-{os.path.basename(key)}")


def _version(info: dict[str, Any]) -> str:
    tag = str(info.get("ETag") or f"{info.get('ino')}:{info.get('mtime')}").strip('"')
    return f"{info['size']}:{tag}"


def _is_precondition_failure(err: BaseException) -> bool:
    if isinstance(err, FileExistsError):
        return True
    text = f"{err} {err.__cause__!r}"
    return "PreconditionFailed" in text or "412" in text
