"""Complete dates against real Kafka timestamps: a date completes exactly when its last partition
passes its cutoff, late records amend it, readers skip the `_SUCCESS` marker; through the real
Airflow stack, the archive DAG marks the date and the example downstream DAG
(tests/dags/cairn_downstream.py) then runs for it."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import quote

from confluent_kafka import Producer
from pyiceberg.expressions import EqualTo

from cairn.pipeline import completeness
from cairn.pipeline.proof import Proof
from cairn.protocol import tokens
from cairn.storage.layout import proof_key
from cairn.storage.objects import Storage
from cairn.table import iceberg
from cairn.table.catalog import table_name
from cairn_stack import services
from cairn_stack.demo import create_topic
from tests.conftest import E2E_COMPLETE, E2E_PREFIX, E2E_WAREHOUSE
from tests.integration.conftest import coords, read_archive, stack_env
from tests.integration.test_archive import event

DAY = (datetime.now(UTC) - timedelta(days=3)).date()
"""Three days ago: old enough to be complete, young enough for Kafka's retention."""


def hour(h: float) -> datetime:
    """`h` hours after DAY's midnight (UTC): 26 is 02:00 the day after."""
    return datetime.combine(DAY, time(), UTC) + timedelta(hours=h)


def produce_at(kafka: str, topic: str, partition: int, records: list[tuple[datetime, datetime]]):
    """Produce events at (Kafka create time, event time) to one partition."""
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    for i, (kafka_time, event_time) in enumerate(records):
        value = event(partition * 100 + i, event_time)
        millis = int(kafka_time.timestamp() * 1000)
        producer.produce(topic, value, partition=partition, timestamp=millis)
    assert producer.flush(30) == 0


def produce_day(kafka: str, topic: str) -> None:
    """p0 passes DAY's cutoff (01:00 the next day, lateness 1h) at its second record; p1's
    third record is within the allowance, so p1 passes only when it is archived."""
    produce_at(kafka, topic, 0, [(hour(10), hour(10)), (hour(26), hour(26)), (hour(27), hour(27))])
    produce_at(
        kafka, topic, 1, [(hour(12), hour(12)), (hour(20), hour(20)), (hour(24.5), hour(23.5))]
    )


