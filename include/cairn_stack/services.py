"""The stack's services — Kafka (KRaft), SeaweedFS (S3), PostgreSQL and Airflow 3 — as
`Service` objects.

Each function takes the settings and returns what `Service.start` needs; first-start chores
(formatting Kafka's storage, writing SeaweedFS credentials, creating Airflow's and the Iceberg
catalog's databases, migrating Airflow's) live here too, so the CLI and the test fixtures start
the very same things.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from cairn.storage import s3_access
from cairn.table import catalog
from cairn_stack import certs, cluster
from cairn_stack.process import Service, StackError, port_open
from cairn_stack.settings import REPO, StackSettings

DAG_FILE_PROCESSOR_TIMEOUT = 600
"""Seconds a parse of a DAG file may take before the DAG processor kills it (Airflow: 50)."""

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


def java() -> str | None:
    """The `java` to run Kafka and Spark with: $JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return exe if exe and Path(exe).exists() else None


def jars(settings: StackSettings, group: str) -> Path:
    """The folder of one jar group (`kafka`, `spark`), checked to be filled by `make jars`."""
    folder = settings.jars_dir / group
    if not any(folder.glob("*.jar")):
        raise StackError(f"jars: no jars in {folder}; run `make jars` first")
    return folder


def kafka(settings: StackSettings) -> Service:
    """A single KRaft node with two client listeners on `host`: PLAINTEXT on `kafka_port`, and
    SASL_SSL (SCRAM-SHA-512 over TLS, certificates from `certs`) on `kafka_sasl_port`, whose
    user is set from the settings at every start. Brokers and controller talk PLAINTEXT."""
    state = settings.state_dir / "kafka"
    data = state / "data"
    props = state / "server.properties"
    state.mkdir(parents=True, exist_ok=True)
    host, port, cport = settings.host, settings.kafka_port, settings.kafka_controller_port
    sport = settings.kafka_sasl_port
    keystore = settings.kafka_ca_file.parent / certs.KEYSTORE_FILE
    sasl_ssl = "listener.name.sasl_ssl"
    props.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{host}:{cport}",
                f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport},"
                f"SASL_SSL://{host}:{sport}",
                f"advertised.listeners=PLAINTEXT://{host}:{port},SASL_SSL://{host}:{sport}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                "SASL_SSL:SASL_SSL",
                "sasl.enabled.mechanisms=SCRAM-SHA-512",
                f"{sasl_ssl}.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                f"{sasl_ssl}.ssl.keystore.type=PEM",
                f"{sasl_ssl}.ssl.keystore.location={keystore}",
                f"log.dirs={data}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "message.max.bytes=16777216",
                "auto.create.topics.enable=true",  # Kafka's default: Cairn must never ask
            ]
        )
        + "\n"
    )
    log4j = state / "log4j2.properties"
    log4j.write_text(LOG4J2)
    classpath = f"{settings.jars_dir / 'kafka'}/*"
    heap = ["-Xms256m", "-Xmx1g"]
    jvm = [java() or "java", *heap, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]

    def prepare() -> None:
        if java() is None:
            raise StackError("kafka: no Java found (install Java 17+, or set JAVA_HOME)")
        jars(settings, "kafka")
        certs.ensure_server_tls(settings.kafka_ca_file.parent, [host, "localhost"])
        if (data / "meta.properties").exists():
            return
        cluster_id = kafka_cluster_id()
        fmt = [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)]
        done = subprocess.run(fmt, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise StackError(f"kafka: formatting storage failed:\n{done.stdout}{done.stderr}")

    return Service(
        name="kafka",
        argv=[*jvm, "kafka.Kafka", str(props)],
        state_dir=settings.state_dir,
        ports=[port, cport, sport],
        healthy=lambda: (
            _kafka_ready(settings.bootstrap_servers)
            and port_open(sport, host)
            and _scram_user(settings)
        ),
        prepare=prepare,
    )


def _kafka_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        return bool(admin.list_topics(timeout=2).brokers)
    except Exception:
        return False


def _scram_user(settings: StackSettings) -> bool:
    """Set the SASL_SSL listener's SCRAM user to the settings' password (over the plaintext
    listener), on every start: a state folder made before the listener existed, or a changed
    password, then works without a fresh folder, and the password never shows in an argv."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    upsert = UserScramCredentialUpsertion(
        settings.kafka_sasl_user,
        ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
        settings.kafka_sasl_password.encode(),
    )
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, "log_level": 0})
    try:
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=5).values():
            future.result()
        return True
    except Exception:
        return False


def seaweedfs(settings: StackSettings) -> Service:
    """Master, volume server, filer and S3 gateway in one process, on `host`.

    The S3 gateway gets a key-encryption key (made at first start, kept in the state folder),
    so writes that ask for server-side encryption (`AES256`) are encrypted and answered as on
    AWS instead of refused; `aws:kms` needs a KMS it does not have.
    """
    state = settings.state_dir / "seaweedfs"
    (state / "data").mkdir(parents=True, exist_ok=True)
    kek = state / "sse_kek"
    if not kek.exists():
        kek.write_text(secrets.token_hex(32))
        kek.chmod(0o600)
    s3_config = state / "s3.json"
    s3_config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "cairn",
                        "credentials": [
                            {
                                "accessKey": settings.s3_access_key,
                                "secretKey": settings.s3_secret_key,
                            }
                        ],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    weed = str(Path(sys.executable).parent / "weed")
    master, volume, filer = (
        settings.seaweed_master_port,
        settings.seaweed_volume_port,
        settings.seaweed_filer_port,
    )
    grpc = {
        "master": master + 1,
        "volume": volume + 1,
        "filer": filer + 1,
        "s3": settings.s3_port + 1,
    }
    argv = [
        weed,
        "server",
        f"-dir={state / 'data'}",
        f"-ip={settings.host}",
        f"-ip.bind={settings.host}",
        f"-master.port={master}",
        f"-master.port.grpc={grpc['master']}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=256",
        f"-volume.port={volume}",
        f"-volume.port.grpc={grpc['volume']}",
        "-volume.max=0",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={grpc['filer']}",
        "-s3",
        f"-s3.port={settings.s3_port}",
        f"-s3.port.grpc={grpc['s3']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_config}",
        f"-metricsPort={settings.seaweed_metrics_port}",
    ]
    return Service(
        name="seaweedfs",
        argv=argv,
        state_dir=settings.state_dir,
        ports=[
            master,
            volume,
            filer,
            settings.s3_port,
            settings.seaweed_metrics_port,
            *grpc.values(),
        ],
        healthy=lambda: port_open(settings.s3_port) and _bucket_ready(settings),
        env={"WEED_S3_SSE_KEK": kek.read_text()},
    )


def kafka_cluster_id() -> str:
    """A random KRaft cluster id, as Kafka's `Uuid.randomUuid` makes them: base64 of 16
    bytes, never starting with `-`, which the storage tool would read as an option."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


def s3_options(settings: StackSettings) -> dict:
    """fsspec/s3fs options for the stack's S3 endpoint."""
    credentials = s3_access.Credentials(settings.s3_access_key, settings.s3_secret_key)
    return s3_access.s3_options(credentials, settings.s3_endpoint, "us-east-1")


def _bucket_ready(settings: StackSettings) -> bool:
    """Create the archive bucket if needed; True once it answers."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options(settings), skip_instance_cache=True)
    try:
        if not fs.exists(settings.bucket):
            fs.mkdir(settings.bucket)
        fs.ls(settings.bucket)
        return True
    except Exception:
        return False


def airflow_env(settings: StackSettings) -> dict[str, str]:
    """Airflow's configuration and connections, all from the environment."""
    home = settings.state_dir / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    secret_file = home / "jwt_secret"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_urlsafe(32))
    # The static bearer token Prometheus scrapes /cairn/metrics with (cairn_airflow.pages).
    metrics_token = home / "metrics_token"
    if not metrics_token.exists():
        metrics_token.write_text(secrets.token_urlsafe(32))
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({settings.airflow_user: settings.airflow_password}))
    # The Kafka provider's connection type; its extra is librdkafka configuration. Airflow
    # reaches Kafka as a secured cluster's client would: SASL_SSL, trusting the stack's CA.
    kafka_conn = {"conn_type": "kafka", "extra": settings.kafka_sasl_config}
    # The Amazon provider's type; every write asks for SSE-S3, which SeaweedFS here honours.
    s3_conn = {
        "conn_type": "aws",
        "login": settings.s3_access_key,
        "password": settings.s3_secret_key,
        "extra": {
            "endpoint_url": settings.s3_endpoint,
            "region_name": "us-east-1",
            "cairn": {"server_side_encryption": "AES256"},
        },
    }
    # The Apache Spark provider's `spark_connect` type: runs use the stack's Spark Connect
    # server. A `spark` connection (host: a master URL) spark-submits each run instead; on the
    # cluster its extra names the executors' Python and the jobs' share of the cluster.
    connect_conn: dict = {
        "conn_type": "spark_connect",
        "host": f"sc://{settings.host}",
        "port": settings.spark_connect_port,
    }
    submit_conn: dict = {"conn_type": "spark", "host": cluster.spark_master_url(settings)}
    if settings.cluster:
        cores = {"spark.cores.max": str(settings.spark_submit_cores)}
        submit_conn["extra"] = {"cairn": {"python": str(settings.cluster_python), "conf": cores}}
    spark_conn = submit_conn if settings.spark_conn_type == "spark" else connect_conn
    # The Iceberg catalog of the topics' tables (cairn_airflow.hooks.catalog): JDBC, in PostgreSQL.
    stack_catalog = iceberg_catalog(settings, settings.catalog_warehouse)
    catalog_conn = {
        "conn_type": "generic",
        "login": settings.catalog_user,
        "password": settings.catalog_password,
        "extra": catalog.connection_extra(stack_catalog),
    }
    conn = {
        settings.kafka_conn_id: kafka_conn,
        settings.s3_conn_id: s3_conn,
        settings.spark_conn_id: spark_conn,
        settings.spark_submit_conn_id: submit_conn,
        "cairn_catalog": catalog_conn,
    }
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(settings.airflow_dags_paused),
        "CAIRN_TOPICS_FILE": str(settings.topics_file),
        "CAIRN_SPARK_POOL": settings.spark_pool,
        "CAIRN_JARS_DIR": str(settings.jars_dir),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{settings.airflow_url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{settings.airflow_user}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": settings.airflow_database_url,
        "AIRFLOW__API_AUTH__JWT_SECRET": secret_file.read_text(),
        "CAIRN_METRICS_TOKEN": metrics_token.read_text(),
        "AIRFLOW__API__BASE_URL": settings.airflow_url,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(settings.scheduler_idle_sleep),
        "AIRFLOW__CAIRN__SHARED_JOB_GATHER_SECONDS": str(settings.shared_job_gather_seconds),
        "AIRFLOW__TRIGGERER__CAPACITY": str(settings.triggerer_capacity),
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(settings.dag_file_interval),
        # a parse of 1,000 topics' DAGs took over Airflow's 50 s under a burst's load, and a
        # killed parse marks every DAG of its file stale, mid-run
        "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": str(DAG_FILE_PROCESSOR_TIMEOUT),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": settings.host,
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(settings.airflow_health_port),
    }
    if settings.extra_dag_folders:
        local = "airflow.dag_processing.bundles.local.LocalDagBundle"
        bundles = [{"name": "dags-folder", "classpath": local, "kwargs": {}}] + [
            {"name": f"extra-{i}", "classpath": local, "kwargs": {"path": str(folder)}}
            for i, folder in enumerate(settings.extra_dag_folders)
        ]
        env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(bundles)
    if settings.cluster:
        env.update(cluster.celery_env(settings))
    env["CAIRN_NOTIFIER"] = settings.notifier
    env["CAIRN_ALERTS_FILE"] = str(settings.alerts_file)
    if settings.statsd_port is not None:
        env["AIRFLOW__METRICS__STATSD_ON"] = "True"
        env["AIRFLOW__METRICS__STATSD_HOST"] = settings.host
        env["AIRFLOW__METRICS__STATSD_PORT"] = str(settings.statsd_port)
    for conn_id, value in conn.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(value)
    return env


