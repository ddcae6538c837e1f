"""Cairn's Airflow edge: connections → core objects, and the Spark job operator.

The DAG files only wire tasks; what they need from Airflow (the Kafka, S3 and Spark connections)
is turned into plain values here, and all rules stay in the `cairn` package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import (
    Asset,
    BaseHook,
    DeadlineAlert,
    DeadlineReference,
    SyncCallback,
    Variable,
    get_current_context,
    get_parsing_context,
)
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException
from airflow.sdk.module_loading import import_string
from airflow.sdk.observability.stats import Stats

from cairn.config import (
    REPO,
    TOPICS_FILE,
    TopicConfig,
    dag_safe,
    find_topic,
    load_topics,
    resolve,
)
from cairn.errors import PERMANENT_EXIT, PermanentError
from cairn.formats import REGISTRIES_VARIABLE, registry_ids
from cairn.formats.avro import registry_config
from cairn.kafka.connection import KafkaConf, KafkaConfigError
from cairn.pipeline import completeness
from cairn.pipeline.plan import Plan
from cairn.protocol import commit
from cairn.storage.objects import OPTIONS_VARIABLE, Storage
from cairn.storage.s3_access import connection_options
from cairn.views import alerts, metrics, status
from cairn_connect import Connected, connect_session

log = logging.getLogger(__name__)

KAFKA_CONN_ID = os.environ.get("CAIRN_KAFKA_CONN_ID", "cairn_kafka")
SPARK_CONN_ID = os.environ.get("CAIRN_SPARK_CONN_ID", "cairn_spark")
SPARK_POOL = os.environ.get("CAIRN_SPARK_POOL", "cairn_spark")
"""The Airflow pool every Cairn Spark task (archive and rebuild) takes one slot of, so its slots
cap how many Spark jobs run at once. Airflow does not create it: a task in a missing pool waits
in `scheduled` for ever (the local stack and docker-compose.yml create it; README)."""
SPARK_JARS_DIR = Path(os.environ.get("CAIRN_JARS_DIR", REPO / ".cairn" / "jars")) / "spark"
SPARK_JOBS = REPO / "spark_jobs"
TOPICS_VARIABLE = "cairn_kafka_topics"
"""Airflow Variable holding Kafka's topic names (JSON), refreshed by `cairn_discover_topics`."""


def configured_topics() -> list[TopicConfig]:
    """The topics to build DAGs for: exact entries, and pattern entries matched against the
    topic names `cairn_discover_topics` cached (never a Kafka call while parsing DAG files)."""
    entries = load_topics(TOPICS_FILE).topics
    known = []
    if any(entry.pattern for entry in entries):
        known = json.loads(Variable.get(TOPICS_VARIABLE, default="[]"))
    return resolve(entries, known)


def topics_to_build(dag_id: Callable[[str], str]) -> list[TopicConfig]:
    """The topics a DAG file builds its DAGs for (`dag_id` names a topic's DAG): all of them for
    the DAG processor, only the one whose DAG is running when a task process parses the file
    (Airflow's parsing context). Building every topic's DAG at each task start made a task's
    start grow with the fleet: ~17 s a task at 100 topics on two cores, past the import timeout."""
    running = get_parsing_context().dag_id
    topics = configured_topics()
    return topics if running is None else [cfg for cfg in topics if dag_id(cfg.topic) == running]


def archive_dag_id(topic: str) -> str:
    return f"archive__{dag_safe(topic)}"


def rebuild_dag_id(topic: str) -> str:
    return f"rebuild__{dag_safe(topic)}"


def topic_yaml(cfg: TopicConfig) -> str:
    """The topic's effective configuration (defaults merged in) as YAML, as topics.yaml reads."""
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True), sort_keys=False)


