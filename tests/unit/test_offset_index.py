"""The table's offset index: a few ranges per date that cover its rows' offsets, so a seal reads
the manifests of only the dates that may hold its records (pyiceberg's SqlCatalog on SQLite and
local files, as the seal's commit task drives it)."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.table import iceberg, offset_index
from tests.unit.test_seal import table_in

SCHEMA = pa.schema(
    [
        ("_kafka_partition", pa.int32()),
        ("_kafka_offset", pa.int64()),
        ("value", pa.string()),
        (EVENT_DATE, pa.date32()),
    ]
)
FIRST = date(2024, 6, 1)


def test_ranges_cover_every_offset_and_cut_at_the_widest_gaps():
    offsets = np.array([5, 3, 4, 10, 11, 500, 12, 9000, 20])

    ranges = offset_index.covering(offsets, offsets)

    assert ranges == [[3, 12], [20, 20], [500, 500], [9000, 9000]]
    assert offset_index.covering(offsets, offsets, at_most=3) == [[3, 20], [500, 500], [9000, 9000]]
    assert offset_index.covering(offsets, offsets, at_most=2) == [[3, 500], [9000, 9000]]
    assert offset_index.covering(np.array([0, 4]), np.array([3, 9])) == [[0, 9]]  # adjacent
    assert offset_index.covering(np.array([7]), np.array([7])) == [[7, 7]]
    spans = np.array([[0, 50], [60, 100], [200, 250], [400, 450], [1000, 1001], [5, 8]])
    assert offset_index.covering(spans[:, 0], spans[:, 1]) == [
        [0, 100],
        [200, 250],
        [400, 450],
        [1000, 1001],
    ]


def test_the_index_reads_back_from_properties_and_says_which_ranges_overlap():
    ranges = {"0": [[7, 7], [9, 9]], "1": [[2, 3]]}

    entry = offset_index.entry(FIRST, ranges)

    broken = {f"{offset_index.PREFIX}2024-06-02": "{not json", "other": "x"}
    assert offset_index.read(entry | broken) == {FIRST: ranges}
    assert offset_index.overlaps(ranges, {"1": [[3, 40]]})
    assert not offset_index.overlaps(ranges, {"0": [[8, 8]], "1": [[4, 40]], "2": [[0, 9]]})


def seal(catalog, where, day: date, offsets: range, partition: int = 0) -> None:
    """What a seal's commit task does for `day`: its Parquet file (one row per offset) in."""
    name = f"data/{day}-{offsets.start}.parquet"
    rows = pa.table(
        {
            "_kafka_partition": pa.array([partition] * len(offsets), pa.int32()),
            "_kafka_offset": pa.array(offsets, pa.int64()),
            "value": [f"{day}/{o}" for o in offsets],
            EVENT_DATE: [day] * len(offsets),
        },
        schema=SCHEMA,
    )
    path = f"{where.location.removeprefix('file://')}/{name}"
    pq.write_table(rows, path)
    held = {str(partition): [[offsets.start, offsets.stop - 1]]}
    iceberg.replace_date(catalog, where, SCHEMA, day, [name], f"seal-{name}", {}, held)


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every file pyiceberg opens from now on."""
    paths: list[str] = []
    real = PyArrowFileIO.new_input

    def spy(self, location):
        paths.append(location)
        return real(self, location)

    monkeypatch.setattr(PyArrowFileIO, "new_input", spy)
    return paths


def manifests_read_by_sealing(catalog, where, day: date, offsets: range, opened) -> list[str]:
    opened.clear()
    seal(catalog, where, day, offsets)
    return [p for p in opened if p.endswith(".avro") and "snap-" not in p]


def test_a_seal_reads_no_manifest_of_dates_that_cannot_hold_its_offsets_however_many_there_are(
    tmp_path, opened
):
    catalog, where = table_in(tmp_path)
    (tmp_path / "warehouse" / "orders" / "data").mkdir(parents=True)
    for i in range(3):
        seal(catalog, where, FIRST + timedelta(days=i), range(100 * i, 100 * i + 100))
    after_3 = manifests_read_by_sealing(
        catalog, where, FIRST + timedelta(3), range(300, 400), opened
    )
    for i in range(4, 12):
        seal(catalog, where, FIRST + timedelta(days=i), range(100 * i, 100 * i + 100))

    after_12 = manifests_read_by_sealing(
        catalog, where, FIRST + timedelta(12), range(1200, 1300), opened
    )

    assert len(after_12) == len(after_3) <= 2
    # a date whose offsets overlap (a record moved from it) is read, and the record moved
    overlapping = manifests_read_by_sealing(
        catalog, where, FIRST + timedelta(13), range(550, 551), opened
    )
    assert len(set(overlapping)) == len(set(after_3)) + 1
    rows = catalog.load_table(where.identifier).scan().to_arrow()
    assert rows.filter(pa.compute.equal(rows["_kafka_offset"], 550))[EVENT_DATE].to_pylist() == [
        FIRST + timedelta(13)
    ]
    assert rows.num_rows == 1300


def test_a_date_with_no_index_entry_is_still_read_and_its_moved_record_deleted(tmp_path):
    """A table sealed before the index, or an entry lost: the date is read as before."""
    catalog, where = table_in(tmp_path)
    (tmp_path / "warehouse" / "orders" / "data").mkdir(parents=True)
    seal(catalog, where, FIRST, range(0, 10))
    seal(catalog, where, FIRST + timedelta(1), range(10, 20))
    table = catalog.load_table(where.identifier)
    with table.transaction() as txn:
        txn.remove_properties(*offset_index.entry(FIRST, {}))

    seal(catalog, where, FIRST + timedelta(2), range(5, 6))

    rows = catalog.load_table(where.identifier).scan().to_arrow()
    assert sorted(rows["_kafka_offset"].to_pylist()) == list(range(20))
    assert rows.filter(pa.compute.equal(rows["_kafka_offset"], 5))[EVENT_DATE].to_pylist() == [
        FIRST + timedelta(2)
    ]
    index = offset_index.read(catalog.load_table(where.identifier).properties)
    assert index[FIRST + timedelta(2)] == {"0": [[5, 5]]} and FIRST not in index
