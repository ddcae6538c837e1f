"""The table's upkeep and its commit under races, on pyiceberg's SqlCatalog (SQLite) and local
files: snapshots past their age go with the files only they referenced, a crash in between is
finished later, orphans of a sealed date go, the metadata stays the same size however many dates
are sealed, and seals of different dates that commit at once both land."""

from __future__ import annotations

import logging
import os
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cairn.storage.layout import table_file_name
from cairn.storage.objects import Storage
from cairn.table import iceberg, offset_index, upkeep
from tests.leftovers import table_leftovers
from tests.unit.test_offset_index import FIRST, SCHEMA
from tests.unit.test_seal import table_in

WEEK = timedelta(days=7)


def sealed(catalog, where, day: date, offsets: range, attempt: str) -> str:
    """What a seal's commit task does to the table for `day`: its file (one row per offset),
    named as a seal names it, in; returns the file's path."""
    name = table_file_name(day, attempt, 0, 0)
    rows = pa.table(
        {
            "_kafka_partition": pa.array([0] * len(offsets), pa.int32()),
            "_kafka_offset": pa.array(offsets, pa.int64()),
            "value": [f"{day}/{o}" for o in offsets],
            "_event_date": [day] * len(offsets),
        },
        schema=SCHEMA,
    )
    path = f"{where.location}/{name}"
    os.makedirs(os.path.dirname(path.removeprefix("file://")), exist_ok=True)
    pq.write_table(rows, path.removeprefix("file://"))
    held = {"0": [[offsets.start, offsets.stop - 1]]}
    summary = {"cairn.date": day.isoformat()}
    iceberg.replace_date(catalog, where, SCHEMA, day, [name], attempt, summary, held)
    return path


def offsets_in(table, snapshot_id: int | None = None) -> list[int]:
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow()["_kafka_offset"].to_pylist())


def test_snapshots_past_their_age_go_with_the_files_only_they_referenced(tmp_path):
    catalog, where = table_in(tmp_path)
    first = sealed(catalog, where, FIRST, range(0, 10), "s-1")
    sealed(catalog, where, FIRST + timedelta(1), range(10, 20), "s-2")
    sealed(catalog, where, FIRST, range(0, 12), "s-3")  # resealed: its first file is replaced
    files = Storage(where.location)
    table = catalog.load_table(where.identifier)
    before = [s.snapshot_id for s in table.snapshots()]

    done = upkeep.upkeep(table, files, FIRST, WEEK, WEEK, now=datetime.now(UTC) + WEEK)

    table = catalog.load_table(where.identifier)
    assert [e.snapshot_id for e in done.expired] == before[:-1]
    assert [e.date for e in done.expired] == [FIRST, FIRST + timedelta(1)]
    assert [s.snapshot_id for s in table.snapshots()] == before[-1:]
    assert offsets_in(table) == list(range(20))  # 10 and 11 moved to the first date
    assert not files.exists(first.removeprefix(f"{where.location}/"))
    assert table_leftovers(table, files) == set()


def test_a_snapshot_younger_than_the_age_stays_for_time_travel(tmp_path):
    catalog, where = table_in(tmp_path)
    sealed(catalog, where, FIRST, range(0, 10), "s-1")
    table = catalog.load_table(where.identifier)
    travel = table.current_snapshot().snapshot_id
    sealed(catalog, where, FIRST, range(0, 12), "s-2")
    table = catalog.load_table(where.identifier)

    done = upkeep.upkeep(table, Storage(where.location), FIRST, WEEK, WEEK)

    assert done.expired == [] and len(catalog.load_table(where.identifier).snapshots()) == 2
    assert offsets_in(table, travel) == list(range(10))


def test_a_crash_between_the_expiry_and_the_removal_is_finished_by_the_next_upkeep(
    tmp_path, monkeypatch
):
    catalog, where = table_in(tmp_path)
    sealed(catalog, where, FIRST, range(0, 10), "s-1")
    sealed(catalog, where, FIRST, range(0, 12), "s-2")
    files = Storage(where.location)
    later = datetime.now(UTC) + WEEK
    with monkeypatch.context() as crashed:
        crashed.setattr(upkeep, "_apply", lambda *_: (_ for _ in ()).throw(OSError("died")))
        with pytest.raises(OSError):
            upkeep.upkeep(catalog.load_table(where.identifier), files, FIRST, WEEK, WEEK, now=later)
    table = catalog.load_table(where.identifier)
    assert len(table.snapshots()) == 1 and table_leftovers(table, files)

    done = upkeep.upkeep(table, files, FIRST, WEEK, WEEK, now=later + upkeep.SETTLED)

    assert done.removed and table_leftovers(catalog.load_table(where.identifier), files) == set()


