"""A topic's Iceberg table: each sealed date is one partition, replaced in one snapshot.

The seal job writes a date's parsed records as Parquet files under the table's location
(`cairn.datafiles.parquet_file`); the seal's commit task, once Cairn's token is committed,
replaces the date's partition with them here, with pyiceberg, in ONE `overwrite` snapshot: the
date's old data files out, the new ones in. A reader of the table (Spark SQL, pyiceberg, DuckDB)
sees the date before or after, never both or neither; a record a rebuild or a changed config
moved from a sealed date to this one leaves its old date's partition in the same commit, so no
record is in the table twice. The snapshot's summary carries what
Iceberg's Kafka Connect sink records and more: the topic, the token and the seal attempt, the
date, its record count and checksum, and per Kafka partition the offset ranges that fed it.

The table is made at the first seal: `cairn.<table>` (`cairn.table.catalog.table_name`) at
`<warehouse>/cairn.db/<table>`, format version 2, partitioned by `_event_date` (the date a
record is filed under, in the topic's timezone; Iceberg's `day()` transform would cut dates in
UTC), with the schema of the Parquet files. A later schema (the topic's schema evolved) is merged
in by name before the commit (`union_by_name`). Cairn writes its Parquet files without Iceberg
field ids, so the table keeps a name mapping (`schema.name-mapping.default`) that every reader
uses to find columns by name.

Retrying is safe: a snapshot whose summary names the seal attempt means it is done.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel
from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
    NotEqualTo,
    Or,
)
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import NameMapping

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.storage.objects import Storage
from cairn.table.catalog import NAMESPACE, Catalog, TableTarget, pyiceberg_properties, table_name

NAME_MAPPING = "schema.name-mapping.default"
ATTEMPT = "cairn.attempt"
MOVED_TO = "cairn.moved-to"
"""A delete snapshot's summary: the date a seal moved rows of other dates' partitions to."""
PARTITION, OFFSET = "_kafka_partition", "_kafka_offset"


def catalog_of(catalog: Catalog) -> IcebergCatalog:
    return load_catalog(catalog.name, **pyiceberg_properties(catalog))


def target(catalog: Catalog, topic: str) -> TableTarget:
    """The topic's table: where it is, or where the first seal makes it."""
    identifier = f"{NAMESPACE}.{table_name(topic)}"
    try:
        location = catalog_of(catalog).load_table(identifier).location()
    except NoSuchTableError:
        location = f"{catalog.warehouse.rstrip('/')}/{NAMESPACE}.db/{table_name(topic)}"
    return TableTarget(identifier=identifier, location=location)


def storage_options(catalog: Catalog) -> dict[str, Any]:
    """fsspec options that reach the table's files (its warehouse) as the catalog does."""
    s3 = catalog.s3
    if s3 is None:
        return {}
    options: dict[str, Any] = {"client_kwargs": {"region_name": s3.region}}
    if s3.endpoint:
        options["endpoint_url"] = s3.endpoint
    if s3.access_key_id:
        options["key"] = s3.access_key_id
    if s3.secret_access_key:
        options["secret"] = s3.secret_access_key.get_secret_value()
    if s3.path_style_access:
        options["config_kwargs"] = {"s3": {"addressing_style": "path"}}
    return options


def table_storage(catalog: Catalog, where: TableTarget) -> Storage:
    """The table's location as a `Storage`: where the seal job writes its Parquet files."""
    return Storage(where.location, **storage_options(catalog))


class Replaced(BaseModel):
    """The snapshot that holds a sealed date, and how many records the date has in it."""

    snapshot_id: int
    records: int


def replace_date(
    catalog: IcebergCatalog,
    where: TableTarget,
    schema: pa.Schema,
    day: date,
    files: list[str],
    attempt_id: str,
    summary: dict[str, str],
) -> Replaced:
    """Make `files` (paths under the table's location, written with `schema`) the whole of
    partition `day`, in one overwrite snapshot whose summary holds `summary` and the attempt,
    committed with the delete of their records from other dates' partitions (`moved_here`);
    done already: nothing."""
    table = _table(catalog, where, schema)
    done = next(
        (s for s in table.snapshots() if s.summary and s.summary.get(ATTEMPT) == attempt_id), None
    )
    if done is not None:
        return Replaced(snapshot_id=done.snapshot_id, records=date_records(table, day))
    paths = [f"{where.location.rstrip('/')}/{f}" for f in files]
    added = [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]
    old = [task.file for task in table.scan(row_filter=EqualTo(EVENT_DATE, day)).plan_files()]
    moved = moved_here(table, day, paths)
    with table.transaction() as txn:
        if moved is not None:
            txn.delete(moved, {ATTEMPT: attempt_id, MOVED_TO: day.isoformat()})
        with txn.update_snapshot(summary | {ATTEMPT: attempt_id}).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for data_file in added:
                overwrite.append_data_file(data_file)
    table.refresh()
    return Replaced(
        snapshot_id=table.current_snapshot().snapshot_id, records=date_records(table, day)
    )


