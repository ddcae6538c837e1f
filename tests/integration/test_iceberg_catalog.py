"""The plumbing of a topic's Iceberg table, against the real services: Spark (a local session,
and the Spark Connect server) creates and writes the table in the stack's JDBC catalog
(PostgreSQL), replaces one day in one snapshot with Cairn's properties in its summary, and
pyiceberg loads the same table by name, reads exactly its rows and sees those properties; with
the warehouse on a local folder and on the SeaweedFS bucket."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlsplit

import psycopg2
import pyarrow as pa
import pytest
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.catalog import load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestamptzType
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cairn.table import catalog
from cairn_airflow.hooks.spark_connect import connect_mark_kept, with_session_id
from cairn_stack import services
from cairn_stack.settings import REPO
from tests.integration.test_spark_connect import server_processes

TOPIC = "it.iceberg-Orders"
"""Dots, a dash and capitals: its table is `it_iceberg_orders_<hash>`."""
DAY1, DAY2 = date(2024, 5, 1), date(2024, 5, 2)
SNAPSHOT_PROPERTY = "snapshot-property."
"""The prefix of Iceberg's Spark write options that go into the snapshot's summary."""
COLUMNS = "kafka_partition INT, kafka_offset BIGINT, event_time TIMESTAMP, value STRING"
ARROW_SCHEMA = pa.schema(
    [
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("value", pa.string()),
    ]
)


def day_rows(day: date, count: int, first_offset: int, tag: str) -> list[tuple]:
    """`count` records of `day`, one every 37 minutes from midnight UTC, on partition 0."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return [
        (0, first_offset + i, midnight + timedelta(minutes=37 * i), f"{tag}-{i}")
        for i in range(count)
    ]


def as_arrow(rows: list[tuple]) -> pa.Table:
    return pa.table(list(zip(*rows, strict=True)), schema=ARROW_SCHEMA)


def summary(topic: str, seq: int, offsets: dict[int, list[int]]) -> dict[str, str]:
    """What a seal would record in the snapshot: the topic, the seal's seq, the offset ranges."""
    return {"cairn.topic": topic, "cairn.seq": str(seq), "cairn.offsets": json.dumps(offsets)}


def write_options(properties: dict[str, str]) -> dict[str, str]:
    return {SNAPSHOT_PROPERTY + key: value for key, value in properties.items()}


def day_filter(day: date):
    """`event_time` within `day` (UTC): whole `days(event_time)` partitions, so the overwrite
    drops that day's files without rewriting any."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    column = F.col("event_time")
    return (column >= F.lit(start)) & (column < F.lit(start + timedelta(days=1)))


def create_write_and_replace_a_day(spark, cat: catalog.Catalog) -> tuple[str, list[tuple]]:
    """Spark: create the topic's table, append two days (snapshot 1), replace the first day
    (snapshot 2); the table's Spark SQL name and the rows it must hold."""
    name = catalog.spark_table(cat, TOPIC)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {cat.name}.{catalog.NAMESPACE}")
    spark.sql(
        f"CREATE TABLE {name} ({COLUMNS}) USING iceberg PARTITIONED BY (days(event_time)) "
        "TBLPROPERTIES ('format-version' = '2', 'write.format.default' = 'parquet')"
    )
    first = day_rows(DAY1, 30, 0, "first") + day_rows(DAY2, 20, 30, "first")
    (
        spark.createDataFrame(first, COLUMNS)
        .writeTo(name)
        .options(**write_options(summary(TOPIC, 1, {0: [0, 50]})))
        .append()
    )
    again = day_rows(DAY1, 32, 50, "again")  # a rebuild of DAY1 from offsets 50..81
    (
        spark.createDataFrame(again, COLUMNS)
        .writeTo(name)
        .options(**write_options(summary(TOPIC, 2, {0: [50, 82]})))
        .overwrite(day_filter(DAY1))
    )
    return name, again + first[30:]


def assert_pyiceberg_reads_it(cat: catalog.Catalog, expected: list[tuple]):
    """pyiceberg loads the table by name and finds exactly `expected`, the day-partitioned
    Parquet v2 layout, and the two snapshots' Cairn properties; returns the table."""
    table = load_catalog(cat.name, **catalog.pyiceberg_properties(cat)).load_table(
        (catalog.NAMESPACE, catalog.table_name(TOPIC))
    )
    got = table.scan().to_arrow().to_pylist()
    assert sorted(tuple(row.values()) for row in got) == sorted(expected)

    assert table.format_version == 2
    (field,) = table.spec().fields
    assert isinstance(field.transform, DayTransform)
    assert table.schema().find_field(field.source_id).name == "event_time"
    files = table.inspect.files().to_pylist()
    assert {f["file_format"] for f in files} == {"PARQUET"}
    # under the warehouse (Hadoop spells a local one `file:/...`), in day folders
    folder = f"{urlsplit(cat.warehouse).path}/{catalog.NAMESPACE}/{catalog.table_name(TOPIC)}"
    days = {f"{folder}/data/event_time_day={day}" for day in (DAY1, DAY2)}
    assert {urlsplit(f["file_path"]).path.rpartition("/")[0] for f in files} == days

    appended, replaced = table.snapshots()
    assert appended.summary["cairn.seq"] == "1" and replaced.summary["cairn.seq"] == "2"
    assert replaced.parent_snapshot_id == appended.snapshot_id
    assert replaced.summary.operation.value == "overwrite"
    assert replaced.summary["deleted-records"] == "30"  # all of DAY1, no row of DAY2
    assert replaced.summary["added-records"] == "32"
    assert replaced.summary["cairn.topic"] == TOPIC
    assert json.loads(replaced.summary["cairn.offsets"]) == {"0": [50, 82]}
    return table


