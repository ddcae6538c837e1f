"""Cleanup after a rewind: finding the rewound output cheaply, refusing to delete what Kafka cannot
return, and deleting exactly the rewound output when it can."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from cairn.clean import check_rereadable, delete_rewound, rewound_backups
from cairn.layout import DataFile, backup_key, parse_data_key, partitioned_key, quarantine_key
from cairn.manifest import Manifest, save
from cairn.storage import Storage
from cairn.tokens import RewindRefused

NOW = datetime(2024, 5, 1, tzinfo=UTC)
HOUR = "dt=2024-05-01/hr=00"
DAY = date(2024, 5, 1)
POSITION = {0: 100, 1: 50}


def write_all(storage: Storage, keys: list[str]) -> list[str]:
    for key in keys:
        storage.write(key, b"avro")
    return keys


def save_manifest(storage: Storage, attempt: str, ranges: dict[int, tuple[int, int]]) -> str:
    return save(
        storage,
        Manifest(
            topic="orders",
            attempt_id=attempt,
            run_id=attempt,
            generation=1,
            ranges=ranges,
            records_read={},
            files=[],
            processing_time=NOW,
            created_at=NOW,
        ),
    )


@pytest.fixture
def archive(storage):
    """Output below the position {0: 100, 1: 50}, rewound output at or after it, and strangers."""
    kept = write_all(
        storage,
        [
            backup_key("orders", 1, 0, 0),
            backup_key("orders", 1, 0, 60),
            backup_key("orders", 2, 0, 99),
            partitioned_key("orders", 1, 0, 99, HOUR),
            quarantine_key("orders", 1, 1, 10, DAY),
        ],
    )
    rewound = write_all(
        storage,
        [
            backup_key("orders", 1, 0, 100),  # exactly at the position
            backup_key("orders", 2, 0, 120),  # another generation
            backup_key("orders", 1, 1, 50),
            backup_key("orders", 1, 2, 0),  # a partition the position does not know
            partitioned_key("orders", 2, 0, 120, HOUR),
            quarantine_key("orders", 1, 1, 50, DAY),
        ],
    )
    foreign = write_all(
        storage,
        [
            "backup/orders/_SUCCESS",
            "backup/orders/partition=0/notes.txt",
            "backup/orders/partition=x/1_0_00000000000000000500.avro",
            backup_key("orders-eu", 1, 0, 500),
            "_tokens/orders/000000000002.json",
        ],
    )
    return kept, rewound, foreign


class ListingStorage(Storage):
    """A local root that records how it was listed."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.listed: list[str] = []
        self.started_after: list[str] = []

    def list(self, prefix: str = "") -> list[str]:
        self.listed.append(prefix)
        return super().list(prefix)

    def list_after(self, prefix: str, start_after: str) -> list[str]:
        self.started_after.append(prefix + start_after)
        return super().list_after(prefix, start_after)


def test_rewound_backups_are_the_backup_files_at_or_after_the_position(storage, archive):
    _, rewound, _ = archive

    found = rewound_backups(storage, "orders", POSITION, generation=2)

    assert [f.key for f in found] == [k for k in rewound if k.startswith("backup/")]
    assert found[0] == DataFile("backup", "orders", "partition=0", 1, 0, 100)


def test_rewound_backups_list_each_generation_from_the_position_only(tmp_path):
    storage = ListingStorage(f"file://{tmp_path}/archive")
    for gen in (1, 2, 3):
        write_all(storage, [backup_key("orders", gen, 0, offset) for offset in (0, 40, 100, 140)])

    found = rewound_backups(storage, "orders", {0: 100}, generation=3)

    assert [(f.gen, f.first_offset) for f in found] == [
        (gen, offset) for offset in (100, 140) for gen in (1, 2, 3)
    ]
    assert storage.listed == []  # no recursive listing of the history
    folder = "backup/orders/partition=0/"
    assert storage.started_after == [f"{folder}{gen}_0_{100:020d}" for gen in (1, 2, 3)]


def test_nothing_is_rewound_after_a_committed_run(storage, archive):
    assert rewound_backups(storage, "orders", {0: 200, 1: 60, 2: 5}, generation=2) == []


def rewound(*coordinates: tuple[int, int]) -> list[DataFile]:
    return [parse_data_key(backup_key("orders", 1, p, offset)) for p, offset in coordinates]


def test_rereadable_rewound_output_passes():
    check_rereadable("orders", rewound((0, 100), (1, 50)), {0: 100, 1: 50}, compacted=False)
    check_rereadable("orders", [], {}, compacted=True)


def test_a_compacted_topic_refuses_any_rewound_output_naming_it():
    with pytest.raises(RewindRefused, match=r"partition 1 from offset 50 .*compacted") as refused:
        check_rereadable("orders", rewound((1, 50)), {1: 0}, compacted=True)
    assert "'orders'" in str(refused.value) and "Nothing was deleted" in str(refused.value)


def test_rewound_output_below_where_the_run_reads_is_refused_naming_partition_and_offset():
    files = rewound((0, 100), (0, 130), (1, 50))
    starts = {0: 120, 1: 50}  # retention took partition 0 up to 120

    with pytest.raises(RewindRefused, match="retention") as refused:
        check_rereadable("orders", files, starts, compacted=False)
    message = str(refused.value)
    assert f"partition 0 from offset 100 ({files[0].key})" in message
    assert "offset 130" not in message and "partition 1" not in message


def test_delete_rewound_deletes_exactly_the_rewound_output_of_every_kind(storage, archive):
    kept, rewound_keys, foreign = archive

    deleted = delete_rewound(storage, "orders", POSITION)

    assert sorted(deleted) == sorted(rewound_keys)
    assert all(storage.exists(k) for k in kept + foreign)
    assert not any(storage.exists(k) for k in rewound_keys)
    assert delete_rewound(storage, "orders", POSITION) == []


def test_after_a_rewind_only_the_rewound_run_goes_and_manifests_stay(storage):
    run1 = write_all(
        storage, [backup_key("orders", 1, 0, 0), partitioned_key("orders", 1, 0, 0, HOUR)]
    )
    manifest1 = save_manifest(storage, "run-1", {0: (0, 50)})
    run2 = write_all(
        storage, [backup_key("orders", 1, 0, 50), partitioned_key("orders", 1, 0, 50, HOUR)]
    )
    manifest2 = save_manifest(storage, "run-2", {0: (50, 100)})

    # token 2 ({0: 100}) was deleted by a rewind; token 1 ({0: 50}) is the newest again
    assert [f.key for f in rewound_backups(storage, "orders", {0: 50}, 1)] == [run2[0]]
    deleted = delete_rewound(storage, "orders", {0: 50})

    assert sorted(deleted) == sorted(run2)
    assert all(storage.exists(k) for k in [*run1, manifest1, manifest2])