def moved_here(table: Table, day: date, paths: list[str]) -> BooleanExpression | None:
    """The rows of other dates' partitions that hold records of `paths` (the date's new
    files): a rebuild or a changed config (timezone, event-time field) moved those records to
    `day` after their old date was sealed. The seal deletes them in its commit, so a record is
    in the table once, under the date its newest seal filed it in (the old date, changed, is
    sealed again). Reads three columns of the files whose offset bounds overlap the date's."""
    if not paths:
        return None
    ours = pa.concat_tables(
        [pq.read_table(table.io.new_input(p).open(), columns=[PARTITION, OFFSET]) for p in paths]
    )
    if ours.num_rows == 0:
        return None
    bounds = ours.group_by(PARTITION).aggregate([(OFFSET, "min"), (OFFSET, "max")]).to_pylist()
    near = [
        And(
            EqualTo(PARTITION, b[PARTITION]),
            GreaterThanOrEqual(OFFSET, b[f"{OFFSET}_min"]),
            LessThanOrEqual(OFFSET, b[f"{OFFSET}_max"]),
        )
        for b in bounds
    ]
    elsewhere = table.scan(
        row_filter=And(NotEqualTo(EVENT_DATE, day), _any(near)),
        selected_fields=(EVENT_DATE, PARTITION, OFFSET),
    ).to_arrow()
    ours = ours.cast(elsewhere.select([PARTITION, OFFSET]).schema)
    offsets: dict[tuple[date, int], set[int]] = defaultdict(set)
    for row in elsewhere.join(ours, keys=[PARTITION, OFFSET], join_type="left semi").to_pylist():
        offsets[row[EVENT_DATE], row[PARTITION]].add(row[OFFSET])
    return _any(
        [
            And(EqualTo(EVENT_DATE, d), EqualTo(PARTITION, p), In(OFFSET, o))
            for (d, p), o in offsets.items()
        ]
    )


def _any(terms: list[BooleanExpression]) -> BooleanExpression | None:
    return reduce(Or, terms) if terms else None


def delete_file(catalog: IcebergCatalog, where: TableTarget, path: str) -> None:
    """Delete a data file a refused seal wrote under the table's location (never committed)."""
    location = f"{where.location.rstrip('/')}/{path}"
    load_file_io(catalog.properties, location).delete(location)


def date_records(table: Table, day: date) -> int:
    """Records of partition `day` now (from the data files' counts: no data is read)."""
    tasks = table.scan(row_filter=EqualTo(EVENT_DATE, day)).plan_files()
    return sum(task.file.record_count for task in tasks)


def date_snapshot(catalog: IcebergCatalog, topic: str, day: date) -> dict[str, str] | None:
    """The summary of the newest snapshot that sealed `day` (None: never sealed into it)."""
    try:
        table = catalog.load_table(f"{NAMESPACE}.{table_name(topic)}")
    except NoSuchTableError:
        return None
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number, reverse=True):
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if summary.get("cairn.date") == day.isoformat():
            return summary | {"snapshot-id": str(snapshot.snapshot_id)}
    return None


def _table(catalog: IcebergCatalog, where: TableTarget, schema: pa.Schema) -> Table:
    """The table, made with `schema`, or with `schema` merged into its own by name."""
    try:
        table = catalog.load_table(where.identifier)
    except NoSuchTableError:
        with contextlib.suppress(NamespaceAlreadyExistsError):
            catalog.create_namespace(NAMESPACE)
        table = catalog.create_table(
            where.identifier,
            schema=schema,
            location=where.location,
            properties={"format-version": "2"},
        )
        with table.update_spec() as spec:
            spec.add_identity(EVENT_DATE)
    if not _has(table, schema.names):
        with table.update_schema() as update:
            update.union_by_name(schema)
    mapping = table.schema().name_mapping
    if table.properties.get(NAME_MAPPING) != _json(mapping):
        with table.transaction() as txn:
            txn.set_properties({NAME_MAPPING: _json(mapping)})
    return table


def _has(table: Table, names: list[str]) -> bool:
    known = {f.name for f in table.schema().fields}
    return all(name in known for name in names)


def _json(mapping: NameMapping) -> str:
    return json.dumps(json.loads(mapping.model_dump_json()), sort_keys=True)
