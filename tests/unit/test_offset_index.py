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


def test_the_index_reads_back_from_its_file_and_says_which_ranges_overlap(tmp_path):
    catalog, where = table_in(tmp_path)
    (tmp_path / "warehouse" / "orders" / "data").mkdir(parents=True)
    seal(catalog, where, FIRST, range(7, 10))
    ranges = {"0": [[7, 7], [9, 9]], "1": [[2, 3]]}
    table = catalog.load_table(where.identifier)

    path = offset_index.store(table, {FIRST: ranges})

    with table.transaction() as txn:
        txn.set_properties({offset_index.POINTER: path})
    assert offset_index.load(catalog.load_table(where.identifier)) == {FIRST: ranges}
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


def manifests_read_by_sealing(catalog, where, day: date, offsets: range, opened) -> set[str]:
    """The table's manifests that sealing `day` reads (not those it writes itself)."""
    table = catalog.load_table(where.identifier)
    before = {m.manifest_path for m in table.current_snapshot().manifests(table.io)}
    opened.clear()
    seal(catalog, where, day, offsets)
    return before & set(opened)


def test_a_seal_reads_no_manifest_of_dates_that_cannot_hold_its_offsets_however_many_there_are(
    tmp_path, opened
):
    """A date of each month (manifests are merged by month): the manifests a seal reads are as
    many after 3 months as after 12, and a date its records moved from adds that date's."""
    catalog, where = table_in(tmp_path)
    (tmp_path / "warehouse" / "orders" / "data").mkdir(parents=True)
    month = timedelta(days=31)
    for i in range(3):
        seal(catalog, where, FIRST + i * month, range(100 * i, 100 * i + 100))
    after_3 = manifests_read_by_sealing(catalog, where, FIRST + 3 * month, range(300, 400), opened)
    for i in range(4, 12):
        seal(catalog, where, FIRST + i * month, range(100 * i, 100 * i + 100))

    after_12 = manifests_read_by_sealing(
        catalog, where, FIRST + 12 * month, range(1200, 1300), opened
    )

    assert after_12 == after_3 == set()
    # a date whose offsets overlap (a record moved from it) is read, and the record moved
    overlapping = manifests_read_by_sealing(
        catalog, where, FIRST + 13 * month, range(550, 551), opened
    )
    assert len(overlapping) == 1  # its month's
    table = catalog.load_table(where.identifier)
    rows = table.scan().to_arrow()
    assert rows.filter(pa.compute.equal(rows["_kafka_offset"], 550))[EVENT_DATE].to_pylist() == [
        FIRST + 13 * month
    ]
    assert rows.num_rows == 1300
    assert len(table.current_snapshot().manifests(table.io)) == 14  # one a month


def test_a_table_sealed_before_the_index_had_its_file_gets_one_from_its_manifests(tmp_path):
    """Entries in properties, or none, as a table sealed before kept them: the next seal builds
    an index of every date from the manifests' bounds, finds the moved record, and moves the
    entries into the file."""
    catalog, where = table_in(tmp_path)
    (tmp_path / "warehouse" / "orders" / "data").mkdir(parents=True)
    seal(catalog, where, FIRST, range(0, 10))
    seal(catalog, where, FIRST + timedelta(1), range(10, 20))
    table = catalog.load_table(where.identifier)
    with table.transaction() as txn:
        txn.remove_properties(offset_index.POINTER)
        txn.set_properties({f"{offset_index.LEGACY}{FIRST + timedelta(1)}": '{"0":[[10,19]]}'})
    assert offset_index.load(catalog.load_table(where.identifier)) == {
        FIRST: {"0": [[0, 9]]},
        FIRST + timedelta(1): {"0": [[10, 19]]},
    }

    seal(catalog, where, FIRST + timedelta(2), range(5, 6))

    table = catalog.load_table(where.identifier)
    rows = table.scan().to_arrow()
    assert sorted(rows["_kafka_offset"].to_pylist()) == list(range(20))
    assert rows.filter(pa.compute.equal(rows["_kafka_offset"], 5))[EVENT_DATE].to_pylist() == [
        FIRST + timedelta(2)
    ]
    assert not [k for k in table.properties if k.startswith(offset_index.LEGACY)]
    assert offset_index.load(table)[FIRST + timedelta(2)] == {"0": [[5, 5]]}
