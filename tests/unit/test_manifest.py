"""Verification of an attempt's manifest against the plan and the files really in storage."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from cairn.protocol.manifest import (
    CorruptManifest,
    FileEntry,
    Manifest,
    VerificationFailed,
    load,
    verify,
)
from cairn.storage.layout import backup_key, manifest_key, partitioned_key, quarantine_key
from cairn.storage.objects import Storage

# Partition 0 read 5 records from [100, 200) (offsets have holes); partition 1's range held only
# transaction markers (0 records); partition 2 had nothing new.
PLAN = {0: (100, 200), 1: (0, 10), 2: (7, 7)}
FOLDER = "dt=2024-05-01/hr=00"
DAY = date(2024, 5, 1)


def put(storage: Storage, key: str, kind: str, first: int, last: int, records: int) -> FileEntry:
    data = f"{key}:{records}".encode()
    storage.write(key, data)
    return FileEntry(
        key=key,
        kind=kind,
        partition=0,
        records=records,
        first_offset=first,
        last_offset=last,
        min_event_time=1714521600000,
        max_event_time=1714521660000,
        bytes=len(data),
    )


@pytest.fixture
def manifest(storage) -> Manifest:
    files = [
        put(storage, backup_key("orders", 1, 0, 100), "backup", 100, 104, 3),
        put(storage, backup_key("orders", 1, 0, 150), "backup", 150, 151, 2),
        put(storage, partitioned_key("orders", 1, 0, 100, FOLDER), "partitioned", 100, 151, 4),
        put(
            storage,
            quarantine_key("orders", 1, 0, 103, DAY),
            "quarantine",
            103,
            103,
            1,
        ),
    ]
    return Manifest(
        topic="orders",
        attempt_id="run-1-try-1",
        run_id="run-1",
        generation=1,
        ranges=PLAN,
        records_read={0: 5, 1: 0},
        files=files,
        processing_time=datetime(2024, 5, 1, tzinfo=UTC),
        created_at=datetime(2024, 5, 1, tzinfo=UTC),
    )


def test_consistent_manifest_passes_with_counts(storage, manifest):
    # a file committed by an earlier run, below the planned start, is not this attempt's business
    storage.write(backup_key("orders", 1, 0, 0), b"older")

    report = verify(manifest, PLAN, storage)

    c = report.counts
    assert (c.read, c.backup, c.partitioned, c.quarantined, c.files) == (5, 5, 4, 1, 4)
    assert c.bytes == sum(e.bytes for e in manifest.files)
    assert report.partitions[0].backup == 5 and report.partitions[1].read == 0


def test_plan_ranges_from_json_with_string_keys_are_accepted(storage, manifest):
    as_json = {str(p): list(r) for p, r in PLAN.items()}

    assert verify(manifest, as_json, storage).counts.read == 5


def test_load_reads_what_an_attempt_saves(storage, manifest):
    key = manifest_key(manifest.topic, manifest.attempt_id)  # as `Attempts.save` writes it
    storage.write(key, manifest.model_dump_json(indent=2).encode())

    assert key == "_manifests/orders/run-1-try-1.json"
    assert load(storage, key) == manifest


def test_corrupt_manifest_names_its_key(storage):
    storage.write("_manifests/orders/bad.json", b"{oops")

    with pytest.raises(CorruptManifest, match=r"_manifests/orders/bad\.json"):
        load(storage, "_manifests/orders/bad.json")


def fail(manifest: Manifest, storage: Storage, match: str, plan=PLAN) -> None:
    with pytest.raises(VerificationFailed, match=match):
        verify(manifest, plan, storage)


def test_missing_file_fails(storage, manifest):
    storage.delete(manifest.files[1].key)

    fail(manifest, storage, r"1_0_00000000000000000150\.avro is missing")


def test_size_mismatch_fails(storage, manifest):
    storage.write(manifest.files[0].key, b"truncated")

    fail(manifest, storage, r"has 9 bytes, the manifest says \d+")


def test_overlapping_backup_files_fail(storage, manifest):
    manifest.files[0].last_offset = 150

    fail(manifest, storage, "overlap")


def test_backup_count_differing_from_records_read_fails(storage, manifest):
    manifest.records_read[0] = 6

    fail(manifest, storage, "partition 0: 6 records read, 5 in backup")


def test_parsed_count_differing_from_backup_fails(storage, manifest):
    manifest.files[2].records = 3

    fail(manifest, storage, r"partition 0: 5 records in backup, 4 partitioned \+ quarantined")


def test_file_outside_the_planned_range_fails(storage, manifest):
    manifest.files[1].last_offset = 200

    fail(manifest, storage, r"outside planned \[100, 200\)")


def test_records_on_an_unplanned_partition_fail(storage, manifest):
    manifest.records_read[2] = 1

    fail(manifest, storage, "partition 2 has files or records read but nothing was planned")


def test_more_records_than_offsets_fail(storage, manifest):
    manifest.files[0].records = 6
    manifest.records_read[0] = 8

    fail(manifest, storage, "6 records do not fit offsets 100..104")


def test_entry_whose_key_names_other_coordinates_fails(storage, manifest):
    manifest.files[1].first_offset = 151

    fail(manifest, storage, "does not name a backup file of generation 1 partition 0")


def test_file_listed_twice_fails(storage, manifest):
    manifest.files.append(manifest.files[0])

    fail(manifest, storage, "listed twice")


def test_files_the_manifest_does_not_name_are_not_its_business(storage, manifest):
    # Another attempt's file in the planned range: only this attempt's files get published.
    storage.write(backup_key("orders", 1, 0, 160), b"from a concurrent attempt")

    assert verify(manifest, PLAN, storage).counts.files == 4


def test_manifest_for_another_plan_fails(storage, manifest):
    fail(manifest, storage, "differ from the plan", plan={0: (100, 150), 1: (0, 10)})


def test_files_below_the_position_of_a_partition_not_read_are_not_flagged(storage, manifest):
    # The run verifies against the ranges it reads (`Plan.to_read`): partition 1 had nothing new
    # and is left out, yet holds files committed by earlier runs below its position (10).
    to_read = {0: (100, 200)}
    manifest.ranges = to_read
    manifest.records_read = {0: 5}
    storage.write(backup_key("orders", 1, 1, 0), b"committed earlier")
    storage.write(partitioned_key("orders", 1, 1, 0, FOLDER), b"committed earlier")
    storage.write(quarantine_key("orders", 1, 1, 4, DAY), b"committed earlier")

    report = verify(manifest, to_read, storage)

    assert report.counts.read == 5 and report.counts.files == 4
    assert set(report.partitions) == {0}
