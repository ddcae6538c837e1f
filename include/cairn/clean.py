"""Cleanup before a read: output that a rewind took out of the archive, removed only if re-readable.

Data folders hold only what committed runs published (`cairn.staging`), and every data file is
named after its first record's offset. So a data file at or after the newest token's offset for
its partition was published by a run whose token has since been deleted: a rewind. The next read
covers those offsets again, so the files must go first, or the re-read would duplicate them.

But a rewound file may hold the only copy of a record: Kafka's retention may have deleted it
since, or compaction (`cleanup.policy=compact`) may have removed an older value of its key. So
cleanup deletes rewound files only when the run re-reads every one of their offsets from a
topic that is not compacted; otherwise the run is refused, nothing is deleted, and the message
says how to restore the tokens or rebuild instead.

Finding rewound files is cheap: one listing per backup partition folder that starts after the
position (S3 `StartAfter`), so a run that follows a committed run lists no history.
"""

from __future__ import annotations

from collections.abc import Mapping

from cairn.layout import DataFile, parse_data_key
from cairn.manifest import files_at_or_after
from cairn.storage import Storage
from cairn.tokens import RewindRefused


def rewound_backups(
    storage: Storage, topic: str, position: Mapping[int, int], generation: int
) -> list[DataFile]:
    """Backup files at or after `position` (any partition, generations 1..`generation`)."""
    found: dict[str, DataFile] = {}
    for folder in storage.children(f"backup/{topic}/"):
        name = folder.rstrip("/").rsplit("/", 1)[-1]
        if not name.startswith("partition=") or not name[10:].isdigit():
            continue
        p = int(name[10:])
        start = position.get(p, 0)
        for gen in range(1, generation + 1):
            for key in storage.list_after(folder, f"{gen}_{p}_{start:020d}"):
                f = parse_data_key(key)
                if f is not None and f.kind == "backup" and f.first_offset >= start:
                    found[key] = f
    return sorted(found.values(), key=lambda f: (f.partition, f.first_offset))


def check_rereadable(
    topic: str, rewound: list[DataFile], starts: Mapping[int, int], compacted: bool
) -> None:
    """Refuse (deleting nothing) unless the run re-reads every rewound file's records.

    `starts` are where the run's reads begin per partition, after retention gaps.
    """
    lost = [f for f in rewound if compacted or f.first_offset < starts.get(f.partition, 0)]
    if not lost:
        return
    where = ", ".join(
        f"partition {f.partition} from offset {f.first_offset} ({f.key})" for f in lost[:5]
    )
    why = (
        "the topic is compacted (cleanup.policy=compact), so a re-read may return fewer records"
        if compacted
        else "Kafka no longer holds them (retention) or the run would not re-read them"
    )
    raise RewindRefused(
        f"topic {topic!r}: the newest tokens were deleted (a rewind), but the archive holds "
        f"records of the rewound runs that cannot be read again: {where}; {why}. Nothing was "
        "deleted. Restore the deleted tokens (rewind less), or leave the tokens and re-derive "
        "the output with the rebuild DAG (README, Operating)"
    )


def delete_rewound(storage: Storage, topic: str, position: Mapping[int, int]) -> list[str]:
    """Delete every data file at or after `position`; return their keys.

    Only called once `check_rereadable` passed, when a rewind left such files: the listing
    covers the topic's whole archive, which only a rewind makes necessary.
    """
    doomed = files_at_or_after(storage, topic, position)
    for key in doomed:
        storage.delete(key)
    return doomed
