"""Cleanup removes exactly the output no surviving token covers, and nothing else."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from cairn.clean import clean, stale_files
from cairn.layout import backup_key, partitioned_key, quarantine_key
from cairn.manifest import Manifest, save
from cairn.storage import Storage
from tests.unit.conftest import make_token

NOW = datetime(2024, 5, 1, tzinfo=UTC)
HOUR = "dt=2024-05-01/hr=00"
DAY = date(2024, 5, 1)


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
    """Committed output below the position {0: 100, 1: 50}, uncommitted output at or after it."""
    committed = write_all(
        storage,
        [
            backup_key("orders", 1, 0, 0),
            backup_key("orders", 1, 0, 60),
            partitioned_key("orders", 1, 0, 99, HOUR),
            quarantine_key("orders", 1, 1, 10, DAY),
        ],
    )
    uncommitted = write_all(
        storage,
        [
            backup_key("orders", 1, 0, 100),  # exactly at the position
            partitioned_key("orders", 2, 0, 120, HOUR),  # another generation
            quarantine_key("orders", 1, 1, 50, DAY),
            backup_key("orders", 1, 2, 0),  # a partition the token does not know
        ],
    )
    foreign = write_all(
        storage,
        [
            "backup/orders/_SUCCESS",
            "backup/orders/partition=0/notes.txt",
            backup_key("orders-eu", 1, 0, 500),
            "_tokens/orders/000000000002.json",
        ],
    )
    return committed, uncommitted, foreign


def test_stale_files_are_exactly_those_at_or_after_the_position(storage, archive):
    _, uncommitted, _ = archive

    newest = make_token(2, {0: 100, 1: 50})
    assert sorted(stale_files(storage, "orders", newest)) == sorted(uncommitted)


def test_clean_deletes_uncommitted_output_and_keeps_everything_else(storage, archive):
    committed, uncommitted, foreign = archive

    deleted = clean(storage, "orders", make_token(2, {0: 100, 1: 50}))

    assert sorted(deleted) == sorted(uncommitted)
    assert all(storage.exists(k) for k in committed + foreign)
    assert not any(storage.exists(k) for k in uncommitted)
    assert clean(storage, "orders", make_token(2, {0: 100, 1: 50})) == []


def test_without_a_token_every_data_file_of_the_topic_is_stale(storage, archive):
    committed, uncommitted, foreign = archive

    assert sorted(clean(storage, "orders", None)) == sorted(committed + uncommitted)
    assert all(storage.exists(k) for k in foreign)


def test_clean_after_a_rewind_removes_the_rewound_run_only(storage):
    run1 = write_all(
        storage, [backup_key("orders", 1, 0, 0), partitioned_key("orders", 1, 0, 0, HOUR)]
    )
    manifest1 = save_manifest(storage, "run-1", {0: (0, 50)})
    run2 = write_all(
        storage, [backup_key("orders", 1, 0, 50), partitioned_key("orders", 1, 0, 50, HOUR)]
    )
    manifest2 = save_manifest(storage, "run-2", {0: (50, 100)})

    # token 2 ({0: 100}) was deleted by a rewind; token 1 ({0: 50}) is the newest again
    deleted = clean(storage, "orders", make_token(2, {0: 50}))

    assert sorted(deleted) == sorted(run2)
    assert all(storage.exists(k) for k in [*run1, manifest1, manifest2])
