"""Cairn on a real Spark cluster and a distributed Airflow: the stack's distributed shape that the
suite's Airflow runs in (tests/conftest.py `airflow`): two Celery workers with Redis as broker, a
Spark standalone master and two workers, each its own process and work folder, whose executors
run a Python with nothing of Cairn that cannot see the checkout, and a Spark Connect server on
that cluster. Archive, rebuild and seal run there end to end through Airflow, once through the
Spark Connect server and once by spark-submit; a Spark worker and an Airflow worker are killed
in the middle of a run, and the archive still holds every record exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from cairn.jobs import ArchiveInput, LocalStorageOnCluster
from cairn.kafka.connection import KafkaConf
from cairn.protocol import tokens
from cairn.storage.objects import Storage
from cairn.table import iceberg
from cairn.table.catalog import table_name
from cairn.topics_file import find_topic
from cairn_airflow.hooks.spark_connect import connect_mark_kept, connect_session
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack import cluster, services
from cairn_stack.demo import create_topic, produce, sample_events
from cairn_stack.settings import REPO, StackSettings
from spark_jobs import main
from tests.conftest import (
    E2E_CLUSTER,
    E2E_LOCAL_ROOT,
    E2E_PREFIX,
    E2E_SUBMIT,
    E2E_WAREHOUSE,
    E2E_WORKERS,
)
from tests.integration.conftest import process_tree, read_archive
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once, event
from tests.integration.test_completeness import failed_tasks

DAY = (datetime.now(UTC) - timedelta(days=3)).date()
"""Three days ago: old enough to be complete, young enough for Kafka's retention."""


def at(hours: float) -> datetime:
    return datetime.combine(DAY, clock(), UTC) + timedelta(hours=hours)


def archive_root(settings: StackSettings, s3: dict) -> Storage:
    return Storage(f"s3://{settings.bucket}/{E2E_PREFIX}", **s3)


def test_the_clusters_executors_have_nothing_of_cairn_but_the_code_a_job_ships(
    spark_cluster, cluster_settings
) -> None:
    """A session without Cairn's artifact finds no `cairn` on the executors, which run the
    cluster's Python, see empty code and topics folders, and sit on both workers; once the
    session has the artifact, they import Cairn from it."""
    settings = cluster_settings
    topics = settings.topics_file

    def probe(batches: Iterator) -> Iterator:
        import importlib.util
        import sys

        import pyarrow as pa

        for _ in batches:
            spec = importlib.util.find_spec("cairn")
            found = {
                "python": sys.executable,
                "cairn": None if spec is None else spec.origin,
                "include": sorted(os.listdir(REPO / "include")),
                "topics": sorted(os.listdir(topics)),
                "work": os.getcwd(),
            }
            yield pa.RecordBatch.from_pylist([{"found": json.dumps(found)}])

    def run(session) -> list[dict]:
        rows = session.range(0, 8, 1, 8).mapInArrow(probe, "found string").collect()
        return [json.loads(row.found) for row in rows]

    with connect_mark_kept():
        bare = SparkSession.builder.remote(spark_cluster).create()
        try:
            without = run(bare)
        finally:
            bare.stop()
    assert {f["python"] for f in without} == {str(settings.cluster_python)}
    assert {f["cairn"] for f in without} == {None}
    assert all(f["include"] == [] and f["topics"] == [] for f in without)
    workers = {Path(f["work"]).relative_to(settings.state_dir / "spark").parts[0] for f in without}
    assert workers == {"worker-1", "worker-2"}

    artifact = code_artifact()
    with connect_session(spark_cluster, artifact) as connected:
        shipped = run(connected.session)
    assert {artifact.name in f["cairn"] for f in shipped} == {True}


