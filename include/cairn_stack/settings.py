"""Ports, credentials and names of the local stack, overridable from `CAIRN_*` variables.

docker-compose.yml and `.env.example` carry the same values; tests/unit/test_compose.py keeps
them in step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO = Path(__file__).resolve().parents[2]


def local_master() -> str:
    """`local[N]` with two task slots per core this process may use. An archive task waits on
    Kafka about a fifth of its time (Spark's consumer asks the broker for the partition's
    offsets after every poll), so with one slot per core the cores idle while tasks wait: with
    two, the 1M-record benchmark's Spark stage kept 1.8 of 2 cores busy instead of 1.6, and ran
    ~11% faster."""
    linux = hasattr(os, "sched_getaffinity")
    cores = len(os.sched_getaffinity(0)) if linux else os.cpu_count() or 1
    return f"local[{2 * cores}]"


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAIRN_")

    state_dir: Path = REPO / ".cairn" / "stack"
    """All the stack's state: data, logs, pid files."""
    jars_dir: Path = REPO / ".cairn" / "jars"
    """Filled by `make jars` (Maven): `kafka/` for the broker and tools, `spark/` for Spark."""

    host: str = "127.0.0.1"
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    kafka_sasl_port: int = 9094
    """The broker's second listener: SASL_SSL (SCRAM-SHA-512 over TLS, `services.kafka`)."""
    s3_port: int = 8333
    seaweed_master_port: int = 9333
    seaweed_volume_port: int = 18080
    seaweed_filer_port: int = 18888
    seaweed_metrics_port: int = 19327
    """SeaweedFS's Prometheus metrics (`benchmarks/requests_per_run.py` counts S3 requests)."""
    airflow_port: int = 8080
    airflow_health_port: int = 8974
    """The scheduler's health check server, on `host` only. The scheduler serves no task logs
    over the network: the api-server reads them from the shared local log folder."""
    postgres_port: int = 5432
    """PostgreSQL (`services.postgres`): Airflow's metadata database and the Iceberg catalog's."""

    s3_access_key: str = "cairn"
    s3_secret_key: str = "cairn-secret-key"
    bucket: str = "cairn-archive"
    kafka_sasl_user: str = "cairn"
    kafka_sasl_password: str = "cairn-kafka-secret"
    """The SCRAM user the secured listener knows from its first start."""

    kafka_conn_id: str = "cairn_kafka"
    s3_conn_id: str = "cairn_s3"
    spark_conn_id: str = "cairn_spark"
    spark_submit_conn_id: str = "cairn_spark_submit"
    """A `spark` connection beside `spark_conn_id`: spark-submit to the stack's master (the
    cluster, in the distributed shape), for topics whose `spark_connection` names it."""
    spark_pool: str = "cairn_spark"
    """The Airflow pool Cairn's Spark tasks run in (Airflow gets it as `CAIRN_SPARK_POOL`)."""
    spark_pool_slots: int = 2
    """How many Spark tasks (rebuilds, seals, archive runs alone) run at once: the pool's slots,
    set at every start. 2 suits a 2-core machine. A shared archive job holds no slot: its runs'
    tasks start in the triggerer, which runs it."""
    scheduler_idle_sleep: PositiveFloat = 0.2
    """Seconds Airflow's scheduler sleeps after a loop that found nothing to do (its default is
    1). Each task of a run waits up to that long to be scheduled after the one before it; at 0.2
    a one-record run commits about 1.6 s sooner, for ~5% more of one core while idle."""
    dag_file_interval: PositiveInt = 1800
    """Seconds between the DAG processor's parses of the DAG files (Airflow's
    `min_file_process_interval`, 30 by default). Each parse builds every topic's DAGs, which is
    most of what idle topics cost; a changed topics file is parsed sooner, within five minutes
    (`cairn_airflow.dag_parse`)."""
    shared_job_gather_seconds: PositiveFloat = 2.0
    """How long a shared archive job waits, after its first run arrives, for others to share it
    (`cairn_airflow.triggers.shared_archive`; Airflow's `[cairn] shared_job_gather_seconds`)."""
    triggerer_capacity: PositiveInt = 5000
    """How many triggers the triggerer runs at once (Airflow's `[triggerer] capacity`, 1,000 by
    default). Each `run_on: records` topic holds one for good (its watcher), and each archive run
    in flight one more while a step runs there: at Airflow's default, 1,000 watched topics fill
    the triggerer and no run's task that starts there is ever picked up."""
    airflow_dags_paused: bool = False
    """New DAGs start paused. The test stack sets it, so that no scheduled run starts before a
    test has created its topic (a run on a missing topic fails and retries for minutes)."""
    airflow_user: str = "admin"
    airflow_password: str = "admin"
    postgres_user: str = "airflow"
    postgres_password: str = "airflow"
    catalog_name: str = "cairn"
    """The Iceberg catalog's name: Spark SQL names a topic's table `cairn.cairn.<table>`, and
    pyiceberg must load the catalog under the same name to see Spark's tables."""
    catalog_database: str = "cairn_catalog"
    """The Iceberg JDBC catalog's database, beside Airflow's in the same PostgreSQL."""
    catalog_warehouse: str = (REPO / ".cairn" / "warehouse").as_uri()
    """Where the Iceberg catalog puts the topics' tables: a local folder by default, or
    `s3://<bucket>/<prefix>` on the stack's SeaweedFS."""
    catalog_user: str = "cairn"
    catalog_password: str = "cairn-catalog-secret"
    """The login that owns the catalog's database (created with it at the first start)."""

    spark_connect_port: int = 15002
    """The long-lived Spark Connect server (`services.spark_connect`) that Airflow's Spark
    connection points at: archive and rebuild runs start no JVM of their own."""
    cluster: bool = False
    """The distributed shape (`make up CLUSTER=1`, `cairn_stack.cluster`): Airflow's
    CeleryExecutor with `celery_workers` workers and Redis as its broker, task logs in S3, and a
    Spark standalone cluster of `spark_workers` workers that runs the Spark Connect server's jobs
    and the spark-submitted ones, its executors on `cluster_python`, which has nothing of Cairn."""
    redis_port: int = 6379
    """Redis (Debian's `redis-server`), the Celery broker of the distributed shape."""
    celery_workers: int = 2
    celery_concurrency: int = 2
    """Task slots per Celery worker."""
    spark_cluster_port: int = 7077
    spark_cluster_ui_port: int = 8081
    spark_worker_ui_port: int = 8082
    """The first worker's web UI; worker i takes this port + i."""
    spark_workers: int = 2
    spark_worker_cores: int = 4
    """Task slots each worker offers (more than its share of the cores: an archive task waits on
    Kafka part of its time, as `local_master` explains). Two workers' 8 slots hold the Spark
    Connect server's share and two spark-submitted jobs at once (the Spark pool's 2 slots)."""
    spark_worker_memory: str = "3g"
    spark_connect_cores: int = 4
    """The Spark Connect server's share of the cluster's slots (`spark.cores.max`); the rest is
    left to spark-submitted jobs (`spark_submit_cores` each)."""
    spark_submit_cores: int = 2
    cluster_python: Path = REPO / ".cairn" / "cluster-python" / "bin" / "python"
    """The Python of the cluster's executors: a virtualenv of requirements-cluster.txt only
    (`make setup` builds it), nothing of Cairn, as on a cluster Cairn was never installed on."""
    task_heartbeat_timeout: int = 300
    """Seconds without a heartbeat after which the scheduler fails a task whose worker died
    (`[scheduler] task_instance_heartbeat_timeout`), so its retry runs on another worker."""
    spark_master: str = Field(default_factory=local_master)
    """Where the Spark Connect server runs its jobs (`local_master`: two task slots per core);
    point it at a cluster to scale out."""
    spark_conn_type: Literal["spark_connect", "spark"] = "spark_connect"
    """The type of Airflow's Spark connection: `spark_connect` runs jobs on the Spark Connect
    server; `spark` spark-submits each run to `spark_master` (a JVM per run, as before)."""
    topics_file: Path = REPO / "include" / "topics.yaml"
    """The topics file, or a folder of topics files (`topics.d/*.yaml`), that Airflow reads
    (`CAIRN_TOPICS_FILE`)."""
    extra_dag_folders: list[Path] = []
    """More DAG folders (each its own Airflow DAG bundle) beside dags/: the tests' examples."""
    notifier: str = "cairn_stack.notify.record"
    """What Airflow calls on an alert (`CAIRN_NOTIFIER`); the stack's writes `alerts_file`."""
    statsd_port: int | None = None
    """Send Airflow's metrics (Cairn's among them) as StatsD to this UDP port on `host`."""

    start_timeout: float = 120.0
    """Seconds each service has to become healthy before `up` gives up."""

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def kafka_ca_file(self) -> Path:
        """The CA that signed the secured listener's certificate (made at Kafka's first start)."""
        return self.state_dir / "kafka" / "tls" / "ca.pem"

    @property
    def kafka_sasl_config(self) -> dict[str, str]:
        """librdkafka configuration (a `kafka` connection's extra) for the secured listener."""
        return {
            "bootstrap.servers": f"{self.host}:{self.kafka_sasl_port}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.kafka_sasl_user,
            "sasl.password": self.kafka_sasl_password,
            "ssl.ca.location": str(self.kafka_ca_file),
        }

    @property
    def spark_cluster_url(self) -> str:
        return f"spark://{self.host}:{self.spark_cluster_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.host}:{self.redis_port}/0"

    @property
    def spark_connect_url(self) -> str:
        return f"sc://{self.host}:{self.spark_connect_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def postgres_url(self) -> str:
        """Airflow's metadata database, as a libpq URL."""
        user, password = self.postgres_user, self.postgres_password
        return f"postgresql://{user}:{password}@{self.host}:{self.postgres_port}/airflow"

    @property
    def catalog_jdbc_url(self) -> str:
        """The Iceberg catalog's database, as its JDBC catalog (in Spark) reaches it."""
        return f"jdbc:postgresql://{self.host}:{self.postgres_port}/{self.catalog_database}"

    @property
    def airflow_database_url(self) -> str:
        """The same database for SQLAlchemy, through psycopg2."""
        return self.postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1)

    @property
    def alerts_file(self) -> Path:
        """Where the stack's notifier (`cairn_stack.notify`) appends alerts."""
        return self.state_dir / "airflow" / "alerts.jsonl"

    @property
    def airflow_url(self) -> str:
        return f"http://{self.host}:{self.airflow_port}"