def test_a_date_completes_when_its_last_partition_passes_and_late_records_amend_it(
    kafka, archiver, make_cfg, topic_name, spark
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    produce_day(kafka, topic_name)
    cfg = make_cfg(topic_name, "max_records_per_partition: 2\nlateness: 1h\n")
    storage = archiver.storage(cfg)

    archiver.run(cfg)  # two records of each partition
    first = completeness.complete_run(cfg, storage, archiver.kafka, "run-1")
    assert (
        first.partition_keys == []
        and completeness.read_marker(storage, topic_name, f"dt={DAY}") is None
    )

    archiver.run(cfg)  # the rest: p1 passes the cutoff too
    second = completeness.complete_run(cfg, storage, archiver.kafka, "run-2")
    assert second.completed == [DAY, DAY + timedelta(days=1)]
    marker = completeness.read_marker(storage, topic_name, f"dt={DAY}")
    assert (marker.records, marker.quarantined, marker.files, marker.token_seq) == (4, 0, 4, 2)
    assert marker.folders == {
        f"dt={DAY}/hr=10": 1,
        f"dt={DAY}/hr=12": 1,
        f"dt={DAY}/hr=20": 1,
        f"dt={DAY}/hr=23": 1,
    }

    produce_at(kafka, topic_name, 1, [(datetime.now(UTC), hour(21))])  # a day late
    archiver.run(cfg)
    third = completeness.complete_run(cfg, storage, archiver.kafka, "run-3")
    assert third.amended == [DAY] and third.completed == []
    amended = completeness.read_marker(storage, topic_name, f"dt={DAY}")
    assert (amended.records, amended.amendments, amended.change) == (5, 1, "amended")

    # Readers that list the folders see the data files only; the timestamps are timestamps.
    assert len(coords(read_archive(storage, topic_name).backup)) == 7
    frame = spark.read.format("avro").load(f"{cfg.root.storage_url}/partitioned/{topic_name}")
    assert frame.count() == 7
    types = dict(frame.dtypes)
    assert types["_kafka_timestamp"] == "timestamp" and types["_event_time"] == "timestamp"


def test_the_archive_dag_marks_the_date_the_downstream_and_seal_dags_run_for_it(
    airflow, kafka, s3, stack_settings
) -> None:
    create_topic(kafka, E2E_COMPLETE, partitions=2)
    produce_day(kafka, E2E_COMPLETE)
    dag_id, downstream = "archive__e2e.complete", "downstream__e2e_complete"
    sealing = "seal__e2e.complete"
    airflow.wait_for_dag(downstream)
    airflow.wait_for_dag(sealing)
    airflow.wait_for_dag(dag_id)

    airflow.trigger(dag_id)  # two records a partition: a second run drains the rest
    runs = airflow.wait_for_runs(dag_id, timeout=900)

    assert all(r["state"] == "success" for r in runs), failed_tasks(airflow, dag_id, runs)
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    committed = tokens.list_tokens(storage, E2E_COMPLETE)
    offsets = [t.next_offsets for t in committed]
    assert offsets[:2] == [{0: 2, 1: 2}, {0: 3, 1: 3}]
    # unpausing a @daily DAG may also schedule a run (the full suite once saw an asset-triggered
    # one too): such runs find nothing new, and their `complete` has no result to read
    assert all(o == offsets[1] for o in offsets[2:])
    done = {t.seq: airflow.xcom(dag_id, t.run_id, "complete") for t in committed[:2]}
    assert done[1]["completed"] == []  # p0 had passed the cutoff, p1 not yet
    days = [DAY.isoformat(), (DAY + timedelta(days=1)).isoformat()]
    assert done[2]["completed"] == days
    marker = completeness.read_marker(storage, E2E_COMPLETE, f"dt={DAY}")
    assert marker is not None and marker.records == 4

    ran = airflow.wait_for_runs(downstream, timeout=300)
    assert all(r["state"] == "success" for r in ran), failed_tasks(airflow, downstream, ran)
    keys = sorted(airflow.xcom(downstream, r["dag_run_id"], "use_date") for r in ran)
    assert keys == days
    assert all(date.fromisoformat(k) for k in keys)

    # The seal DAG runs for both dates: DAY's four records become one file per hour folder, the
    # proof, and the Iceberg table's partition, read back by pyiceberg through the stack's catalog.
    sealed = airflow.wait_for_runs(sealing, timeout=600)
    assert all(r["state"] == "success" for r in sealed), failed_tasks(airflow, sealing, sealed)
    proof = Proof.model_validate_json(storage.read(proof_key(E2E_COMPLETE, f"dt={DAY}")))
    assert (proof.partitioned, proof.table_records) == (4, 4)
    assert (proof.files_before, proof.files_after) == (4, 4)  # one record an hour folder
    stack_catalog = services.iceberg_catalog(
        stack_settings, E2E_WAREHOUSE.format(bucket=stack_settings.bucket)
    )
    table = iceberg.catalog_of(stack_catalog).load_table(f"cairn.{table_name(E2E_COMPLETE)}")
    rows = table.scan(row_filter=EqualTo("_event_date", DAY)).to_arrow().to_pylist()
    archived = [r for f, r in read_archive(storage, E2E_COMPLETE).partitioned if str(DAY) in f]
    assert coords(rows, "_kafka_partition", "_kafka_offset") == [(0, 0), (1, 0), (1, 1), (1, 2)]
    assert coords(archived, "_kafka_partition", "_kafka_offset") == coords(
        rows, "_kafka_partition", "_kafka_offset"
    )
    assert table.current_snapshot().summary["cairn.topic"] == E2E_COMPLETE
    # and by Spark SQL, by name, through `python -m cairn_stack sql` as a user runs it
    statement = (
        f"SELECT _kafka_partition, _kafka_offset FROM cairn.cairn.{table_name(E2E_COMPLETE)} "
        f"WHERE _event_date = DATE'{DAY}'"
    )
    done = subprocess.run(
        [sys.executable, "-m", "cairn_stack", "sql", statement],
        env={**os.environ, **stack_env(airflow.settings)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "_kafka_partition" in done.stdout and "_kafka_offset" in done.stdout
    assert table_rows(done.stdout) == coords(rows, "_kafka_partition", "_kafka_offset")


def table_rows(printed: str) -> list[tuple[int, ...]]:
    """The all-number rows of the table `cairn_stack sql` prints, sorted."""
    found = []
    for line in printed.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and all(c.isdigit() for c in cells):
            found.append(tuple(int(c) for c in cells))
    return sorted(found)


def failed_tasks(airflow, dag_id: str, runs: list[dict]) -> list[tuple[str, str, str]]:
    """(run, task, state) of every task that did not succeed or skip, for failure messages."""
    found = []
    for r in runs:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(r['dag_run_id'])}/taskInstances"
        for ti in airflow.call("GET", path)["task_instances"]:
            if ti["state"] not in ("success", "skipped"):
                found.append((r["dag_run_id"], ti["task_id"], ti["state"]))
    return found
