"""Staging: an attempt's files wait under its own prefix until its link commits.

Data folders hold only what a committed link names, so a reader listing them never sees an
attempt that has not committed (a running one, a crashed one, or a zombie fenced out by
`cairn.fence`). Each file is written once, under `_attempts/<topic>/<attempt>/<final key>`, and
published by a move: a rename on local disk, a server-side copy on S3.

Before an attempt commits it stores its publication (the files to move in and, for a rebuild,
the stale files to delete); after its link is created anyone may carry that out, so a commit
that crashes halfway through publishing is finished by the next run (`settle`).
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, Field

from cairn import fence
from cairn.layout import attempt_prefix, attempts_folder
from cairn.storage import Storage

log = logging.getLogger(__name__)

_PUBLICATION = "_publication.json"


class Publication(BaseModel):
    """What committing an attempt does to the data folders."""

    move: list[str]
    """Final keys of the staged files, moved into place."""
    delete: list[str] = Field(default_factory=list)
    """Keys deleted once every file is in place (a rebuild's stale files)."""


def staged(storage: Storage, topic: str, attempt_id: str) -> Storage:
    """Where the attempt writes: its files keep their final keys below its prefix."""
    return storage.child(attempt_prefix(topic, attempt_id))


def prepare(storage: Storage, topic: str, attempt_id: str, publication: Publication) -> None:
    """Store the publication before the link is created (rewriting it is harmless)."""
    key = attempt_prefix(topic, attempt_id) + _PUBLICATION
    storage.write(key, publication.model_dump_json().encode())


def publish(storage: Storage, topic: str, attempt_id: str) -> Publication:
    """Carry out a committed attempt's publication; idempotent, so a retry finishes it."""
    prefix = attempt_prefix(topic, attempt_id)
    try:
        done = Publication.model_validate_json(storage.read(prefix + _PUBLICATION))
    except FileNotFoundError:  # already published; what is left is a late duplicate's writes
        discard(storage, topic, attempt_id)
        return Publication(move=[])
    for key in done.move:
        storage.move(prefix + key, key)
    for key in done.delete:
        storage.delete(key)
    discard(storage, topic, attempt_id)
    return done


def discard(storage: Storage, topic: str, attempt_id: str) -> None:
    storage.delete_prefix(attempt_prefix(topic, attempt_id))


def settle(storage: Storage, topic: str) -> dict[str, list[str]]:
    """Finish publishing committed attempts and discard dead ones; leave open ones alone.

    Cheap when nothing is pending: one listing of the topic's `_attempts/` folder.
    """
    settled: dict[str, list[str]] = {"published": [], "discarded": []}
    for folder in storage.children(attempts_folder(topic)):
        attempt_id = folder.rstrip("/").rsplit("/", 1)[-1]
        state = fence.fate(storage, topic, attempt_id)
        if state == "committed":
            publish(storage, topic, attempt_id)
            settled["published"].append(attempt_id)
        elif state == "dead":
            discard(storage, topic, attempt_id)
            settled["discarded"].append(attempt_id)
    for what, ids in settled.items():
        if ids:
            log.info("topic %s: %s attempts %s", topic, what, ", ".join(ids))
    return settled
