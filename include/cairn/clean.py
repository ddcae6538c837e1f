"""Cleanup before a read: remove output that no surviving token covers.

A committed run only writes records below the offsets its token records, and every file is named
after its first record's offset. So any data file starting at or after the newest token's offset
for its partition (or of a partition the token does not know) was written by an attempt that
never committed: it crashed, lost a commit race, or was rewound. Deleting those before
re-reading is what keeps a re-read from duplicating records.
"""

from __future__ import annotations

from cairn.layout import manifest_key
from cairn.manifest import files_at_or_after, load
from cairn.storage import Storage
from cairn.tokens import Token


def stale_files(storage: Storage, topic: str, token: Token | None) -> list[str]:
    """Data files of `topic` no committed attempt wrote (all of them if there is no token)."""
    return files_at_or_after(storage, topic, token.next_offsets if token else {})


def orphan_manifests(storage: Storage, topic: str, token: Token | None) -> list[str]:
    """Manifests of attempts that read from at or after `token`'s position: none committed.

    A committed attempt read only below the position, so each range it read starts earlier.
    """
    position = token.next_offsets if token else {}
    folder = manifest_key(topic, "_").rsplit("/", 1)[0] + "/"
    orphans = []
    for key in storage.list(folder):
        ranges = load(storage, key).ranges.items()
        if any(end > start and start >= position.get(p, 0) for p, (start, end) in ranges):
            orphans.append(key)
    return orphans


def clean(storage: Storage, topic: str, token: Token | None) -> list[str]:
    """Delete stale data files, then the manifests describing them; return the deleted keys."""
    doomed = stale_files(storage, topic, token)
    for key in doomed:
        storage.delete(key)
    orphans = orphan_manifests(storage, topic, token)
    for key in orphans:
        storage.delete(key)
    return doomed + orphans
