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

Sealing another date at the same moment makes one commit lose; it is tried again against the
fresh table (pyiceberg's own retries, which would re-apply a stale pointer to the offset index,
are off: `commit.retry.num-retries` 0), so seals of different dates never lose a date. Each
seal keeps one data manifest per month of dates (`cairn.table.manifests`), and the table's
upkeep (`cairn.table.upkeep`) keeps its metadata and storage from growing with its age.

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
import logging
import random
import time
from datetime import date
from typing import Any

import pyarrow as pa
from pydantic import BaseModel
from pyiceberg.catalog import Catalog as IcebergCatalog
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    ValidationException,
)
from pyiceberg.expressions import (
    EqualTo,
)
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import NameMapping

from cairn.datafiles.parquet_file import EVENT_DATE
from cairn.storage.objects import Storage
from cairn.table import offset_index
from cairn.table.catalog import NAMESPACE, Catalog, TableTarget, pyiceberg_properties, table_name
from cairn.table.manifests import MonthlyOverwrite
from cairn.table.moved import rewrites

log = logging.getLogger(__name__)

PROPERTIES = {
    "commit.retry.num-retries": "0",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
}
"""Set on every topic's table: a seal retries its commit itself, against the fresh table
(`replace_date`); a commit deletes the metadata files older than the ten before it."""

NAME_MAPPING = "schema.name-mapping.default"
ATTEMPT = "cairn.attempt"
MOVED_TO = "cairn.moved-to"
"""In a seal snapshot's summary that moved rows out of other dates' partitions: its date."""


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


class TableBusy(Exception):
    """Other commits kept changing the table while a seal committed to it (retried by Airflow)."""


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
    summary holds `summary` and the attempt, committed with the records it moved from other
    dates' partitions (`cairn.table.moved`) and the date's offset index entry; done already:
    nothing. A commit another commit beat (a seal of another date) is tried again against the
    fresh table, up to `TRIES` times, each logged."""
    table = _table(catalog, where, schema)
    for n in range(1, TRIES + 1):
        done = _landed(table, attempt_id)
        if done is not None:
            return Replaced(snapshot_id=done, records=date_records(table, day))
        try:
            _replace(table, day, files, attempt_id, summary, held)
        except (CommitFailedException, ValidationException) as err:
            log.warning(
                "table %s: the seal of %s (%s) lost a commit race, try %d of %d: %s",
                where.identifier,
                day,
                attempt_id,
                n,
                TRIES,
                err,
            )
            time.sleep(random.uniform(0, min(5.0, 0.1 * 2**n)))
        table = catalog.load_table(where.identifier)
    raise TableBusy(
        f"table {where.identifier}: the seal of {day} ({attempt_id}) lost {TRIES} commit races "
        "in a row; its token is committed, so the task's retry commits the date again"
    )


TRIES = 10


def _replace(
    table: Table,
    day: date,
    files: list[str],
    attempt_id: str,
    summary: dict[str, str],
    held: offset_index.Ranges,
) -> None:
    """One try of `replace_date` against `table` as loaded; what it wrote goes again if the
    commit is refused."""
    paths = [f"{table.location().rstrip('/')}/{f}" for f in files]
    added = [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]
    old = [
        task.file
        for task in table.scan(row_filter=EqualTo(term=EVENT_DATE, value=day)).plan_files()
    ]
    index = offset_index.load(table)
    moved = rewrites(table, day, paths, held, index, attempt_id)
    pointer = offset_index.store(table, index | {day: held})
    written = [pointer, *(path for m in moved for path in m.written)]
    before = table.properties.get(offset_index.POINTER)
    legacy = [k for k in table.properties if k.startswith(offset_index.LEGACY)]
    properties = summary | {ATTEMPT: attempt_id} | ({MOVED_TO: day.isoformat()} if moved else {})
    try:
        with table.transaction() as txn:
            txn.set_properties({offset_index.POINTER: pointer})
            if legacy:
                txn.remove_properties(*legacy)
            with MonthlyOverwrite(txn, table, properties) as overwrite:
                for data_file in [*old, *(m.old for m in moved)]:
                    overwrite.delete_data_file(data_file)
                for data_file in [*added, *(m.new for m in moved if m.new is not None)]:
                    overwrite.append_data_file(data_file)
    except (CommitFailedException, ValidationException):
        for path in written:  # refused for sure: nothing refers to them
            table.io.delete(path)
        raise
    if before is not None and before != pointer:
        table.io.delete(before)  # no snapshot refers to an index: only the property did


def _landed(table: Table, attempt_id: str) -> int | None:
    """The snapshot a try of the attempt committed, if one did."""
    for snapshot in table.snapshots():
        if snapshot.summary and snapshot.summary.get(ATTEMPT) == attempt_id:
            return snapshot.snapshot_id
    return None


def date_records(table: Table, day: date) -> int:
    """Records of partition `day` now (from the data files' counts: no data is read)."""
    tasks = table.scan(row_filter=EqualTo(term=EVENT_DATE, value=day)).plan_files()
    return sum(task.file.record_count for task in tasks)


def date_snapshot(catalog: IcebergCatalog, topic: str, day: date) -> dict[str, str] | None:
    """The summary of the newest snapshot that sealed `day` (None: never sealed into it)."""
    try:
        table = catalog.load_table(f"{NAMESPACE}.{table_name(topic)}")
    except NoSuchTableError:
        return None
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True):
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
            properties={"format-version": "2"} | PROPERTIES,
        )
        with table.update_spec() as spec:
            spec.add_identity(EVENT_DATE)
    if not _has(table, schema.names):
        with table.update_schema() as update:
            update.union_by_name(schema)
    wanted = PROPERTIES | {NAME_MAPPING: _json(table.schema().name_mapping)}
    if any(table.properties.get(k) != v for k, v in wanted.items()):
        with table.transaction() as txn:
            txn.set_properties(wanted)
    return table


def _has(table: Table, names: list[str]) -> bool:
    known = {f.name for f in table.schema().fields}
    return all(name in known for name in names)


def _json(mapping: NameMapping) -> str:
    return json.dumps(json.loads(mapping.model_dump_json()), sort_keys=True)
