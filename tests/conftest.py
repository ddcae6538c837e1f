"""Test harness: real Kafka (KRaft), SeaweedFS (S3), PostgreSQL and Spark (local mode, and a
Spark Connect server), and Airflow in the stack's distributed shape (Celery workers with Redis,
a Spark standalone cluster with its own Spark Connect server), started on free loopback ports
with all state in a temporary folder when a test first asks for them, and stopped afterwards.
`make test` runs the suite on two pytest-xdist workers: each starts, on ports of its own share,
the services its tests ask for (see AIRFLOW_GROUP).

Tests under tests/integration/ are marked `integration` automatically; `pytest -m "not
integration"` runs only the fast unit tests.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn_stack import cluster, services
from cairn_stack.airflow_api import AirflowAPI
from cairn_stack.process import free_port_block, share_ports
from cairn_stack.settings import REPO, StackSettings

ROOT = Path(__file__).resolve().parent
AIRFLOW_GROUP = "airflow"
"""Every test through Airflow is in this pytest-xdist group (`--dist loadgroup`): one worker runs
them all, so Airflow starts once, while the other worker runs the rest beside it."""


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", … under pytest-xdist
    if worker:
        share_ports(int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (ROOT / "integration") in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
        if "airflow" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(AIRFLOW_GROUP))


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> StackSettings:
    """Settings for a private stack: free ports, state under a temporary folder."""
    *ports, connect = free_port_block(15, step=2)
    (
        kafka,
        s3,
        master,
        volume,
        filer,
        airflow,
        health,
        spark,
        spark_ui,
        worker_ui,
        pg,
        sasl,
        *more,
    ) = ports
    metrics, redis = more
    return StackSettings(
        state_dir=tmp_path_factory.mktemp("stack"),
        kafka_port=kafka,
        kafka_controller_port=kafka + 1,
        kafka_sasl_port=sasl,
        s3_port=s3,
        seaweed_master_port=master,
        seaweed_volume_port=volume,
        seaweed_filer_port=filer,
        seaweed_metrics_port=metrics,
        airflow_port=airflow,
        airflow_health_port=health,
        spark_cluster_port=spark,
        spark_cluster_ui_port=spark_ui,
        spark_worker_ui_port=worker_ui,
        postgres_port=pg,
        spark_connect_port=connect,
        spark_master="local[2]",
        redis_port=redis,
        dag_file_interval=30,  # Airflow's default: tests change topics files and wait for DAGs
        shared_job_gather_seconds=8.0,  # a burst's runs defer seconds apart on a loaded machine
    )


@pytest.fixture(scope="session")
def kafka(stack_settings: StackSettings) -> Iterator[str]:
    """A running single-node KRaft broker; yields its bootstrap servers."""
    service = services.kafka(stack_settings)
    service.start(stack_settings.start_timeout)
    yield stack_settings.bootstrap_servers
    service.stop()


@pytest.fixture(scope="session")
def kafka_secured(kafka: str, stack_settings: StackSettings) -> dict[str, str]:
    """The same broker's SASL_SSL listener (SCRAM-SHA-512 over TLS): librdkafka configuration
    with the stack's user and CA, as a `kafka` Airflow connection's extra holds it."""
    return stack_settings.kafka_sasl_config


@pytest.fixture(scope="session")
def s3(stack_settings: StackSettings) -> Iterator[dict]:
    """A running SeaweedFS S3 with the archive bucket; yields fsspec options for it."""
    service = services.seaweedfs(stack_settings)
    service.start(stack_settings.start_timeout)
    yield services.s3_options(stack_settings)
    service.stop()


@pytest.fixture(scope="session")
def postgres(stack_settings: StackSettings) -> Iterator[StackSettings]:
    """A running PostgreSQL with Airflow's and the Iceberg catalog's databases; yields the
    settings that reach them (`postgres_url`, `catalog_jdbc_url`, `services.iceberg_catalog`).
    Airflow's services use this one."""
    service = services.postgres(stack_settings)
    service.start(stack_settings.start_timeout)
    yield stack_settings
    service.stop()