def topic_doc(cfg: TopicConfig, role: str, about: str) -> str:
    """A DAG's `doc_md`: what the DAG does (`about`, its module docstring), the topic's
    configuration and links to the topic's overview page, DAGs and archive root."""
    topic = cfg.topic
    links = [f"[overview](/cairn/topics/{topic})", f"[archive DAG](/dags/{archive_dag_id(topic)})"]
    if cfg.parses:
        links.append(f"[rebuild DAG](/dags/{rebuild_dag_id(topic)})")
    return (
        f"# {topic} · {role}\n\n{' · '.join(links)} · archive root "
        f"`{cfg.root.storage_url}`\n\n{about.strip()}\n\n"
        f"## Configuration of `{topic}`\n\n```yaml\n{topic_yaml(cfg)}```\n"
    )


def kafka_conf() -> KafkaConf:
    """The Kafka connection (the Kafka provider's `kafka` type): its extra is librdkafka
    configuration, checked to be usable by every client Cairn runs (`cairn.kafka.connection`)."""
    conn = BaseHook.get_connection(KAFKA_CONN_ID)
    label = f"Airflow connection {KAFKA_CONN_ID!r}"
    if conn.conn_type != "kafka":
        raise KafkaConfigError(f"{label} is of type {conn.conn_type!r}; make it a 'kafka' one")
    return KafkaConf(conn.extra_dejson, label)


def storage_options(cfg: TopicConfig, *, for_spark: bool = False) -> dict[str, Any]:
    """fsspec options for the topic's archive root. An S3 root's connection is an AWS
    connection, resolved by the Amazon provider (keys, session token, assumed role, profile,
    endpoint, region); `for_spark` leaves the keys out when the cluster uses its own role."""
    root = cfg.root
    if root.scheme == "file":
        return {}
    hook = AwsBaseHook(aws_conn_id=root.conn_id, client_type="s3")
    conn = hook.conn_config
    if not conn:  # the provider would fall back to the worker's own credentials
        raise ValueError(f"topic {cfg.topic!r}: no Airflow connection {root.conn_id!r}")
    return connection_options(
        root.conn_id,
        conn.extra_config,
        conn.get_service_endpoint_url("s3"),
        conn.region_name,
        hook.get_credentials,
        for_spark=for_spark,
    )


def schema_registries(cfg: TopicConfig) -> dict[str, dict[str, Any]]:
    """Client configurations of the Schema Registries the topic's format reads (avro topics
    with `avro.registry`), each from its Airflow connection: host (URL), port, login/password,
    and client settings in the extra."""
    found = {}
    for conn_id in registry_ids(cfg):
        conn = BaseHook.get_connection(conn_id)
        found[conn_id] = registry_config(
            conn.host or "", conn.port, conn.login, conn.password, conn.extra_dejson
        )
    return found


