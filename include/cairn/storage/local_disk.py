"""A `file://` archive root: a folder on local disk (or a shared mount).

Atomicity comes from the filesystem: a streamed object is staged inside the root, in
`STAGING_DIR`, and renamed into place, and `create` hard-links a staged file to its key, which
fails if the key exists; a rename or a link either happens whole or not at all.
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import urlsplit

import fsspec

from cairn.storage.backend import ObjectExists
from cairn.storage.fsspec_store import FsspecStore

STAGING_DIR = "_staging"
"""Partial local writes live here, outside every data prefix, until they are renamed into place
(on the same filesystem as their keys, so the rename is atomic); `Storage` lists none of it."""


class LocalDisk(FsspecStore):
    def __init__(self, url: str, **options: Any) -> None:
        fs = fsspec.filesystem("file", auto_mkdir=True)
        super().__init__(fs, os.path.abspath(urlsplit(url).path))

    def staging_file(self, key: str) -> str:
        staged = self.path(f"{STAGING_DIR}/{uuid.uuid4().hex}-{os.path.basename(key)}")
        os.makedirs(os.path.dirname(staged), exist_ok=True)
        return staged

    def publish(self, staged: str, key: str) -> None:
        target = self.path(key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(staged, target)

    def create(self, key: str, data: bytes) -> None:
        staged = self.staging_file(key)
        target = self.path(key)
        try:
            with open(staged, "wb") as out:
                out.write(data)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.link(staged, target)
        except FileExistsError:
            raise ObjectExists(key) from None
        finally:
            os.unlink(staged)

    def move(self, source: str, target: str) -> None:
        """A rename: atomic, and no bytes are copied."""
        self.publish(self.path(source), target)

    def versions(self, folder: str) -> dict[str, str]:
        found = super().versions(folder)
        return {k: v for k, v in found.items() if not k.startswith(STAGING_DIR + "/")}