def produce_day(kafka: str, topic: str, per_partition: int) -> int:
    """`per_partition` events of DAY in each of 2 partitions, the last of them arriving past
    DAY's cutoff (end of DAY + 1h lateness, Kafka time), so one archive run makes DAY complete
    and DAY alone has data."""
    create_topic(kafka, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka, "enable.idempotence": True})
    for p in range(2):
        for i in range(per_partition):
            sent = at(2 + i) if i < per_partition - 1 else at(26)  # the last one late
            value = event(p * 10_000 + i, at(2 + i * 20 / per_partition))
            producer.produce(topic, value, partition=p, timestamp=int(sent.timestamp() * 1000))
    assert producer.flush(30) == 0
    return per_partition


def master_apps(settings: StackSettings) -> list[str]:
    """The names of the applications the cluster's master has run or runs."""
    url = f"http://{settings.host}:{settings.spark_cluster_ui_port}/json/"
    with urllib.request.urlopen(url, timeout=10) as reply:
        state = json.load(reply)
    return [app["name"] for app in state["activeapps"] + state["completedapps"]]


def test_archive_rebuild_and_seal_run_on_the_cluster_through_airflow(
    airflow, kafka, s3, cluster_settings
) -> None:
    """Both ways to the cluster, side by side (their topics share nothing but the cluster): its
    Spark Connect server (E2E_CLUSTER) and applications of their own by spark-submit
    (E2E_SUBMIT). Each topic is archived, its dates sealed and one of them rebuilt."""
    settings = cluster_settings
    topics = (E2E_CLUSTER, E2E_SUBMIT)
    per_partition = {topic: produce_day(kafka, topic, 20) for topic in topics}
    dags = {t: {k: f"{k}__{t}" for k in ("archive", "rebuild", "seal")} for t in topics}
    for dag in (d for t in topics for d in dags[t].values()):
        airflow.wait_for_dag(dag)  # unpaused: Airflow drops asset events for paused DAGs

    def run_everywhere(kind: str, conf: dict | None = None, trigger: bool = True) -> None:
        if trigger:
            for topic in topics:
                airflow.trigger(dags[topic][kind], conf)
        for topic in topics:
            dag = dags[topic][kind]
            runs = airflow.wait_for_runs(dag, timeout=900)
            assert all(r["state"] == "success" for r in runs), failed_tasks(airflow, dag, runs)

    storage = archive_root(settings, s3)
    expected = {t: all_offsets({0: per_partition[t], 1: per_partition[t]}) for t in topics}
    run_everywhere("archive")
    for topic in topics:
        assert_exactly_once(read_archive(storage, topic), expected[topic])
    run_everywhere("seal", trigger=False)  # DAY and the next day became complete
    run_everywhere("rebuild", {"from_date": str(DAY), "to_date": str(DAY)})

    catalog = iceberg.catalog_of(
        services.iceberg_catalog(settings, E2E_WAREHOUSE.format(bucket=settings.bucket))
    )
    apps = set(master_apps(settings))
    for topic in topics:
        assert_exactly_once(read_archive(storage, topic), expected[topic])
        kinds = [t.kind for t in tokens.list_tokens(storage, topic)]
        assert kinds[0] == "archive" and "seal" in kinds and "rebuild" in kinds, (topic, kinds)
        rows = catalog.load_table(f"cairn.{table_name(topic)}").scan().to_arrow()
        offsets = zip(
            rows["_kafka_partition"].to_pylist(), rows["_kafka_offset"].to_pylist(), strict=True
        )
        assert sorted(offsets) == expected[topic], topic
    # where the jobs ran: spark-submitted applications of their own, or the Connect server's
    submitted = {t: {f"cairn-{kind}-{t}" for kind in dags[t]} for t in topics}
    assert submitted[E2E_SUBMIT] <= apps
    assert not submitted[E2E_CLUSTER] & apps
    assert "cairn-spark-connect" in apps