def postgres(settings: StackSettings) -> Service:
    """PostgreSQL 16 from the `pgserver` wheel, on loopback only: Airflow's metadata database
    and, beside it, the Iceberg JDBC catalog's (`_catalog_database`).

    Not SQLite for Airflow: with LocalExecutor, concurrent task-state writes through the
    api-server held SQLite's one write lock against each other for a minute and failed runs.
    """
    state = settings.state_dir / "postgres"
    data = state / "data"
    bin_dir = postgres_bin()

    def run(argv: list[str], stdin: str | None = None) -> None:
        done = subprocess.run(
            [*_unprivileged(), *argv], input=stdin, capture_output=True, text=True, timeout=120
        )
        # Single-user mode exits 0 even when a statement fails, so its output is checked too.
        if done.returncode != 0 or "ERROR:" in done.stderr:
            shutil.rmtree(data, ignore_errors=True)
            output = f"{done.stdout}{done.stderr}"
            raise StackError(f"postgres: {Path(argv[0]).name} failed:\n{output}")

    def prepare() -> None:
        if (data / "PG_VERSION").exists():
            return
        state.mkdir(parents=True, exist_ok=True)
        pwfile = state / "password"
        pwfile.write_text(settings.postgres_password)
        user = ["-U", settings.postgres_user, f"--pwfile={pwfile}", "-A", "scram-sha-256"]
        try:
            run([str(bin_dir / "initdb"), "-D", str(data), "-E", "UTF8", *user])
        finally:
            pwfile.unlink()
        single = [str(bin_dir / "postgres"), "--single", "-D", str(data), "postgres"]
        run(single, "CREATE DATABASE airflow;\n")

    # No Unix socket (`-k ''`): its path could exceed the OS limit under a deep state folder.
    server = [str(bin_dir / "postgres"), "-D", str(data), "-h", settings.host, "-k", ""]
    return Service(
        name="postgres",
        argv=[*_unprivileged(), *server, "-p", str(settings.postgres_port)],
        state_dir=settings.state_dir,
        ports=[settings.postgres_port],
        healthy=lambda: _postgres_ready(settings) and _catalog_database(settings),
        prepare=prepare,
        stop_signal=signal.SIGINT,  # "fast" shutdown; SIGTERM waits for every client to leave
    )


