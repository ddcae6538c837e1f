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
from bisect import bisect_left, bisect_right
from collections import defaultdict
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel
from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.catalog import load_catalog
from pyiceberg.conversions import from_bytes
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
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import NameMapping
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType
from pyiceberg.utils.datetime import days_to_date

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.storage.objects import Storage
from cairn.table import offset_index
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
    return _fsspec_options(pyiceberg_properties(catalog))


def table_storage(catalog: Catalog, where: TableTarget) -> Storage:
    """The table's location as a `Storage`: where the seal job writes its Parquet files."""
    return Storage(where.location, **storage_options(catalog))


def location_storage(catalog: IcebergCatalog, where: TableTarget) -> Storage:
    """The same, from the loaded catalog (its S3 properties)."""
    return Storage(where.location, **_fsspec_options(catalog.properties))


def _fsspec_options(properties: dict[str, str]) -> dict[str, Any]:
    """pyiceberg's S3 properties (`cairn.table.catalog.pyiceberg_properties`) as fsspec's."""
    if "s3.region" not in properties:
        return {}
    options: dict[str, Any] = {"client_kwargs": {"region_name": properties["s3.region"]}}
    named = {"s3.endpoint": "endpoint_url", "s3.access-key-id": "key"}
    named["s3.secret-access-key"] = "secret"
    options |= {ours: properties[theirs] for theirs, ours in named.items() if theirs in properties}
    if properties.get("s3.force-virtual-addressing") == "false":
        options["config_kwargs"] = {"s3": {"addressing_style": "path"}}
    return options


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
    held: offset_index.Ranges,
) -> Replaced:
    """Make `files` (paths under the table's location, written with `schema`, their Kafka
    offsets covered by `held`) the whole of partition `day`, in one overwrite snapshot whose
    summary holds `summary` and the attempt, committed with the delete of their records from
    other dates' partitions (`moved_here`) and the date's offset index entry; done already:
    nothing."""
    table = _table(catalog, where, schema)
    done = next(
        (s for s in table.snapshots() if s.summary and s.summary.get(ATTEMPT) == attempt_id), None
    )
    if done is not None:
        return Replaced(snapshot_id=done.snapshot_id, records=date_records(table, day))
    paths = [f"{where.location.rstrip('/')}/{f}" for f in files]
    added = [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]
    old = [task.file for task in table.scan(row_filter=EqualTo(EVENT_DATE, day)).plan_files()]
    moved = moved_here(table, day, paths, held)
    with table.transaction() as txn:
        if moved is not None:
            txn.delete(moved, {ATTEMPT: attempt_id, MOVED_TO: day.isoformat()})
        with txn.update_snapshot(summary | {ATTEMPT: attempt_id}).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for data_file in added:
                overwrite.append_data_file(data_file)
        txn.set_properties(offset_index.entry(day, held))
    table.refresh()
    return Replaced(
        snapshot_id=table.current_snapshot().snapshot_id, records=date_records(table, day)
    )


def moved_here(
    table: Table, day: date, paths: list[str], held: offset_index.Ranges
) -> BooleanExpression | None:
    """The rows of other dates' partitions that hold records of `paths` (the date's new files,
    their offsets covered by `held`): a rebuild or a changed config (timezone, event-time field)
    moved those records to `day` after their old date was sealed. The seal deletes them in its
    commit, so a record is in the table once, under the date its newest seal filed it in (the
    old date, changed, is sealed again). Reads only the dates the offset index cannot rule out
    (`_dates_that_may_hold`), three columns of their files whose offset bounds overlap `held`,
    and then the new files' Kafka columns."""
    dates = _dates_that_may_hold(table, day, held) if paths and held else None
    if dates is None:
        return None
    near = [
        And(EqualTo(PARTITION, int(p)), GreaterThanOrEqual(OFFSET, a), LessThanOrEqual(OFFSET, b))
        for p, ranges in held.items()
        for a, b in ranges
    ]
    elsewhere = table.scan(
        row_filter=And(dates, _any(near)), selected_fields=(EVENT_DATE, PARTITION, OFFSET)
    ).to_arrow()
    if elsewhere.num_rows == 0:
        return None
    ours = _kafka_columns(table, paths).cast(elsewhere.select([PARTITION, OFFSET]).schema)
    # Most rows near ours are other dates' own; hashing theirs and probing ours is cheap.
    ours = ours.filter(pc.is_in(ours[OFFSET], value_set=elsewhere[OFFSET]))
    offsets: dict[tuple[date, int], set[int]] = defaultdict(set)
    for row in elsewhere.join(ours, keys=[PARTITION, OFFSET], join_type="left semi").to_pylist():
        offsets[row[EVENT_DATE], row[PARTITION]].add(row[OFFSET])
    return _any(
        [
            And(EqualTo(EVENT_DATE, d), EqualTo(PARTITION, p), In(OFFSET, o))
            for (d, p), o in offsets.items()
        ]
    )


def _dates_that_may_hold(
    table: Table, day: date, held: offset_index.Ranges
) -> BooleanExpression | None:
    """A filter on `_event_date` for the other dates whose partitions may hold offsets `held`
    covers: those the offset index says overlap, and any date of the table the index has no
    entry for (a manifest's date bounds say which); None: no other date can. Manifests of the
    dates it leaves out are not read, so a seal's requests do not grow with the table's age."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return None
    index = offset_index.read(table.properties)
    known = sorted(index)
    terms: list[BooleanExpression] = []
    overlapping = [
        d for d, ranges in index.items() if d != day and offset_index.overlaps(held, ranges)
    ]
    if overlapping:
        terms.append(In(EVENT_DATE, overlapping))
    unindexed: set[tuple[date, date]] = set()
    at = _date_field(table)
    for manifest in snapshot.manifests(table.io):
        span = _date_span(manifest, at.get(manifest.partition_spec_id))
        if span is None:
            return NotEqualTo(EVENT_DATE, day)  # no date bounds: every other date may
        low, high = span
        indexed = bisect_right(known, high) - bisect_left(known, low)
        if indexed < (high - low).days + 1 and span != (day, day):
            unindexed.add(span)
    terms += [
        And(GreaterThanOrEqual(EVENT_DATE, low), LessThanOrEqual(EVENT_DATE, high))
        for low, high in sorted(unindexed)
    ]
    return And(NotEqualTo(EVENT_DATE, day), _any(terms)) if terms else None


def _date_field(table: Table) -> dict[int, int]:
    """Per partition spec that has it, where `_event_date` (as it is) is among its fields."""
    at = {}
    for spec_id, spec in table.specs().items():
        for i, field in enumerate(spec.fields):
            name = table.schema().find_column_name(field.source_id)
            if isinstance(field.transform, IdentityTransform) and name == EVENT_DATE:
                at[spec_id] = i
    return at


def _date_span(manifest: ManifestFile, at: int | None) -> tuple[date, date] | None:
    """The first and last `_event_date` of a manifest's files, that field `at` of its spec
    (None: it does not say)."""
    if at is None or len(manifest.partitions or []) <= at:
        return None
    bounds = manifest.partitions[at]
    if bounds.lower_bound is None or bounds.upper_bound is None:
        return None
    low, high = (from_bytes(DateType(), b) for b in (bounds.lower_bound, bounds.upper_bound))
    return days_to_date(low), days_to_date(high)


def _kafka_columns(table: Table, paths: list[str]) -> pa.Table:
    """The Kafka partition and offset of every row of the files at `paths`."""
    columns = [PARTITION, OFFSET]
    return pa.concat_tables(
        [pq.read_table(table.io.new_input(p).open(), columns=columns) for p in paths]
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
