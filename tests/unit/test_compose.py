"""docker-compose.yml, compose/airflow.Dockerfile, compose/spark.Dockerfile and .env.example agree
with StackSettings and with the local stack's distributed shape (`cairn_stack.cluster`).

There is no Docker engine here, so these checks are static: they catch the files drifting apart.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

from cairn.storage.s3_access import S3Settings
from cairn.table.catalog import Catalog, connection_extra
from cairn_stack import cluster
from cairn_stack.cluster import celery_env, spark_master_url, worker_name
from cairn_stack.services import (
    DAG_FILE_PROCESSOR_TIMEOUT,
    FAIR_SCHEDULER_FILE,
    PYTHON_DAEMON,
    SCHEDULER,
    SERVER_JVM,
    SESSION_TIMEOUT,
    airflow_env,
    iceberg_catalog,
    postgres_bin,
    spark_connect,
)
from cairn_stack.settings import StackSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "compose" / "airflow.Dockerfile"
SPARK_DOCKERFILE = REPO / "compose" / "spark.Dockerfile"
ENV_EXAMPLE = REPO / ".env.example"

# Declared defaults, not StackSettings(): CAIRN_* variables on this machine must not matter.
DEFAULTS: dict[str, Any] = {name: f.default for name, f in StackSettings.model_fields.items()}

# As many Celery workers and Spark workers as the local stack's distributed shape starts.
AIRFLOW_WORKERS = tuple(worker_name(i) for i in range(1, DEFAULTS["celery_workers"] + 1))
AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    *AIRFLOW_WORKERS,
)
SPARK_WORKERS = tuple(f"spark-worker-{i}" for i in range(1, DEFAULTS["spark_workers"] + 1))
SPARK_SERVICES = ("spark-master", *SPARK_WORKERS, "spark-connect")
REQUIRED_SERVICES = {
    "kafka",
    "kafka-certs",
    "kafka-scram-user",
    "seaweedfs",
    "create-bucket",
    "postgres",
    "redis",
    *SPARK_SERVICES,
    *AIRFLOW_SERVICES,
}
# service -> [(settings field of its host port, port inside the container)]
PUBLISHED = {
    "kafka": [("kafka_port", 9092), ("kafka_sasl_port", 9094)],
    "seaweedfs": [("s3_port", 8333)],
    "airflow-apiserver": [("airflow_port", 8080)],
}
# What the local stack's secured listener is (its clients' librdkafka settings).
SECURED = StackSettings.model_construct().kafka_sasl_config

# `$$` is compose's escape for a literal `$`, so only a single `$` interpolates.
INTERPOLATION = re.compile(r"(?<!\$)\$\{(CAIRN_[A-Z0-9_]+):-([^}]*)\}")
ANY_CAIRN_REFERENCE = re.compile(r"(?<!\$)\$\{?(CAIRN_[A-Z0-9_]+)")


def ref(var: str) -> str:
    """How compose must spell a reference: `${CAIRN_X:-<settings default>}`."""
    default = DEFAULTS[var.removeprefix("CAIRN_").lower()]
    return f"${{{var}:-{default}}}"


@pytest.fixture(scope="module")
def text() -> str:
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def compose(text: str) -> dict[str, Any]:
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


def command(service: dict[str, Any]) -> str:
    cmd = service.get("command", "")
    return " ".join(cmd) if isinstance(cmd, list) else cmd


def conf(argv: str) -> dict[str, str]:
    """The `--conf key=value` pairs of a spark-submit command line."""
    return dict(pair.split("=", 1) for pair in re.findall(r"--conf (\S+)", argv))


def connections(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The service's `AIRFLOW_CONN_*` connections by their id, parsed."""
    return {
        k.removeprefix("AIRFLOW_CONN_").lower(): json.loads(v)
        for k, v in env(service).items()
        if k.startswith("AIRFLOW_CONN_")
    }


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """A Dockerfile's build stages, each its instructions as (INSTRUCTION, arguments), comments
    dropped and continued lines joined."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, args = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), " ".join(args.split())))
    return stages


def checkout_copies(stage: list[tuple[str, str]]) -> list[list[str]]:
    """The stage's COPY instructions from the build context (not `--from` another stage or
    image), each as its sources and destination."""
    copies = [args.split() for word, args in stage if word == "COPY"]
    return [c for c in copies if not c[0].startswith("--from")]


def python_minor(image: str) -> str:
    """`3.11` of `python:3.11-slim-bookworm` or `apache/airflow:3.3.2-python3.11`."""
    found = re.search(r"(?:^python:|-python)(\d+\.\d+)", image)
    assert found, image
    return found.group(1)


def env_example() -> dict[str, str]:
    pairs = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key not in pairs, f".env.example sets {key} twice"
            pairs[key] = value
    return pairs


def test_required_services_exist(services):
    assert services.keys() >= REQUIRED_SERVICES, REQUIRED_SERVICES - services.keys()


def test_kafka_is_a_single_kraft_node(text, services):
    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka["image"]), kafka["image"]
    kenv = env(kafka)
    assert set(kenv["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = kenv["KAFKA_NODE_ID"]
    assert kenv["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node_id}@kafka:9093"
    assert "CONTROLLER://:9093" in kenv["KAFKA_LISTENERS"]
    assert kenv["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert kenv["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    # Host clients must be told the host port, whatever CAIRN_KAFKA_PORT says.
    assert f"PLAINTEXT_HOST://localhost:{ref('CAIRN_KAFKA_PORT')}" in kenv[
        "KAFKA_ADVERTISED_LISTENERS"
    ].split(",")
    assert "zookeeper" not in text.lower()


def listeners(kenv: dict[str, str], variable: str) -> dict[str, str]:
    """`NAME://host:port,...` as {name: host:port}."""
    return dict(item.split("://", 1) for item in kenv[variable].split(","))


def test_kafka_has_the_stacks_secured_listener(compose, services):
    kenv = env(services["kafka"])
    protocols = dict(
        item.split(":") for item in kenv["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    advertised = listeners(kenv, "KAFKA_ADVERTISED_LISTENERS")
    bound = listeners(kenv, "KAFKA_LISTENERS")
    secured = {
        name for name, protocol in protocols.items() if protocol == SECURED["security.protocol"]
    }
    assert secured == {"SECURED", "SECURED_HOST"}
    # Host clients are told the host port, whatever CAIRN_KAFKA_SASL_PORT says.
    assert advertised["SECURED_HOST"] == f"localhost:{ref('CAIRN_KAFKA_SASL_PORT')}"
    assert bound["SECURED_HOST"] == ":9094" and bound["SECURED"] == ":19094"
    assert all("SSL://" not in f"{name}://" for name in advertised)  # see the compose comment
    assert kenv["KAFKA_INTER_BROKER_LISTENER_NAME"] == "PLAINTEXT"
    assert kenv["KAFKA_SASL_ENABLED_MECHANISMS"] == SECURED["sasl.mechanism"]
    jaas_file = re.search(r"java\.security\.auth\.login\.config=(\S+)", kenv["KAFKA_OPTS"]).group(1)
    (jaas,) = [c for c in services["kafka"]["configs"] if c["target"] == jaas_file]
    assert "ScramLoginModule required" in compose["configs"][jaas["source"]]["content"]

    # The broker's PEM keystore is the one kafka-certs makes, for the names clients use.
    assert kenv["KAFKA_SSL_KEYSTORE_TYPE"] == "PEM"
    certs_mount = "kafka-certs:/etc/kafka/certs:ro"
    assert certs_mount in services["kafka"]["volumes"]
    assert kenv["KAFKA_SSL_KEYSTORE_LOCATION"] == "/etc/kafka/certs/server-keystore.pem"
    maker = services["kafka-certs"]
    assert maker["entrypoint"] == ["python", "-m", "cairn_stack.certs"]
    folder, *hosts = [arg for arg in maker["command"] if not arg.startswith("--")]
    assert f"kafka-certs:{folder}" in maker["volumes"]
    assert {"kafka", "localhost", DEFAULTS["host"]} <= set(hosts)
    assert services["kafka"]["depends_on"]["kafka-certs"]["condition"] == (
        "service_completed_successfully"
    )

    # The SCRAM user is the settings' user, with the settings' password and mechanism.
    scram = command(services["kafka-scram-user"])
    assert f'--entity-name "{ref("CAIRN_KAFKA_SASL_USER")}"' in scram
    mechanism = SECURED["sasl.mechanism"]
    assert f'--add-config "{mechanism}=[password={ref("CAIRN_KAFKA_SASL_PASSWORD")}]"' in scram
    assert "--bootstrap-server kafka:19092" in scram and bound["PLAINTEXT"] == ":19092"


def container_path(service: dict[str, Any], host: Path) -> PurePosixPath | None:
    """Where the checkout's `host` folder is inside the service, through its bind mounts."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            root = (REPO / source).resolve()
            if host == root or root in host.parents:
                return PurePosixPath(target) / host.relative_to(root).as_posix()
    return None