def test_files_of_the_sealed_date_no_snapshot_refers_to_go_once_old_enough(tmp_path):
    catalog, where = table_in(tmp_path)
    live = sealed(catalog, where, FIRST, range(0, 10), "s-1")
    files = Storage(where.location)
    orphan = table_file_name(FIRST, "s-000000000009-000001-abcdef", 0, 0)  # a refused seal's
    fresh = table_file_name(FIRST, "s-000000000009-000002-abcdef", 0, 0)
    for key in (orphan, fresh):
        files.write(key, b"parquet")
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).timestamp()
    for key in (orphan, live.removeprefix(f"{where.location}/")):
        os.utime(files.backend.path(key), (an_hour_ago, an_hour_ago))
    table = catalog.load_table(where.identifier)

    upkeep.upkeep(table, files, FIRST, WEEK, timedelta(minutes=30))

    assert not files.exists(orphan) and files.exists(fresh)
    assert offsets_in(catalog.load_table(where.identifier)) == list(range(10))


def test_the_metadata_stays_the_same_size_however_many_dates_are_sealed(tmp_path):
    """A date a day, and each seal's upkeep keeps a week: the metadata file, the snapshots and
    the metadata folder hold as much after 40 dates as after 20, but a manifest a month."""
    catalog, where = table_in(tmp_path)
    files = Storage(where.location)
    sizes = {}
    for i in range(40):
        day = FIRST + timedelta(days=i)
        sealed(catalog, where, day, range(10 * i, 10 * i + 10), f"s-{i}")
        table = catalog.load_table(where.identifier)
        now = datetime.now(UTC) + timedelta(days=i)  # the seal of day i runs on day i
        upkeep.upkeep(table, files, day, timedelta(days=7) - timedelta(seconds=1), WEEK, now=now)
        table = catalog.load_table(where.identifier)
        if i + 1 in (20, 40):
            sizes[i + 1] = (
                files.size(table.metadata_location.removeprefix(f"{where.location}/")),
                len(table.current_snapshot().manifests(table.io)),
                len(files.list("metadata/")),
                len(table.snapshots()),
            )
    (meta_20, manifests_20, folder_20, snapshots_20) = sizes[20]
    (meta_40, manifests_40, folder_40, snapshots_40) = sizes[40]
    assert abs(meta_40 - meta_20) < 0.05 * meta_20 and snapshots_40 == snapshots_20
    assert manifests_40 == 2  # one a month: June and July
    assert folder_40 - manifests_40 == folder_20 - manifests_20
    assert table_leftovers(table, files) == set()
    assert len(offset_index.load(table)) == 40


def test_seals_of_different_dates_that_commit_at_once_both_land(tmp_path, monkeypatch, caplog):
    """The second date's seal commits while the first one's commit is being made: the first
    loses the race, tries again against the fresh table and lands, leaving nothing behind."""
    catalog, where = table_in(tmp_path)
    sealed(catalog, where, FIRST, range(0, 10), "s-0")
    real_store = offset_index.store
    racing = []

    def store_then_race(table, index):
        if not racing:
            racing.append(True)
            sealed(catalog, where, FIRST + timedelta(2), range(20, 30), "s-2")
        return real_store(table, index)

    monkeypatch.setattr(offset_index, "store", store_then_race)
    with caplog.at_level(logging.WARNING):
        sealed(catalog, where, FIRST + timedelta(1), range(10, 20), "s-1")

    table = catalog.load_table(where.identifier)
    assert "lost a commit race, try 1 of 10" in caplog.text
    assert offsets_in(table) == list(range(30))
    assert set(offset_index.load(table)) == {FIRST + timedelta(i) for i in range(3)}
    assert table_leftovers(table, Storage(where.location)) == set()


def test_a_seal_that_never_committed_loses_its_table_files_and_a_committed_one_keeps_them(
    tmp_path,
):
    """What removes a seal attempt's table files (a sweep found it over) keeps those a snapshot
    refers to: a zombie of a committed seal may have left staging behind."""
    catalog, where = table_in(tmp_path)
    live = sealed(catalog, where, FIRST, range(0, 10), "s-000000000001-000001-aaaaaa")
    files = Storage(where.location)
    dead = table_file_name(FIRST, "s-000000000001-000002-bbbbbb", 0, 0)
    files.write(dead, b"parquet")
    remove = upkeep.unreferenced(catalog, where, files)
    folder = f"data/_event_date={FIRST}"

    remove(folder, "s-000000000001-000002-bbbbbb")
    remove(folder, "s-000000000001-000001-aaaaaa")

    assert not files.exists(dead) and files.exists(live.removeprefix(f"{where.location}/"))
    assert offsets_in(catalog.load_table(where.identifier)) == list(range(10))
