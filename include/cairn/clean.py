"""Cleanup before a read: remove output that no surviving token covers.

A committed run only writes records below the offsets its token records, and every file is named
after its first record's offset. So any data file starting at or after the newest token's offset
for its partition (or of a partition the token does not know) was written by an attempt that
never committed: it crashed, lost a commit race, or was rewound. Deleting those before
re-reading is what keeps a re-read from duplicating records.
"""

from __future__ import annotations

from cairn.manifest import files_at_or_after
from cairn.storage import Storage
from cairn.tokens import Token


def stale_files(storage: Storage, topic: str, token: Token | None) -> list[str]:
    """Data files of `topic` no committed attempt wrote (all of them if there is no token)."""
    return files_at_or_after(storage, topic, token.next_offsets if token else {})


def clean(storage: Storage, topic: str, token: Token | None) -> list[str]:
    """Delete stale data files; return their keys.

    Manifests stay: they are the record of what every attempt wrote (crashed ones included), and
    a run racing this one may still commit a token that references its manifest.
    """
    doomed = stale_files(storage, topic, token)
    for key in doomed:
        storage.delete(key)
    return doomed
