"""Records a seal moves into its date from other dates' partitions of the table.

A rebuild or a changed config (timezone, event-time field) can file a record under another date
after its old date was sealed. The seal that puts it in its new date takes it out of its old
date's partition in the same commit, so a record is in the table once, under the date its
newest seal filed it in (the old date, changed, is sealed again). Each file of another date
that holds such rows is rewritten without them, as a file named after the seal attempt in that
date's folder (`rewrites`); the commit swaps the two (`cairn.table.iceberg`).

Only the dates the offset index cannot rule out are read (`cairn.table.offset_index`), and of
those only the files whose offset bounds overlap the seal's, so a seal's requests do not grow
with the table's age.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
    Or,
)
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.utils.datetime import days_to_date

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.storage.layout import table_folder
from cairn.table import offset_index

PARTITION, OFFSET = "_kafka_partition", "_kafka_offset"


@dataclass(frozen=True)
class Rewrite:
    """A file of another date that holds moved records, and the same file without them (None:
    every one of its records moved)."""

    old: DataFile
    new: DataFile | None

    @property
    def written(self) -> list[str]:
        return [self.new.file_path] if self.new is not None else []


def rewrites(
    table: Table,
    day: date,
    paths: list[str],
    held: offset_index.Ranges,
    index: offset_index.Index,
    attempt_id: str,
) -> list[Rewrite]:
    """The files of other dates that hold records of `paths` (the date's new files, their
    offsets covered by `held`), each rewritten without them."""
    others = [d for d, ranges in index.items() if d != day and offset_index.overlaps(held, ranges)]
    if not paths or not others:
        return []
    near: list[BooleanExpression] = [
        And(
            EqualTo(term=PARTITION, value=int(p)),
            GreaterThanOrEqual(term=OFFSET, value=a),
            LessThanOrEqual(term=OFFSET, value=b),
        )
        for p, ranges in held.items()
        for a, b in ranges
    ]
    tasks = table.scan(
        row_filter=And(In(term=EVENT_DATE, literals=others), reduce(Or, near))
    ).plan_files()
    if not tasks:
        return []
    ours = _kafka_columns(table, paths)
    at = offset_index.date_positions(table)
    found: list[Rewrite] = []
    for task in tasks:
        f = task.file
        rows = pq.read_table(table.io.new_input(f.file_path).open())
        moved = _rows_in(rows, ours)
        if not pc.any(moved).as_py():
            continue
        kept, new = rows.filter(pc.invert(moved)), None
        if kept.num_rows:
            folder = table_folder(days_to_date(f.partition[at[f.spec_id]]))
            name = f"{attempt_id}-moved-{len(found):05d}.parquet"
            path = f"{table.location().rstrip('/')}/{folder}/{name}"
            with table.io.new_output(path).create(overwrite=True) as out:
                pq.write_table(kept, out, compression="zstd")
            new = parquet_file_to_data_file(table.io, table.metadata, path)
        found.append(Rewrite(f, new))
    return found


def _rows_in(rows: pa.Table, ours: pa.Table) -> pa.ChunkedArray:
    """Which of `rows` have a Kafka partition and offset that `ours` has."""
    keys = rows.select([PARTITION, OFFSET]).cast(ours.schema)
    keys = keys.append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    hits = keys.join(ours, keys=[PARTITION, OFFSET], join_type="left semi")
    return pc.is_in(keys["_row"], value_set=hits["_row"].combine_chunks())


def _kafka_columns(table: Table, paths: list[str]) -> pa.Table:
    """The Kafka partition and offset of every row of the files at `paths`."""
    columns = [PARTITION, OFFSET]
    return pa.concat_tables(
        [pq.read_table(table.io.new_input(p).open(), columns=columns) for p in paths]
    )