def test_a_local_root_is_refused_on_the_cluster_before_any_spark_work(
    airflow, kafka, cluster_settings, on_the_cluster
) -> None:
    """On the cluster's Spark Connect server the job refuses a local folder before any Spark
    work; through the distributed Airflow the run's first task already does, without retries,
    its cause in one line."""
    cfg = find_topic(E2E_LOCAL_ROOT, cluster_settings.topics_file)
    job = ArchiveInput(
        topic=cfg.snapshot(),
        claim="_claims/nowhere.json",
        kafka=KafkaConf.from_bootstrap(kafka).settings,
        kafka_label="the test broker",
    )
    with pytest.raises(LocalStorageOnCluster) as refused:
        main.run(on_the_cluster, job)
    assert str(refused.value).startswith(f"archive root {cfg.archive_root} is a local folder")
    assert cluster_settings.spark_cluster_url in str(refused.value)

    create_topic(kafka, E2E_LOCAL_ROOT, partitions=1)
    produce(kafka, E2E_LOCAL_ROOT, sample_events(3, NOW), partition=0)
    dag = f"archive__{E2E_LOCAL_ROOT}"
    airflow.wait_for_dag(dag)
    run_id = airflow.trigger(dag)
    runs = airflow.wait_for_runs(dag, timeout=300)  # (unpausing may schedule one more)
    assert {r["state"] for r in runs} == {"failed"}
    plan = airflow.task_instances(dag, run_id)["plan"]
    assert plan["state"] == "failed" and plan["try_number"] == 1
    cause = airflow.xcom(dag, run_id, "plan", key="cairn_failure")
    assert cause.startswith("LocalStorageOnCluster: topic 'e2e.localroot': archive root file://")
    assert "CeleryExecutor" in cause and "\n" not in cause


def connect_app(settings: StackSettings) -> str:
    """The application id the cluster's Spark Connect server runs as."""
    said = services.spark_connect(settings).log.read_text()
    return re.findall(r"Connected to Spark cluster with app ID (\S+)", said)[-1]


def executor_logs(settings: StackSettings, worker: int) -> dict[Path, int]:
    """Each log of the Connect server's executors on the worker, with how much of it is written
    so far: other applications (the spark-submit jobs of other tests' DAGs) run there too."""
    app = settings.state_dir / "spark" / f"worker-{worker}" / connect_app(settings)
    return {log: log.stat().st_size for log in app.glob("*/stderr")}


def running_tasks(settings: StackSettings, worker: int, since: dict[Path, int]) -> set[str]:
    """The tasks the Connect server's executors on the worker started after `since` (the logs'
    sizes then) and have not ended: an executor an earlier test killed left tasks that never
    end in its log."""
    running = set()
    for log in executor_logs(settings, worker):
        with log.open("rb") as f:
            f.seek(since.get(log, 0))
            text = f.read().decode(errors="replace")
        started = set(re.findall(r"Running task \S+ in stage \S+ \(TID (\d+)\)", text))
        ended = re.findall(
            r"(?:Finished|killed|Exception in) task \S+ in stage \S+ \(TID (\d+)", text
        )
        running |= {f"{log.parent}:{tid}" for tid in started - set(ended)}
    return running


def spark_worker(settings: StackSettings, worker: int) -> services.Service:
    return cluster.spark_cluster(settings)[worker]


@pytest.fixture
def workers_back(airflow, cluster_settings) -> Iterator[None]:
    """Every worker a test killed is started again afterwards, for the tests after it."""
    yield
    settings = cluster_settings
    for service in [
        *cluster.spark_cluster(settings)[1:],
        *cluster.celery_workers(settings, services.airflow_env(settings)),
    ]:
        service.start(settings.start_timeout)


