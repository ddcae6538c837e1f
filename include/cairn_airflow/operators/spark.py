"""`CairnSparkOperator`: run one of Cairn's Spark jobs (`spark_jobs/<job>.py`) from a task, on a
Spark Connect server or by spark-submit, as the Spark connection's type says."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from cairn.config import REPO
from cairn.errors import PERMANENT_EXIT
from cairn.formats import REGISTRIES_VARIABLE
from cairn.protocol import commit
from cairn.protocol.plan import Plan
from cairn.storage.objects import OPTIONS_VARIABLE
from cairn.topics_file import find_topic
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import kafka_conf, schema_registries, storage, storage_options
from cairn_airflow.hooks.spark_connect import Connected, connect_session

log = logging.getLogger(__name__)

SPARK_CONN_ID = os.environ.get("CAIRN_SPARK_CONN_ID", "cairn_spark")
SPARK_POOL = os.environ.get("CAIRN_SPARK_POOL", "cairn_spark")
"""The Airflow pool every Cairn Spark task (archive and rebuild) takes one slot of, so its slots
cap how many Spark jobs run at once. Airflow does not create it: a task in a missing pool waits
in `scheduled` for ever (the local stack and docker-compose.yml create it; README)."""
SPARK_JARS_DIR = Path(os.environ.get("CAIRN_JARS_DIR", REPO / ".cairn" / "jars")) / "spark"
SPARK_JOBS = REPO / "spark_jobs"


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
    session with its warm Python workers (`cairn_airflow.hooks.spark_connect`); a run's work is
    tagged, so killing the task interrupts that run's work alone. A `spark` connection (a master
    URL) spark-submits the job's file instead, with the same arguments and environment.

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
        claim = commit.Claim.model_validate(self.payload["claim"])
        if "plan" in self.payload and Plan.model_validate(self.payload["plan"]).empty:
            log.info("%s only records a position: no Spark job", claim.label)
            return
        with fail_fast():
            cfg = find_topic(self.topic)  # an entry broken since the run started fails here
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
