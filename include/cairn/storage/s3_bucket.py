"""An `s3://bucket/prefix` archive root, on s3fs (options: `cairn.storage.s3_access.s3_options`).

S3 gives the atomicity itself: a PUT (or a multipart upload, published only when it completes)
appears whole, and `create` is a PUT with `If-None-Match: *`, which S3 refuses with 412 when the
key exists. The listings that must not grow with a folder's history are single S3 requests.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any
from urllib.parse import urlsplit

import fsspec
from fsspec import AbstractFileSystem

from cairn.storage.backend import ObjectExists
from cairn.storage.fsspec_store import FsspecStore


class S3Bucket(FsspecStore):
    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        if not parts.netloc:
            raise ValueError(f"archive root {url!r}: no bucket")
        fs = _filesystem(os.getpid(), json.dumps(options, sort_keys=True))
        super().__init__(fs, (parts.netloc + parts.path).rstrip("/"))
        self.bucket, _, key_root = self.root.partition("/")
        self.key_root = f"{key_root}/" if key_root else ""

    def create(self, key: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(self.path(key), data, mode="create")
        except (FileExistsError, OSError) as err:
            if isinstance(err, FileExistsError) or _precondition_failed(err):
                raise ObjectExists(key) from None
            raise

    def list_after(self, folder: str, start_after: str, beginning: str) -> list[str]:
        """One `StartAfter` listing (narrowed to `beginning`): finding the few files past a
        position costs the same however long the folder's history is."""
        prefix = self.key_root + folder
        replies = self._listing(
            Prefix=prefix + beginning, Delimiter="/", StartAfter=prefix + start_after
        )
        return sorted(
            item["Key"][len(self.key_root) :] for r in replies for item in r.get("Contents", [])
        )

    def name_heads(self, folder: str, delimiter: str) -> set[str]:
        """One `Delimiter` listing, however many names share each beginning."""
        prefix = self.key_root + folder
        heads = (
            item["Prefix"][len(prefix) :]
            for r in self._listing(Prefix=prefix, Delimiter=delimiter)
            for item in r.get("CommonPrefixes", [])
        )
        return {head for head in heads if "/" not in head}

    def holds_any(self, folder: str) -> bool:
        """One listing of at most one key."""
        reply = self.fs.call_s3(
            "list_objects_v2", Bucket=self.bucket, Prefix=self.key_root + folder, MaxKeys=1
        )
        return bool(reply.get("Contents"))

    def _listing(self, **kwargs: str) -> list[dict[str, Any]]:
        """The pages of one `ListObjectsV2` of the bucket."""
        pages = []
        while True:
            reply = self.fs.call_s3("list_objects_v2", Bucket=self.bucket, **kwargs)
            pages.append(reply)
            if not reply.get("IsTruncated"):
                return pages
            kwargs["ContinuationToken"] = reply["NextContinuationToken"]


FILESYSTEMS = 32
"""s3fs instances kept per process (one per set of options: a connection's, as credentials
rotate); one evicted closes its connections once no storage uses it."""
CONNECTIONS = 64
"""Connections an instance's client keeps to S3: every step and run of a process shares it
(botocore's default, 10, would queue a triggerer's steps behind each other)."""


@functools.lru_cache(maxsize=FILESYSTEMS)
def _filesystem(pid: int, options: str) -> AbstractFileSystem:
    """The process's s3fs instance for `options` (JSON). Each instance makes an S3 client of its
    own, for which botocore loads and decodes S3's service model and endpoint rules again: tens
    of milliseconds, on fsspec's one I/O thread, ahead of every request queued there. In the
    triggerer, where many runs' steps share that thread, a client per step kept it busy most of
    the time and an S3 request waited seconds. An instance holds no state of the bucket: its
    listing cache is off, as another process (a Spark task, a racing run) may have changed the
    bucket, and every decision here must see it as it is. `pid`: a forked process makes its
    own, as fsspec's loop does not survive a fork."""
    del pid  # part of the cache key only
    given = json.loads(options)
    config = {"max_pool_connections": CONNECTIONS, **given.pop("config_kwargs", {})}
    return fsspec.filesystem(
        "s3", skip_instance_cache=True, use_listings_cache=False, config_kwargs=config, **given
    )


def _precondition_failed(err: BaseException) -> bool:
    text = f"{err} {err.__cause__!r}"
    return "PreconditionFailed" in text or "412" in text