def server(settings) -> dict:
    return {"host": settings.host, "port": settings.postgres_port}


def catalog_rows(settings, name: str) -> list[tuple]:
    """The catalog's own rows for catalog `name` (V1 schema: with `iceberg_type`)."""
    login = {"user": settings.catalog_user, "password": settings.catalog_password}
    db = psycopg2.connect(**login, dbname=settings.catalog_database, **server(settings))
    with contextlib.closing(db), db.cursor() as cur:
        cur.execute(
            "SELECT table_namespace, table_name, iceberg_type FROM iceberg_tables "
            "WHERE catalog_name = %s",
            [name],
        )
        return cur.fetchall()


@pytest.fixture(params=["local", "s3"])
def warehouse(request, tmp_path, stack_settings) -> str:
    """A fresh warehouse: a local folder, or a prefix of the SeaweedFS bucket."""
    if request.param == "local":
        return (tmp_path / "warehouse").as_uri()
    request.getfixturevalue("s3")
    return f"s3://{stack_settings.bucket}/iceberg-{uuid.uuid4().hex[:8]}"


def test_spark_writes_and_replaces_a_day_and_pyiceberg_reads_it_by_name(
    spark, postgres, warehouse
) -> None:
    # Spark reads a catalog's settings once per session: each warehouse is a catalog of its own.
    cat = services.iceberg_catalog(postgres, warehouse, name=f"it_{uuid.uuid4().hex[:8]}")
    for key, value in catalog.spark_conf(cat).items():
        spark.conf.set(key, value)

    name, expected = create_write_and_replace_a_day(spark, cat)

    table = assert_pyiceberg_reads_it(cat, expected)
    assert spark.sql(f"SELECT count(*) FROM {name}").first()[0] == len(expected) == 52
    table_id = (catalog.NAMESPACE, catalog.table_name(TOPIC), "TABLE")
    assert catalog_rows(postgres, cat.name) == [table_id]

    # And the other way round: pyiceberg commits to the same table, Spark sees its snapshot.
    later = day_rows(DAY2 + timedelta(days=1), 3, 82, "pyiceberg")
    table.append(as_arrow(later), snapshot_properties=summary(TOPIC, 3, {0: [82, 85]}))
    spark.sql(f"REFRESH TABLE {name}")
    assert spark.sql(f"SELECT count(*) FROM {name}").first()[0] == 55
    history = spark.sql(f"SELECT summary['cairn.seq'] FROM {name}.snapshots ORDER BY committed_at")
    assert [row[0] for row in history.collect()] == ["1", "2", "3"]


def test_a_catalog_pyiceberg_made_is_the_same_v1_catalog_for_spark(
    spark, postgres, tmp_path
) -> None:
    """The other order: pyiceberg is a catalog database's first client (it creates the
    catalog's tables itself, in V1) and makes the table; Spark then reads and writes it. The
    database has the very columns that Spark's JdbcCatalog makes in a database it is first in."""
    cat = fresh_catalog(postgres, (tmp_path / "warehouse").as_uri())
    made = load_catalog(cat.name, **catalog.pyiceberg_properties(cat))
    made.create_namespace(catalog.NAMESPACE)
    schema = Schema(
        NestedField(1, "kafka_partition", IntegerType()),
        NestedField(2, "kafka_offset", LongType()),
        NestedField(3, "event_time", TimestamptzType()),
        NestedField(4, "value", StringType()),
    )
    table = made.create_table(
        (catalog.NAMESPACE, catalog.table_name(TOPIC)),
        schema,
        partition_spec=PartitionSpec(PartitionField(3, 1000, DayTransform(), "event_time_day")),
        properties={"format-version": "2", "write.format.default": "parquet"},
    )
    rows = day_rows(DAY1, 5, 0, "pyiceberg")
    table.append(as_arrow(rows), snapshot_properties=summary(TOPIC, 1, {0: [0, 5]}))

    for key, value in catalog.spark_conf(cat).items():
        spark.conf.set(key, value)
    name = catalog.spark_table(cat, TOPIC)
    assert spark.sql(f"SELECT count(*) FROM {name}").first()[0] == 5
    more = day_rows(DAY2, 4, 5, "spark")
    options = write_options(summary(TOPIC, 2, {0: [5, 9]}))
    spark.createDataFrame(more, COLUMNS).writeTo(name).options(**options).append()

    table.refresh()
    assert sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist()) == rows + more
    assert [s.summary["cairn.seq"] for s in table.snapshots()] == ["1", "2"]

    java_first = fresh_catalog(postgres, (tmp_path / "other").as_uri())
    for key, value in catalog.spark_conf(java_first).items():
        spark.conf.set(key, value)
    spark.sql(f"SHOW NAMESPACES IN {java_first.name}").collect()  # creates its tables
    assert catalog_columns(postgres, cat.name) == catalog_columns(postgres, java_first.name)