def storage(cfg: TopicConfig) -> Storage:
    return Storage(cfg.root.storage_url, **storage_options(cfg))


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Fail the task without retries on errors a retry would only repeat (`PermanentError`:
    a fenced-out attempt, a retention gap, a failed verification, a recreated topic)."""
    try:
        yield
    except PermanentError as err:
        raise AirflowFailException(f"{type(err).__name__}: {err}") from err


def spark_job(job: str) -> ModuleType:
    """A Spark job's module (`spark_jobs/<job>.py`), loaded from the file spark-submit would
    run (the jobs folder need not be importable here, nor on the Spark Connect server)."""
    name = f"cairn_spark_job_{job}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SPARK_JOBS / f"{job}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment for the block, the previous values after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class CairnSparkOperator(SparkSubmitOperator):
    """Run one of Cairn's Spark jobs (`spark_jobs/<job>.py`) through the Spark connection.

    The connection's type chooses how. A `spark_connect` connection (the Apache Spark
    provider's; host and port of a Spark Connect server) runs the job's `run` in this task on a
    session of that long-lived server: no JVM starts per run, and runs share the server's Cairn
    session with its warm Python workers (`cairn_connect`); a run's work is tagged, so killing
    the task interrupts that run's work alone. A `spark` connection (a master URL)
    spark-submits the job's file instead, with the same arguments and environment.

    `payload` (templated: the upstream task's XCom, a planned run or a rebuild selection) holds
    the attempt's claim; the job gets only the claim's key and reads the plan from storage, so
    no plan is too large for a command line. The claim is checked before submitting: a
    fenced-out attempt fails without retries and starts no Spark work, and so does a run that
    only records a position. Credentials and Kafka's address are resolved when the task runs
    (never at DAG parse time) and reach the job as environment (`CAIRN_KAFKA_CONFIG`,
    `CAIRN_STORAGE_OPTIONS`, `CAIRN_SCHEMA_REGISTRIES`), not as arguments that show in process
    listings.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "payload")
    _connected: Connected | None = None
    """The run's hold on its Spark Connect session while its job runs (for `on_kill`)."""

    def __init__(
        self,
        *,
        job: str,
        topic: str,
        payload: Any,
        extra_env: Callable[[], dict[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            application=str(SPARK_JOBS / f"{job}.py"),
            conn_id=SPARK_CONN_ID,
            name=f"cairn-{job}-{topic}",
            conf={"spark.ui.showConsoleProgress": "false"},
            pool=SPARK_POOL,
            pool_slots=1,
            **kwargs,
        )
        self.job = job
        self.topic = topic
        self.payload = payload
        self.extra_env = extra_env
        """More environment for the job, resolved when the task runs (secrets included)."""

    def execute(self, context: Any) -> None:
        cfg = find_topic(self.topic)
        claim = commit.Claim.model_validate(self.payload["claim"])
        if "plan" in self.payload and Plan.model_validate(self.payload["plan"]).empty:
            log.info("%s only records a position: no Spark job", claim.label)
            return
        with fail_fast():
            commit.check_live(storage(cfg), claim)
            kafka = kafka_conf()
            kafka.spark_options()  # a setting Spark cannot use fails here, before submitting
        self.application_args = ["--topic", self.topic, "--claim", claim.key]
        self.env_vars = {
            OPTIONS_VARIABLE: json.dumps(storage_options(cfg, for_spark=True)),
            **kafka.to_env(),
            REGISTRIES_VARIABLE: json.dumps(schema_registries(cfg)),
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        } | (self.extra_env() if self.extra_env else {})
        if BaseHook.get_connection(self._conn_id).conn_type == SparkConnectHook.conn_type:
            self.run_connected()
            return
        jars = sorted(SPARK_JARS_DIR.glob("*.jar"))
        if not jars:
            raise FileNotFoundError(f"no Spark Kafka connector jars in {SPARK_JARS_DIR}")
        self.jars = ",".join(map(str, jars))
        try:
            super().execute(context)
        except AirflowException as err:
            if re.search(rf"Error code is: {PERMANENT_EXIT}\b", str(err)):
                raise AirflowFailException(f"{claim.label} stopped for good: {err}") from err
            raise

    def run_connected(self) -> None:
        """The job's `run` on a session of the connection's Spark Connect server, with the
        arguments and environment spark-submit would get (the secrets stay in this process and
        reach the server inside the run's plan, never on a command line)."""
        job = spark_job(self.job)
        url = SparkConnectHook(self._conn_id).get_connection_url()
        log.info("%s job on the Spark Connect server %s", self.job, url.split("/;", 1)[0])
        with environment(self.env_vars), fail_fast(), connect_session(url) as self._connected:
            try:
                log.info("%s", job.run(self._connected.session, self.application_args))
            finally:
                self._connected = None

    def on_kill(self) -> None:
        """Interrupt the session's work on Spark Connect, or kill spark-submit if it started."""
        if self._connected is not None:
            self._connected.interrupt()
        elif self._hook is not None:
            super().on_kill()


NOTIFIER_ENV = "CAIRN_NOTIFIER"
"""Import path (`package.module.name`) of what Cairn calls when a topic needs a person: an
Airflow notifier instance (e.g. a `SlackNotifier(...)` made in a module of yours) or any
callable taking the task context. Unset: failures only show in the UI."""


def notifier() -> list[Callable[..., Any]]:
    """The configured notifier as Airflow failure callbacks (empty when none is configured)."""
    path = os.environ.get(NOTIFIER_ENV, "").strip()
    return [import_string(path)] if path else []


def run_overdue(context: dict | None = None, topic: str = "?", limit: str = "") -> None:
    """Deadline Alert callback (run by the scheduler's executor, with Airflow's deadline context:
    the DAG run as a dict): an archive run is still unfinished past `max_run_duration`."""
    context = context or {}
    run_id = (context.get("dag_run") or {}).get("dag_run_id")
    reason = (
        f"topic {topic!r}: archive run {run_id} is not finished {limit} after it was queued "
        "(max_run_duration in topics.yaml)"
    )
    log.error(reason)
    for callback in notifier():
        callback({**context, "reason": reason})


def archive_deadline(cfg: TopicConfig) -> DeadlineAlert:
    """Report a run not finished `max_run_duration` after it was queued: stuck on a task, a
    Spark job or a full pool, it archives nothing and no check task would run to say so."""
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=cfg.max_run_duration,
        callback=SyncCallback(
            run_overdue, kwargs={"topic": cfg.topic, "limit": str(cfg.max_run_duration)}
        ),
    )


def report_run(cfg: TopicConfig, seq: int) -> status.RunRecord | None:
    """Send a committed run's metrics through Airflow's stats (StatsD, Datadog or OpenTelemetry,
    as `[metrics]` configures them). Best effort: the run is committed whatever happens here."""
    record = status.load(storage(cfg), cfg.topic, seq)
    if record is None:
        log.warning("topic %s: no status record for token %s; no metrics sent", cfg.topic, seq)
        return None
    try:
        emit(metrics.run_samples(record))
    except Exception as err:  # metrics must never fail a committed run
        log.warning("topic %s: metrics not sent: %s: %s", cfg.topic, type(err).__name__, err)
    return record


def emit(samples: list[metrics.Sample]) -> None:
    """Each sample through Airflow's stats: gauges, counters as increments, timings as timers.

    Plain StatsD has no tags, so there, as in Airflow's own legacy names, the labels go into the
    name: `cairn.offset_lag.<topic>.<partition>` (dots in a topic become `__`).
    """
    tagged = _stats_take_tags()
    for sample in samples:
        name, tags = sample.name, sample.labels
        if not tagged:
            name = ".".join([name, *(v.replace(".", "__") for v in tags.values())])
            tags = None
        if sample.name in metrics.TIMINGS:
            Stats.timing(name, timedelta(seconds=sample.value), tags=tags)
        elif sample.kind == "counter":
            Stats.incr(name, int(sample.value), tags=tags)
        else:
            Stats.gauge(name, sample.value, tags=tags)


def _stats_take_tags() -> bool:
    """Whether Airflow's configured stats backend keeps tags (all but plain StatsD)."""
    on = conf.getboolean("metrics", "statsd_on", fallback=False)
    datadog = conf.getboolean("metrics", "statsd_datadog_enabled", fallback=False)
    influx = conf.getboolean("metrics", "statsd_influxdb_enabled", fallback=False)
    return datadog or influx or not on


def check_health(cfg: TopicConfig) -> list[str]:
    """Fail the task (so the notifier is called) if the topic breaches a limit; else return
    what was checked."""
    found = alerts.breaches(cfg, status.topic_status(storage(cfg), cfg.topic))
    if found:
        raise AirflowFailException("; ".join(map(str, found)))
    return [
        f"topic {cfg.topic!r}: within max_time_lag {cfg.max_time_lag} and "
        f"max_quarantine_ratio {cfg.max_quarantine_ratio:g}"
    ]


def topic_asset(topic: str) -> Asset:
    """The asset whose events announce `topic`'s complete dates (README, Completeness)."""
    return Asset(completeness.asset_name(topic))


def announce_dates(asset: Asset, done: dict) -> list[str]:
    """Emit one event of `asset` per date `done` (a `Completion`) marked, the date as partition
    key; skip the task when there is none, so no event without a date is ever emitted."""
    keys = completeness.Completion.model_validate(done).partition_keys
    if not keys:
        raise AirflowSkipException("no date became complete or changed")
    events = get_current_context()["outlet_events"][asset]
    events.add_partitions(keys)
    events.extra = {"topic": done["topic"], "complete_through": done["through"]}
    return keys