def archive_while(airflow, kafka: str, records: int, during) -> tuple[str, list[dict]]:
    """Produce `records` more events into each of E2E_WORKERS' 4 partitions, trigger an archive
    run, call `during(run_id)` until it returns True, and wait for the run (and its retries)."""
    create_topic(kafka, E2E_WORKERS, partitions=4)
    for p in range(4):
        produce(kafka, E2E_WORKERS, sample_events(records, NOW, seed=p), partition=p)
    dag = f"archive__{E2E_WORKERS}"
    airflow.wait_for_dag(dag)
    run_id = airflow.trigger(dag)
    deadline = time.monotonic() + 600
    while not during(run_id):
        assert time.monotonic() < deadline, "the moment to act never came"
        time.sleep(0.2)
    return run_id, airflow.wait_for_runs(dag, timeout=900)


def offsets_now(kafka: str) -> dict[int, int]:
    from cairn.kafka import cluster as kafka_cluster

    state = kafka_cluster.fetch_topic(KafkaConf.from_bootstrap(kafka), E2E_WORKERS)
    return {p: w.high for p, w in state.watermarks.items()}


def test_a_spark_worker_killed_mid_archive_job_loses_and_doubles_nothing(
    airflow, kafka, s3, cluster_settings, workers_back
) -> None:
    """Worker 2 and its executor die while the job's tasks run there: Spark runs them again on
    worker 1, and the run commits every record exactly once."""
    settings = cluster_settings
    server_log = services.spark_connect(settings).log
    seen = len(server_log.read_text())
    before = executor_logs(settings, 2)

    def kill_worker_2(run_id: str) -> bool:
        if not running_tasks(settings, 2, before):
            return False
        os.killpg(spark_worker(settings, 2).pid(), signal.SIGKILL)
        return True

    _, runs = archive_while(airflow, kafka, 40_000, kill_worker_2)

    assert all(r["state"] == "success" for r in runs), runs
    # the driver lost the executor with tasks on it, and ran them again (a task's attempt 1)
    said = server_log.read_text()[seen:]
    assert re.search(r"Lost executor \d+ on", said), "the driver never lost an executor"
    assert re.search(r"Starting task \d+\.1 in stage", said), "no task of the job ran again"
    contents = read_archive(archive_root(settings, s3), E2E_WORKERS)
    assert_exactly_once(contents, all_offsets(offsets_now(kafka)))


def kill_worker(settings: StackSettings, name: str) -> list[int]:
    """SIGKILL the Celery worker `name` and every process it started (its tasks', Spark's
    client included), as a machine that dies takes them all."""
    (service,) = [s for s in cluster.celery_workers(settings, {}) if s.name == name]
    pids = process_tree(service.pid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def test_an_airflow_worker_killed_mid_task_has_the_task_retried_on_the_other_worker(
    airflow, kafka, s3, cluster_settings, workers_back
) -> None:
    """Both workers take tasks from the one queue: the archive task's first try runs on one, and
    when that worker dies with it, its retry runs on the other."""
    settings = cluster_settings
    dag, names = f"archive__{E2E_WORKERS}", {cluster.worker_name(i) for i in (1, 2)}
    killed: dict[str, str] = {}  # run id: the worker its archive task died with

    def kill_the_archive_tasks_worker(_: str) -> bool:
        # any run: unpausing the DAG may have scheduled one before the triggered one
        for run in airflow.runs(dag):
            archive = airflow.task_instances(dag, run["dag_run_id"]).get("archive", {})
            if archive.get("state") == "running" and archive["hostname"] in names:
                killed[run["dag_run_id"]] = archive["hostname"]
                assert len(kill_worker(settings, archive["hostname"])) > 2  # with its task
                return True
        return False

    _, runs = archive_while(airflow, kafka, 30_000, kill_the_archive_tasks_worker)

    assert all(r["state"] == "success" for r in runs), runs
    ((run_id, first),) = killed.items()
    archive = airflow.task_instances(dag, run_id)["archive"]
    assert archive["try_number"] >= 2 and {first, archive["hostname"]} == names
    contents = read_archive(archive_root(settings, s3), E2E_WORKERS)
    assert_exactly_once(contents, all_offsets(offsets_now(kafka)))