def fresh_catalog(settings, warehouse: str) -> catalog.Catalog:
    """The stack's catalog in a new database of its own; catalog and database share a name."""
    database = f"catalog_{uuid.uuid4().hex[:8]}"
    superuser = {"user": settings.postgres_user, "password": settings.postgres_password}
    db = psycopg2.connect(**superuser, dbname="postgres", **server(settings))
    with contextlib.closing(db):
        db.autocommit = True
        with db.cursor() as cur:
            cur.execute(f'CREATE DATABASE {database} OWNER "{settings.catalog_user}"')
    cat = services.iceberg_catalog(settings, warehouse, name=database)
    return cat.model_copy(update={"uri": cat.uri.replace(settings.catalog_database, database)})


def catalog_columns(settings, database: str) -> list[tuple]:
    """The columns of the catalog's own tables in `database`: names, types and lengths. (Not
    nullability: pyiceberg makes `property_value` NOT NULL where Java leaves it nullable;
    neither writes a NULL there.)"""
    login = {"user": settings.catalog_user, "password": settings.catalog_password}
    db = psycopg2.connect(**login, dbname=database, **server(settings))
    with contextlib.closing(db), db.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, data_type, character_maximum_length "
            "FROM information_schema.columns WHERE table_name LIKE 'iceberg%' ORDER BY 1, 2"
        )
        return cur.fetchall()


def test_the_spark_connect_server_writes_with_the_catalog_its_session_brings(
    spark_connect, postgres, s3, stack_settings
) -> None:
    """The server has the jars from its start; the catalog's settings (with the catalog's
    password and the S3 secret) come with the session, never on the server's command line."""
    warehouse = f"s3://{stack_settings.bucket}/iceberg-connect-{uuid.uuid4().hex[:8]}"
    cat = services.iceberg_catalog(postgres, warehouse, name=f"connect_{uuid.uuid4().hex[:8]}")
    with connect_mark_kept():
        session = SparkSession.builder.remote(
            with_session_id(spark_connect, str(uuid.uuid4()))
        ).create()
        try:
            for key, value in catalog.spark_conf(cat).items():
                session.conf.set(key, value)
            name, expected = create_write_and_replace_a_day(session, cat)
            assert session.sql(f"SELECT count(*) FROM {name}").first()[0] == len(expected)
        finally:
            session.stop()

    assert_pyiceberg_reads_it(cat, expected)
    secrets = [stack_settings.catalog_password, stack_settings.s3_secret_key]
    for pid, text in server_processes(stack_settings).items():
        assert not [s for s in secrets if s in text], f"a secret in process {pid}'s argv/env"


def test_kafka_refuses_topics_that_differ_only_by_dot_against_underscore(kafka) -> None:
    """Why `catalog.table_name` maps `.` to `_` without a hash: one cluster never has both."""
    dotted = f"it.collide.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic(dotted, 1, 1)])[dotted].result(timeout=30)
    underscored = dotted.replace(".", "_")
    with pytest.raises(KafkaException, match="collides"):
        admin.create_topics([NewTopic(underscored, 1, 1)])[underscored].result(timeout=30)
    assert catalog.table_name(dotted) == underscored


def test_composes_script_makes_a_catalog_database_as_the_stack_does(postgres) -> None:
    """docker-compose.yml's init script, run by the stack's own psql against its PostgreSQL,
    with names and a password that need quoting."""
    configs = yaml.safe_load((REPO / "docker-compose.yml").read_text())["configs"]
    script = configs["postgres-catalog"]["content"].replace("$$", "$")  # compose's escape
    name = f"Compose-{uuid.uuid4().hex[:8]}"
    password = 'it\'s a "secret"'
    bin_dir = services.postgres_bin()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PGHOST": postgres.host,
        "PGPORT": str(postgres.postgres_port),
        "PGPASSWORD": postgres.postgres_password,
        "POSTGRES_USER": postgres.postgres_user,
        "CAIRN_CATALOG_DATABASE": name,
        "CAIRN_CATALOG_USER": name,
        "CAIRN_CATALOG_PASSWORD": password,
    }
    subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, timeout=60)

    login = {"user": name, "password": password, "dbname": name}
    with contextlib.closing(psycopg2.connect(**login, **server(postgres))) as db, db.cursor() as c:
        c.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [name])
        assert c.fetchone() == (name,)