def postgres_bin() -> Path:
    """PostgreSQL's programs in the `pgserver` wheel, located without importing the package:
    its own server manager (which, as root, adds a system user) is not used."""
    return (
        Path(importlib.util.find_spec("pgserver").submodule_search_locations[0]) / "pginstall/bin"
    )


def _unprivileged() -> list[str]:
    """PostgreSQL refuses to run as root. As root (CI, containers) it runs in a user namespace
    as `nobody`, which there owns root's files, so its data stays under the state folder."""
    return (
        ["unshare", "--user", "--map-user=65534", "--map-group=65534"] if os.geteuid() == 0 else []
    )


def _postgres_ready(settings: StackSettings) -> bool:
    import psycopg2

    try:
        psycopg2.connect(settings.postgres_url, connect_timeout=2).close()
        return True
    except psycopg2.OperationalError:
        return False


def _catalog_database(settings: StackSettings) -> bool:
    """Create the Iceberg catalog's login and database unless they exist; True once both do.
    Part of the health check, so a state folder made before the catalog existed gets them at
    its next start too. The catalog's own tables are made by its first client (Spark or
    pyiceberg, `cairn.table.catalog`)."""
    import psycopg2
    from psycopg2 import sql

    user, database = sql.Identifier(settings.catalog_user), settings.catalog_database
    try:
        with contextlib.closing(psycopg2.connect(settings.postgres_url, connect_timeout=2)) as db:
            db.autocommit = True  # CREATE DATABASE runs outside a transaction
            with db.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [settings.catalog_user])
                if cur.fetchone() is None:
                    create = sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(user)
                    cur.execute(create, [settings.catalog_password])
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
                if cur.fetchone() is None:
                    create = sql.SQL("CREATE DATABASE {} OWNER {}")
                    cur.execute(create.format(sql.Identifier(database), user))
        return True
    except psycopg2.Error:
        return False