@pytest.fixture(scope="session")
def spark(stack_settings: StackSettings):
    """A local-mode SparkSession with the Kafka connector from the Maven-fetched jars."""
    from pyspark.sql import SparkSession

    jars = sorted(str(p) for p in services.jars(stack_settings, "spark").glob("*.jar"))
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers need this venv's packages
    session = (
        SparkSession.builder.master("local[2]")
        .appName("cairn-tests")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect(stack_settings: StackSettings) -> Iterator[str]:
    """A running Spark Connect server (local mode, the Kafka connector, this venv's Python);
    yields its URL. Airflow's Spark connection points here."""
    service = services.spark_connect(stack_settings)
    service.start(stack_settings.start_timeout)
    yield stack_settings.spark_connect_url
    service.stop()


@pytest.fixture
def connected(spark_connect: str):
    """A session on the Spark Connect server held as a run holds it (the server's shared Cairn
    session), let go afterwards."""
    from cairn_airflow.hooks.spark_connect import connect_session
    from cairn_airflow.spark_artifact import code_artifact

    with connect_session(spark_connect, code_artifact()) as connected:
        yield connected.session


E2E_TOPIC = "e2e.orders"
E2E_FIXED = "e2e.fixed"
E2E_OVERVIEW = "e2e.overview"
E2E_PREFIX = "e2e"
E2E_WAREHOUSE = "s3://{bucket}/e2e-warehouse"
"""Where the Airflow stack's Iceberg catalog puts the E2E topics' tables (sealed dates)."""
E2E_COMPLETE = "e2e.complete"
"""Read 2 records per partition a run; tests/dags/cairn_downstream.py runs on its dates. Its
records are days old: no time-lag alert for them."""
E2E_CLUSTER = "e2e.cluster"
E2E_SUBMIT = "e2e.submit"
"""Archived, rebuilt and sealed on the stack's Spark cluster: through its Spark Connect server
(the deployment's `cairn_spark`), and by spark-submit (`spark_connection: cairn_spark_submit`)."""
E2E_WORKERS = "e2e.workers"
"""Archived while a Spark worker or an Airflow worker is killed."""
E2E_LOCAL_ROOT = "e2e.localroot"
"""Its archive root is a local folder: refused on the cluster."""
E2E_BURST = ("e2e.burst.a", "e2e.burst.b", "e2e.burst.c")
"""Topics triggered together: their runs share Spark jobs (tests/integration/test_shared_job.py)."""
E2E_WATCHED = "e2e.watched"
WATCHED_DELAY = 15
"""Runs when records wait (`run_on: records`): the oldest waiting WATCHED_DELAY seconds."""
E2E_LAGGING = "e2e.lagging"
E2E_QUIET = "e2e.quiet"
"""Both alert past 1s of time lag: the lagging one reads 5 records a run, the quiet one all;
the lagging one's runs also outlast its max_run_duration (its Deadline Alert fires)."""


BURST_ENTRIES = "".join(
    f"  - topic: {t}\n    event_time: {{field: ts, encoding: iso8601}}\n" for t in E2E_BURST
)


def e2e_topics(settings: StackSettings, fixed_field: str) -> str:
    """The topics file Airflow runs with; E2E_FIXED reads its event time from `fixed_field`."""
    schema = REPO / "include" / "schemas" / "demo_event.avsc"
    return f"""
defaults:
  format: json
  schema: {schema}
  archive_root: s3://{settings.s3_conn_id}@{settings.bucket}/{E2E_PREFIX}
  run_on: schedule
  schedule: "@daily"
topics:
  - topic: {E2E_WATCHED}
    event_time: {{field: ts, encoding: iso8601}}
    run_on: records
    max_delay: {WATCHED_DELAY}s
    max_time_lag: 30d
  - topic: {E2E_TOPIC}
    event_time: {{field: ts, encoding: iso8601}}
    max_records_per_partition: 60
  - topic: {E2E_FIXED}
    event_time: {{field: {fixed_field}, encoding: iso8601}}
  - topic: {E2E_LAGGING}
    event_time: {{field: ts, encoding: iso8601}}
    max_records_per_partition: 5
    max_time_lag: 1s
    max_run_duration: 5s
  - topic: {E2E_QUIET}
    event_time: {{field: ts, encoding: iso8601}}
    max_time_lag: 1s
  - topic: {E2E_COMPLETE}
    event_time: {{field: ts, encoding: iso8601}}
    max_records_per_partition: 2
    lateness: 1h
    max_time_lag: 30d
  - topic: {E2E_CLUSTER}
    event_time: {{field: ts, encoding: iso8601}}
    max_time_lag: 30d
  - topic: {E2E_SUBMIT}
    event_time: {{field: ts, encoding: iso8601}}
    max_time_lag: 30d
    spark_connection: {settings.spark_submit_conn_id}
  - topic: {E2E_WORKERS}
    event_time: {{field: ts, encoding: iso8601}}
    max_time_lag: 30d
    share_spark_job: false  # its archive task runs the job on a worker, which a test kills
  - topic: {E2E_LOCAL_ROOT}
    event_time: {{field: ts, encoding: iso8601}}
    archive_root: {(settings.state_dir / "local-root").as_uri()}
{BURST_ENTRIES}  - topic: {E2E_OVERVIEW}
    event_time: {{field: ts, encoding: iso8601}}
    max_quarantine_ratio: 0.5
    max_records_per_partition: 110
"""


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def cluster_settings(stack_settings: StackSettings, tmp_path_factory) -> StackSettings:
    """The stack's distributed shape, which Airflow runs in (`cairn_stack.cluster`): Celery
    workers with Redis, a Spark standalone master and two workers whose executors run the
    cluster's Python (nothing of Cairn), a Spark Connect server on that cluster, archiving the
    E2E topics (e2e_topics, the file e2e.yaml of its topics folder) to S3."""
    topics = tmp_path_factory.mktemp("airflow-topics") / "topics.d"
    topics.mkdir()
    (topics / "e2e.yaml").write_text(e2e_topics(stack_settings, fixed_field="sent_at"))
    (connect,) = free_port_block(1)
    return stack_settings.model_copy(
        update={
            "cluster": True,
            "spark_connect_port": connect,  # the local Connect server keeps the other
            "topics_file": topics,
            "airflow_dags_paused": True,
            "extra_dag_folders": [ROOT / "dags"],  # the example downstream DAG
            "statsd_port": free_udp_port(),  # tests listen there (test_alerts)
            "catalog_warehouse": E2E_WAREHOUSE.format(bucket=stack_settings.bucket),
            "task_heartbeat_timeout": 45,  # a killed worker's task is retried within a minute
        }
    )


@contextlib.contextmanager
def started(settings: StackSettings, them: list[services.Service]) -> Iterator[None]:
    """`them` running for the block, stopped (in reverse) afterwards, whatever happened."""
    running = []
    try:
        for service in them:
            service.start(settings.start_timeout)
            running.append(service)
        yield
    finally:
        for service in reversed(running):
            service.stop()


@pytest.fixture(scope="session")
def spark_cluster(cluster_settings: StackSettings) -> Iterator[str]:
    """The stack's Spark standalone cluster (a master, two workers whose executors run the
    cluster's Python and cannot see the checkout) with its Spark Connect server; yields the
    server's URL."""
    settings = cluster_settings
    with started(settings, [*cluster.spark_cluster(settings), services.spark_connect(settings)]):
        yield settings.spark_connect_url


@pytest.fixture
def on_the_cluster(spark_cluster: str):
    """A session on the cluster's Spark Connect server, held as a run holds it (its code version's
    session, the code artifact added), let go afterwards."""
    from cairn_airflow.hooks.spark_connect import connect_session
    from cairn_airflow.spark_artifact import code_artifact

    with connect_session(spark_cluster, code_artifact()) as connected:
        yield connected.session


@pytest.fixture(scope="session")
def airflow(
    cluster_settings: StackSettings,
    kafka: str,
    s3: dict,
    postgres: StackSettings,
    spark_cluster: str,
) -> Iterator[AirflowAPI]:
    """Airflow 3 (api-server, scheduler, dag-processor and two Celery workers, on the session's
    PostgreSQL and Redis) whose Spark connections reach the stack's Spark standalone cluster:
    `cairn_spark` through its Spark Connect server, `cairn_spark_submit` by spark-submit."""
    settings = cluster_settings
    with started(settings, [cluster.redis(settings), *services.airflow(settings)]):
        yield AirflowAPI(settings)