def test_airflow_is_3_and_imports_cairn_from_the_checkout(services):
    base = re.search(r"^FROM\s+apache/airflow:(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert base, "compose/airflow.Dockerfile must build FROM apache/airflow"
    assert base.group(1).split(".")[0] == "3", base.group(1)
    packages = {}
    for package in ("cairn", "cairn_airflow", "spark_jobs"):
        folder = Path(importlib.util.find_spec(package).origin).parent
        assert REPO in folder.parents, package  # the checkout's, as compose mounts it
        packages[package] = folder
    for name in AIRFLOW_SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "compose/airflow.Dockerfile", name
        assert env(service)["AIRFLOW__CORE__LOAD_EXAMPLES"] == "false", name
        for folder in ("dags", "plugins"):
            assert f"./{folder}:/opt/airflow/{folder}" in service["volumes"], (name, folder)
        path = env(service)["PYTHONPATH"].split(":")
        for package, folder in packages.items():
            inside = container_path(service, folder)
            assert inside is not None, (name, package)  # mounted
            assert str(inside.parent) in path, (name, package)  # and importable


def stack_celery_env(host: str) -> dict[str, str]:
    """`cluster.celery_env` with `host` and compose's spelling of the settings it takes."""
    settings = StackSettings.model_construct(
        host=host,
        bucket=ref("CAIRN_BUCKET"),
        task_heartbeat_timeout=ref("CAIRN_TASK_HEARTBEAT_TIMEOUT"),
    )
    return celery_env(settings)


def test_airflow_runs_the_celery_executor_as_the_distributed_local_stack(services):
    """Every Airflow container has the configuration `cluster.celery_env` gives the local stack's
    Airflow processes: the same values where they name no host, the broker on the redis service
    and the result backend in the metadata database."""
    one, other = stack_celery_env("one.invalid"), stack_celery_env("other.invalid")
    hosted = {key for key in one if one[key] != other[key]}
    assert hosted == {"AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND"}
    local = StackSettings.model_construct()
    assert celery_env(local)["AIRFLOW__CELERY__RESULT_BACKEND"] == (
        f"db+{local.airflow_database_url}"
    )
    for name in AIRFLOW_SERVICES:
        have = env(services[name])
        for key in one.keys() - hosted:
            assert have.get(key) == one[key], (name, key)
        assert have["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        # the redis service listens on Redis' port, the settings' default redis_port
        assert (
            have["AIRFLOW__CELERY__BROKER_URL"]
            == stack_celery_env("redis")["AIRFLOW__CELERY__BROKER_URL"]
        ), name
        backend = have["AIRFLOW__CELERY__RESULT_BACKEND"]
        assert backend == f"db+{have['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN']}", name
        if name != "airflow-init":  # (it only migrates the database)
            assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name

    redis = services["redis"]
    assert re.fullmatch(r"redis:\d+(\.\d+)*", redis["image"]), redis["image"]  # the official one
    assert "--port" not in command(redis)
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in redis  # reachable from containers only


def test_celery_workers_run_the_tasks_and_the_scheduler_none(services):
    workers = [name for name, s in services.items() if command(s).startswith("celery worker")]
    assert workers == list(AIRFLOW_WORKERS)
    for name in AIRFLOW_WORKERS:
        worker = services[name]
        # spark-submit drivers on it are reached by this name from the executors
        assert worker["hostname"] == name
        argv = command(worker)
        assert f"--concurrency {ref('CAIRN_CELERY_CONCURRENCY')}" in argv, name
        assert "celery@$${HOSTNAME}" in worker["healthcheck"]["test"][-1], name
    assert services["airflow-scheduler"]["command"] == ["scheduler"]
    assert services["airflow-triggerer"]["command"] == ["triggerer"]
    # no log volume shared by the containers: task logs reach the api-server through the bucket
    assert not any(
        v.split(":")[1].startswith("/opt/airflow/logs")
        for name in AIRFLOW_SERVICES
        for v in services[name]["volumes"]
    )


def test_published_ports_match_settings(services):
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert published.keys() == PUBLISHED.keys()
    for name, ports in PUBLISHED.items():
        expected = [f"{ref(f'CAIRN_{field.upper()}')}:{inner}" for field, inner in ports]
        assert published[name] == expected, name


def test_every_cairn_reference_has_the_settings_default(text):
    spelled = INTERPOLATION.findall(text)
    assert len(spelled) == len(ANY_CAIRN_REFERENCE.findall(text)), "use ${CAIRN_X:-default}"
    for var, default in spelled:
        field = var.removeprefix("CAIRN_").lower()
        assert field in DEFAULTS, f"{var} is not a StackSettings field"
        assert default == str(DEFAULTS[field]), var


def test_cairn_env_names_are_settings_fields():
    # Literal CAIRN_* names set in the image must also be real settings.
    for var in re.findall(r"\b(CAIRN_[A-Z0-9_]+)=", DOCKERFILE.read_text()):
        assert var.removeprefix("CAIRN_").lower() in DEFAULTS, var


def test_bucket_created_is_the_settings_bucket(services):
    cmd = command(services["create-bucket"])
    assert f'create-bucket --bucket "{ref("CAIRN_BUCKET")}"' in cmd
    assert "--endpoint-url http://seaweedfs:8333" in cmd
    bucket_env = env(services["create-bucket"])
    assert bucket_env["AWS_ACCESS_KEY_ID"] == ref("CAIRN_S3_ACCESS_KEY")
    assert bucket_env["AWS_SECRET_ACCESS_KEY"] == ref("CAIRN_S3_SECRET_KEY")


def test_seaweedfs_s3_identity_uses_the_settings_credentials(compose, services):
    seaweed = services["seaweedfs"]
    config_path = re.search(r"-s3\.config=(\S+)", command(seaweed)).group(1)
    (mount,) = [c for c in seaweed["configs"] if c["target"] == config_path]
    identities = json.loads(compose["configs"][mount["source"]]["content"])["identities"]
    keys = [c for identity in identities for c in identity["credentials"]]
    assert keys == [
        {"accessKey": ref("CAIRN_S3_ACCESS_KEY"), "secretKey": ref("CAIRN_S3_SECRET_KEY")}
    ]
    assert "-s3.port=8333" in command(seaweed)


def test_seaweedfs_encrypts_on_request_as_the_local_stack_does(services):
    assert re.fullmatch(r"[0-9a-f]{64}", env(services["seaweedfs"])["WEED_S3_SSE_KEK"])


# The commented-out variants of the S3 connection, for AWS.
AWS_EXAMPLE = re.compile(r"^\s*# AIRFLOW_CONN_CAIRN_S3: '(.*)'$", re.MULTILINE)


def test_aws_connection_examples_are_valid_and_cover_role_encryption_and_instance_role(text):
    examples = [json.loads(found) for found in AWS_EXAMPLE.findall(text)]
    assert examples, "docker-compose.yml lost its example AWS connections"
    settings = []
    for example in examples:
        assert example["conn_type"] == "aws"
        wrapper = AwsConnectionWrapper.from_connection_metadata(
            conn_id="cairn_s3", extra=example["extra"]
        )
        assert wrapper.endpoint_url is None and wrapper.region_name, example  # real AWS
        settings.append((wrapper.role_arn, S3Settings.from_extra("cairn_s3", example["extra"])))
    assert any(role for role, _ in settings)
    assert any(s.server_side_encryption == "aws:kms" and s.sse_kms_key_id for _, s in settings)
    assert any(s.spark_credentials == "instance" for _, s in settings)


def test_airflow_connections_match_settings_ids(services):
    ids = ("kafka_conn_id", "s3_conn_id", "spark_conn_id", "spark_submit_conn_id")
    expected = {DEFAULTS[f].upper() for f in ids}
    expected.add("CAIRN_CATALOG")
    internal = listeners(env(services["kafka"]), "KAFKA_ADVERTISED_LISTENERS")["SECURED"]
    for name in AIRFLOW_SERVICES:
        conns = {
            k.removeprefix("AIRFLOW_CONN_"): json.loads(v)
            for k, v in env(services[name]).items()
            if k.startswith("AIRFLOW_CONN_")
        }
        assert conns.keys() == expected, name

        kafka = conns[DEFAULTS["kafka_conn_id"].upper()]
        assert kafka["conn_type"] == "kafka"  # the Kafka provider's: librdkafka settings
        extra = kafka["extra"]
        assert extra.keys() == SECURED.keys(), name  # as the local stack's connection
        assert extra["bootstrap.servers"] == internal
        for key in ("security.protocol", "sasl.mechanism"):
            assert extra[key] == SECURED[key], (name, key)
        login = (extra["sasl.username"], extra["sasl.password"])
        assert login == (ref("CAIRN_KAFKA_SASL_USER"), ref("CAIRN_KAFKA_SASL_PASSWORD"))
        folder, _, ca_file = extra["ssl.ca.location"].rpartition("/")
        assert f"kafka-certs:{folder}:ro" in services[name]["volumes"], name
        assert ca_file == SECURED["ssl.ca.location"].rsplit("/", 1)[1]
        needs = services[name]["depends_on"]
        if "kafka" in needs:  # (not airflow-init: it only migrates the database)
            assert needs["kafka-scram-user"]["condition"] == "service_completed_successfully"

        s3 = conns[DEFAULTS["s3_conn_id"].upper()]
        assert s3["conn_type"] == "aws"
        assert (s3["login"], s3["password"]) == (
            ref("CAIRN_S3_ACCESS_KEY"),
            ref("CAIRN_S3_SECRET_KEY"),
        )
        assert s3["extra"]["endpoint_url"] == "http://seaweedfs:8333"

        spark = conns[DEFAULTS["spark_conn_id"].upper()]
        assert spark["conn_type"] == "spark_connect"  # as the local stack's connection
        port = DEFAULTS["spark_connect_port"]
        assert (spark["host"], spark["port"]) == ("sc://spark-connect", port)
        assert services[name]["depends_on"].get("spark-connect") or name == "airflow-init"

        table = conns["CAIRN_CATALOG"]  # cairn_airflow.hooks.catalog reads it as the stack's
        assert (table["login"], table["password"]) == (
            ref("CAIRN_CATALOG_USER"),
            ref("CAIRN_CATALOG_PASSWORD"),
        )
        described = Catalog.model_validate(table["extra"])
        assert described.uri == f"jdbc:postgresql://postgres:5432/{ref('CAIRN_CATALOG_DATABASE')}"
        assert (described.name, described.s3.endpoint) == (
            DEFAULTS["catalog_name"],
            "http://seaweedfs:8333",
        )
        stack = connection_extra(iceberg_catalog(StackSettings(), "s3://cairn-archive/_warehouse"))
        assert (
            table["extra"].keys() == stack.keys()
            and table["extra"]["s3"].keys() == stack["s3"].keys()
        )


def cluster_settings(host: str) -> StackSettings:
    """The local stack's distributed shape with `host`, and compose's spelling of the settings
    compose takes from `CAIRN_*` variables."""
    return StackSettings.model_construct(
        host=host,
        cluster=True,
        spark_connect_cores=ref("CAIRN_SPARK_CONNECT_CORES"),
        spark_submit_cores=ref("CAIRN_SPARK_SUBMIT_CORES"),
    )


def test_spark_daemons_run_the_spark_image_with_nothing_of_cairn(services):
    assert not [name for name in services if name == "spark-worker"]
    for name in SPARK_SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "compose/spark.Dockerfile", name
        assert service["image"] != services["airflow-scheduler"]["image"], name
        # no bind mount at all (named volumes would be the daemons' own state)
        mounts = [v.split(":")[0] for v in service.get("volumes", [])]
        assert not [m for m in mounts if m.startswith((".", "/", "~"))], (name, mounts)
        assert "PYTHONPATH" not in env(service), name
        assert not [v for v in env(service).values() if "/opt/airflow" in v], name
        argv = command(service)
        assert "/opt/airflow" not in argv and "include" not in argv, name
        assert "spark.python.daemon.module" not in argv, name  # Cairn's daemon is not there
        assert "spark.submit.pyFiles" not in argv and "--py-files" not in argv, name
    assert "--port 7077" in command(services["spark-master"])
    for name in SPARK_WORKERS:
        argv = command(services[name])
        assert argv.startswith("spark-class org.apache.spark.deploy.worker.Worker"), name
        assert argv.endswith(" spark://spark-master:7077"), name
        assert f"--cores {ref('CAIRN_SPARK_WORKER_CORES')}" in argv, name
        assert f"--memory {ref('CAIRN_SPARK_WORKER_MEMORY')}" in argv, name
        assert f"--host {services[name]['hostname']}" in argv, name


def test_spark_image_has_the_airflow_images_python_pyspark_and_the_cluster_requirements():
    """The executors' Python: requirements-cluster.txt and the pinned pyspark, on the Python
    version of the Airflow image (cloudpickled functions cross), Java 17, the connector jars
    fetched as the Airflow image fetches them, and nothing else from the checkout but the
    Connect server's scheduling file."""
    airflow_stages, spark_stages = (
        dockerfile_stages(DOCKERFILE),
        dockerfile_stages(SPARK_DOCKERFILE),
    )
    jars = [stage for stage in spark_stages if stage[0][1].endswith(" AS jars")]
    assert jars and jars == [s for s in airflow_stages if s[0][1].endswith(" AS jars")]
    final = spark_stages[-1]
    assert python_minor(final[0][1]) == python_minor(airflow_stages[-1][0][1])
    # Java 17: a JRE copied from an eclipse-temurin:17 stage, and JAVA_HOME naming it
    (java,) = [
        s[0][1].split()[-1] for s in spark_stages if s[0][1].startswith("eclipse-temurin:17")
    ]
    (java_home,) = [c.split()[-1] for w, c in final if w == "COPY" and f"--from={java}" in c]
    assert ("ENV", f"JAVA_HOME={java_home}") in final

    (requirements,) = [
        dest for src, dest in checkout_copies(final) if src == "requirements-cluster.txt"
    ]
    scheduling = str(FAIR_SCHEDULER_FILE.relative_to(REPO))
    assert {src for src, _ in checkout_copies(final)} == {"requirements-cluster.txt", scheduling}
    (pip,) = [args for word, args in final if word == "RUN" and "pip install" in args]
    installed = pip.split("pip install", 1)[1].split("&&")[0].split()
    pinned = re.search(r"^pyspark==(\S+)$", (REPO / "requirements.txt").read_text(), re.M)
    assert [a for a in installed if not a.startswith("--")] == [
        f"pyspark=={pinned.group(1)}",
        "-r",
        requirements,
    ]
    instructions = [f"{word} {args}" for stage in spark_stages for word, args in stage]
    assert not [
        i for i in instructions if re.search(r"PYTHONPATH|\binclude\b|\bspark_jobs\b|cairn", i)
    ]

    # the build context holds only what the image copies
    ignore = SPARK_DOCKERFILE.with_name("spark.Dockerfile.dockerignore").read_text().splitlines()
    ignore = [line for line in ignore if line and not line.startswith("#")]
    sources = {copy[0] for stage in spark_stages for copy in checkout_copies(stage)}
    assert ignore[0] == "*" and {line.removeprefix("!") for line in ignore[1:]} == sources


def test_spark_connect_server_runs_on_the_cluster_as_the_local_stacks(services, monkeypatch):
    """The compose server has the local cluster-shaped server's settings (`services.
    spark_connect` with `cluster`), bar the local one's binding to its loopback host: the Kafka
    connector, the session timeout, the JVMs, its share of the cluster (`spark.cores.max`), no
    worker daemon of Cairn's, FAIR scheduling with the repository's pool file (the image's copy)."""
    monkeypatch.setattr(cluster, "hidden", lambda settings: [])  # (a mount namespace probe)
    host = "stack-host.invalid"
    local = spark_connect(cluster_settings(host))
    local_argv = " ".join(local.argv)
    local_conf = conf(local_argv)
    server = services["spark-connect"]
    argv = command(server)
    have = conf(argv)
    bound = {k for k, v in local_conf.items() if host in v}
    pool_file = "spark.scheduler.allocation.file"  # a path on each machine: compared below
    assert local_conf.pop(pool_file) == str(FAIR_SCHEDULER_FILE)
    (image_copy,) = [
        dest
        for src, dest in checkout_copies(dockerfile_stages(SPARK_DOCKERFILE)[-1])
        if src == str(FAIR_SCHEDULER_FILE.relative_to(REPO))
    ]
    assert have.pop(pool_file) == image_copy
    assert bound == {
        "spark.connect.grpc.binding.address",
        "spark.driver.host",
        "spark.driver.bindAddress",
    }
    assert have.keys() == local_conf.keys() - bound | {"spark.driver.host"}
    for key in have.keys() - bound:
        assert have[key] == local_conf[key], key
    assert have["spark.driver.host"] == server["hostname"]  # executors reach the driver
    assert have["spark.cores.max"] == ref("CAIRN_SPARK_CONNECT_CORES")
    assert have["spark.connect.grpc.binding.port"] == str(DEFAULTS["spark_connect_port"])
    assert have["spark.connect.session.manager.defaultSessionTimeout"] == SESSION_TIMEOUT
    assert have.items() >= SERVER_JVM.items() and not have.keys() & PYTHON_DAEMON.keys()
    assert have.items() >= SCHEDULER.items()
    for option in ("--class", "--name"):
        found = re.search(rf"{option} \S+", local_argv).group(0)
        assert found in argv, option
    # the cluster compose starts, the connector jars where the Spark image has them
    assert f"--master {spark_master_url(cluster_settings('spark-master'))}" in argv
    jars = re.search(r"--jars (\S+)/\*\.jar", argv).group(1)
    (copied,) = [
        args
        for word, args in dockerfile_stages(SPARK_DOCKERFILE)[-1]
        if word == "COPY" and args.startswith("--from=jars")
    ]
    assert copied.split()[-1] == jars
    assert "ports" not in server  # no authentication: reachable from containers only


def test_spark_submit_connection_is_the_local_stacks_on_the_compose_cluster(services, tmp_path):
    """`cairn_spark_submit` is `services.airflow_env`'s connection of the distributed shape:
    spark-submit to the cluster's master, Cairn's extra naming the executors' Python (the one
    the Spark Connect server's executors run too) and each job's `spark.cores.max`."""
    settings = cluster_settings("spark-master").model_copy(update={"state_dir": tmp_path})
    conn_id = DEFAULTS["spark_submit_conn_id"]
    local = json.loads(airflow_env(settings)[f"AIRFLOW_CONN_{conn_id.upper()}"])
    connect_python = env(services["spark-connect"])["PYSPARK_PYTHON"]
    for name in AIRFLOW_SERVICES:
        submit = connections(services[name])[conn_id]
        assert submit["conn_type"] == local["conn_type"] == "spark", name
        assert f"{submit['host']}:{submit['port']}" == local["host"], name
        assert submit["extra"].keys() == local["extra"].keys() == {"cairn"}, name
        ours, theirs = submit["extra"]["cairn"], local["extra"]["cairn"]
        assert ours.keys() == theirs.keys() == {"python", "conf"}, name
        assert ours["conf"] == theirs["conf"], name  # spark.cores.max: CAIRN_SPARK_SUBMIT_CORES
        assert ours["conf"] == {"spark.cores.max": ref("CAIRN_SPARK_SUBMIT_CORES")}, name
        assert ours["python"] == connect_python == "python3", name  # the Spark image's
    # the cluster's slots hold the Connect server's share and one spark-submitted job's
    slots = DEFAULTS["spark_workers"] * DEFAULTS["spark_worker_cores"]
    assert DEFAULTS["spark_connect_cores"] + DEFAULTS["spark_submit_cores"] <= slots


def test_airflow_login_comes_from_settings(services):
    api = env(services["airflow-apiserver"])
    assert api["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == f"{ref('CAIRN_AIRFLOW_USER')}:admin"
    assert api["CAIRN_AIRFLOW_USER"] == ref("CAIRN_AIRFLOW_USER")
    assert api["CAIRN_AIRFLOW_PASSWORD"] == ref("CAIRN_AIRFLOW_PASSWORD")
    assert "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in command(
        services["airflow-apiserver"]
    )


def test_env_example_defines_exactly_the_compose_variables(text):
    referenced = {var for var, _ in INTERPOLATION.findall(text)}
    example = env_example()
    assert example.keys() == referenced
    for var, value in example.items():
        assert value == str(DEFAULTS[var.removeprefix("CAIRN_").lower()]), var


def test_postgres_is_the_local_stacks_major_version_and_login(services):
    version = subprocess.run(
        [postgres_bin() / "postgres", "--version"], capture_output=True, text=True, check=True
    ).stdout  # "postgres (PostgreSQL) 16.2"
    major = re.search(r"\) (\d+)\.", version).group(1)
    postgres = services["postgres"]
    assert postgres["image"] == f"postgres:{major}"
    pg = env(postgres)
    login = (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    assert login == (DEFAULTS["postgres_user"], DEFAULTS["postgres_password"], "airflow")
    url = env(services["airflow-scheduler"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert url == "postgresql+psycopg2://{}:{}@postgres/{}".format(*login)


def test_postgres_makes_the_iceberg_catalogs_database_with_the_settings_login(compose, services):
    """As the local stack does at its first start (services.postgres): the catalog's database
    beside Airflow's, owned by its own login. tests/integration/test_iceberg_catalog.py runs
    the same script against the stack's PostgreSQL."""
    postgres = services["postgres"]
    pg = env(postgres)
    for field in ("catalog_database", "catalog_user", "catalog_password"):
        var = f"CAIRN_{field.upper()}"
        assert pg[var] == ref(var), var
    (mount,) = postgres["configs"]
    assert mount["target"].startswith("/docker-entrypoint-initdb.d/")
    assert mount["target"].endswith(".sh")  # the entrypoint runs .sh and .sql files only
    script = compose["configs"][mount["source"]]["content"]
    for var in ("CAIRN_CATALOG_USER", "CAIRN_CATALOG_PASSWORD", "CAIRN_CATALOG_DATABASE"):
        assert f"$${var}" in script, var  # read by the script, not baked in by compose
    assert "ON_ERROR_STOP=1" in script
    assert DEFAULTS["catalog_name"] == "cairn" and DEFAULTS["catalog_database"] == "cairn_catalog"


def test_airflow_init_creates_the_spark_pool_the_tasks_run_in(services):
    """Airflow leaves a task in a missing pool waiting for ever: compose creates it, with the
    settings' name and slots, as the local stack does at every start."""
    init = command(services["airflow-init"])
    migrate, pool = init.index("airflow db migrate"), init.index("airflow pools set")
    assert migrate < pool and "&&" in init[migrate:pool]  # only once the database is there
    slots = ref("CAIRN_SPARK_POOL_SLOTS")
    assert f'airflow pools set "$${{CAIRN_SPARK_POOL}}" "{slots}"' in init
    for name in AIRFLOW_SERVICES:  # the tasks' CairnSparkOperator reads the same name
        assert env(services[name])["CAIRN_SPARK_POOL"] == ref("CAIRN_SPARK_POOL"), name
    assert DEFAULTS["spark_pool"] == "cairn_spark" and DEFAULTS["spark_pool_slots"] == 2


def test_the_scheduler_sleeps_the_stacks_idle_sleep(services):
    sleep = env(services["airflow-scheduler"])["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"]
    assert sleep == ref("CAIRN_SCHEDULER_IDLE_SLEEP")
    assert DEFAULTS["scheduler_idle_sleep"] == 0.2


def test_the_dag_processor_and_the_shared_jobs_use_the_stacks_settings(services, tmp_path):
    local = airflow_env(cluster_settings("spark-master").model_copy(update={"state_dir": tmp_path}))
    assert local["AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT"] == "600"
    for name in AIRFLOW_SERVICES:
        found = env(services[name])
        interval = found["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"]
        assert interval == ref("CAIRN_DAG_FILE_INTERVAL"), name
        gather = found["AIRFLOW__CAIRN__SHARED_JOB_GATHER_SECONDS"]
        assert gather == ref("CAIRN_SHARED_JOB_GATHER_SECONDS"), name
        timeout = found["AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT"]
        assert timeout == str(DAG_FILE_PROCESSOR_TIMEOUT) == "600", name
    assert DEFAULTS["dag_file_interval"] == 1800 and DEFAULTS["shared_job_gather_seconds"] == 2.0


def test_the_triggerer_holds_a_thousand_watched_topics_and_their_runs(services):
    """Each `run_on: records` topic keeps one trigger in the triggerer for good: at Airflow's
    default capacity (1,000), a thousand topics would leave no room for their runs' steps."""
    capacity = env(services["airflow-triggerer"])["AIRFLOW__TRIGGERER__CAPACITY"]
    assert capacity == ref("CAIRN_TRIGGERER_CAPACITY")
    assert DEFAULTS["triggerer_capacity"] >= 2 * 1000