def iceberg_catalog(
    settings: StackSettings, warehouse: str, name: str | None = None
) -> catalog.Catalog:
    """The stack's Iceberg catalog (JDBC, in its PostgreSQL) with `warehouse`: a local folder
    (`file:///...`), or a prefix of the SeaweedFS bucket (`s3://<bucket>/...`)."""
    s3 = None
    if warehouse.startswith("s3://"):
        s3 = catalog.S3Access(
            region="us-east-1",
            endpoint=settings.s3_endpoint,
            access_key_id=settings.s3_access_key,
            secret_access_key=settings.s3_secret_key,
            path_style_access=True,
        )
    return catalog.Catalog(
        name=name or settings.catalog_name,
        type="jdbc",
        uri=settings.catalog_jdbc_url,
        user=settings.catalog_user,
        password=settings.catalog_password,
        warehouse=warehouse,
        s3=s3,
    )


POOL_DOC = "Cairn's Spark jobs (archive and rebuild): one slot each"


def airflow(settings: StackSettings) -> list[Service]:
    """Api-server, scheduler, dag-processor and triggerer, once `postgres` runs (and Celery
    workers in the distributed shape); the api-server's start migrates the metadata database
    and sets the Spark pool's slots."""
    env = airflow_env(settings)
    exe = str(Path(sys.executable).parent / "airflow")

    def migrate() -> None:
        done = subprocess.run(
            [exe, "db", "migrate"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise StackError(f"airflow: `airflow db migrate` failed:\n{done.stderr[-3000:]}")
        spark_pool()

    def spark_pool() -> None:
        """Create or resize the pool Cairn's Spark tasks run in: Airflow would leave a task
        naming a missing pool `scheduled` for ever, with only a line in the scheduler's log."""
        argv = [exe, "pools", "set", settings.spark_pool, str(settings.spark_pool_slots), POOL_DOC]
        done = subprocess.run(
            argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise StackError(f"airflow: `airflow pools set` failed:\n{done.stderr[-3000:]}")

    def service(name: str, argv: list[str], ports: list[int], component: str) -> Service:
        return Service(
            name,
            [exe, *argv],
            settings.state_dir,
            ports,
            lambda: _airflow_health(settings, component),
            env=env,
            prepare=migrate if name == "airflow-api-server" else None,
        )

    api = ["api-server", "--host", settings.host, "--port", str(settings.airflow_port)]
    # No log server: Airflow's binds every interface, and the api-server on this machine reads
    # the task logs from the shared log folder anyway.
    scheduler = ["scheduler", "--skip-serve-logs"]
    found = [
        service("airflow-api-server", api, [settings.airflow_port], "metadatabase"),
        service("airflow-scheduler", scheduler, [settings.airflow_health_port], "scheduler"),
        service("airflow-dag-processor", ["dag-processor"], [], "dag_processor"),
        # runs the waiting-records triggers of `run_on: records` topics
        service("airflow-triggerer", ["triggerer", "--skip-serve-logs"], [], "triggerer"),
    ]
    return [*found, *cluster.celery_workers(settings, env)] if settings.cluster else found


def _airflow_health(settings: StackSettings, component: str) -> bool:
    try:
        url = f"{settings.airflow_url}/api/v2/monitor/health"
        with urllib.request.urlopen(url, timeout=3) as reply:
            health = json.load(reply)
    except (OSError, ValueError):
        return False
    return health.get(component, {}).get("status") == "healthy"


SPARK_CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
SESSION_TIMEOUT = "7d"
"""How long the server keeps an idle session: runs share one (`cairn_airflow.hooks.spark_connect`),
and a closed one is refused until the server restarts, so Spark's 60 minutes would send every run
to a session of its own after a quiet hour."""
SERVER_JVM = {
    "spark.driver.memory": "2g",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
}
"""The long-lived server's JVMs: the throughput collector and room to collect less often, as
the archive's JVM work allocates gigabytes a second of short-lived objects (on `local`
masters its tasks run in the driver; on a cluster, in the executors)."""
FAIR_SCHEDULER_FILE = REPO / "jars" / "spark" / "fairscheduler.xml"
"""Where the server's default pool is made FAIR; outside the code folders, so a server on the
cluster, which cannot see them (`cluster.hidden`), reads it too. The Spark image has a copy."""
SCHEDULER = {"spark.scheduler.mode": "FAIR"}
"""Jobs share the server's task slots instead of queueing first in, first out: an archive run's
short job starts beside a long seal job, not after it (`FAIR_SCHEDULER_FILE` says why)."""
PYTHON_DAEMON = {"spark.python.daemon.module": "cairn_stack.pyspark_daemon"}
"""The server's Python worker daemon: PySpark's, without re-reading the unchanged zip archives on
the workers' path as each task starts (`cairn_stack.pyspark_daemon`)."""


def connect_name(settings: StackSettings) -> str:
    """Each shape's Connect server has its own name, so its own pid file and log: one shape's
    server running is never taken for the other's (the test suite runs both at once)."""
    return "spark-connect-cluster" if settings.cluster else "spark-connect"


def spark_connect(settings: StackSettings) -> Service:
    """A Spark Connect server on `host`: one long-lived Spark driver that archive, rebuild and
    seal runs use through Airflow's `spark_connect` connection, so a run starts no JVM; it has
    the Kafka connector on its classpath, and each run's session brings Cairn's code (its
    artifact) and its secrets, so none is on its command line or in its environment.

    Locally its jobs run on `spark_master` (local by default) and its Python workers run this
    venv's Python, with Cairn's worker daemon. In the distributed shape they run on the stack's
    standalone cluster (`cairn_stack.cluster`), on the cluster's Python, and the server, like
    the cluster's daemons, cannot see this repository's code."""
    host, port = settings.host, settings.spark_connect_port
    connector = str(settings.jars_dir / "spark" / "*.jar")  # spark-submit expands the glob
    conf = {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": host,
        "spark.driver.bindAddress": host,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.connect.session.manager.defaultSessionTimeout": SESSION_TIMEOUT,
        **SERVER_JVM,
        **SCHEDULER,
        "spark.scheduler.allocation.file": str(FAIR_SCHEDULER_FILE),
    }
    python, prefix = sys.executable, []
    if settings.cluster:
        python, prefix = str(settings.cluster_python), cluster.hidden(settings)
        conf["spark.cores.max"] = str(settings.spark_connect_cores)
    else:
        conf.update(PYTHON_DAEMON)
    return Service(
        connect_name(settings),
        [
            *prefix,
            str(Path(sys.executable).parent / "spark-submit"),
            *["--class", SPARK_CONNECT_SERVER, "--name", "cairn-spark-connect"],
            *["--master", cluster.spark_master_url(settings), "--jars", connector],
            *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")],
        ],
        settings.state_dir,
        [port],
        lambda: port_open(port, host),
        env={
            "SPARK_LOCAL_IP": host,
            "SPARK_HOME": cluster.spark_home(),
            "PYSPARK_PYTHON": python,
            "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
        prepare=lambda: _spark_ready_to_start(settings),
    )


def _spark_ready_to_start(settings: StackSettings) -> None:
    if java() is None:
        raise StackError("spark-connect: no Java found (install Java 17+, or set JAVA_HOME)")
    jars(settings, "spark")


def all_services(settings: StackSettings) -> list[Service]:
    """The settings' shape (local, or distributed with `cluster`), in start order."""
    spark = [cluster.redis(settings), *cluster.spark_cluster(settings)] if settings.cluster else []
    return [
        kafka(settings),
        seaweedfs(settings),
        postgres(settings),
        *spark,
        spark_connect(settings),
        *airflow(settings),
    ]


def every_service(settings: StackSettings) -> list[Service]:
    """Both shapes' services, each once, in start order: what `down` and `status` look at,
    whichever shape `up` started."""
    found: dict[str, Service] = {}
    for shape in (settings.model_copy(update={"cluster": c}) for c in (True, False)):
        for service in all_services(shape):
            found.setdefault(service.name, service)
    return list(found.values())
