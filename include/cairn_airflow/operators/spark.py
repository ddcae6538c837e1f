"""`CairnSparkOperator`: run one of Cairn's Spark jobs (archive, rebuild, seal) from a task, on a
Spark Connect server or by spark-submit, as the Spark connection's type says."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.definitions.xcom_arg import PlainXComArg
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import spark_jobs
from cairn.config import REPO, TopicConfig
from cairn.errors import PERMANENT_EXIT
from cairn.jobs import JobInput, check_shared, to_env
from cairn_airflow import job_inputs
from cairn_airflow.failures import fail, fail_fast
from cairn_airflow.hooks.connections import spark_conn_id
from cairn_airflow.hooks.spark_connect import Connected, connect_session
from cairn_airflow.spark_artifact import code_artifact
from cairn_airflow.step_result import pulled
from cairn_airflow.triggers.shared_archive import start_args

log = logging.getLogger(__name__)

SPARK_POOL = os.environ.get("CAIRN_SPARK_POOL", "cairn_spark")
"""The Airflow pool every Cairn Spark task (archive, rebuild, seal) takes one slot of, so its
slots cap how many Spark jobs run at once. Airflow does not create it: a task in a missing pool
waits in `scheduled` for ever (the local stack and docker-compose.yml create it;
docs/operating.md, Many topics)."""
SPARK_JARS_DIR = Path(os.environ.get("CAIRN_JARS_DIR", REPO / ".cairn" / "jars")) / "spark"
MAIN = Path(spark_jobs.__file__).with_name("main.py")
"""The jobs' entry point, imported only where a job runs: with pyspark and the jobs' modules,
its import took 0.5 s of every parse of a DAG file that builds Spark tasks (the DAG processor
parses them again for each batch of task callbacks) and of every task process's start."""


class CairnSparkOperator(SparkSubmitOperator):
    """Run one of Cairn's Spark jobs through the Spark connection.

    The connection's type chooses how. A `spark_connect` connection (the Apache Spark
    provider's; host and port of a Spark Connect server) runs `spark_jobs.main.run` in this
    task on a session of that long-lived server: no JVM starts per run; runs of one code
    version share a session with its warm Python workers (`cairn_airflow.hooks.spark_connect`),
    and a run's work is tagged, so killing the task interrupts that run's work alone. A `spark`
    connection (a master URL) spark-submits `spark_jobs/main.py` instead.

    An archive task starts in the triggerer, not on a worker, so it waits for no worker and
    takes no slot of the Spark pool: there its first try on Spark Connect stages in a Spark
    job shared with the archive runs ready beside it (`cairn_airflow.triggers.shared_archive`).
    A retried or cleared try, a topic with `share_spark_job: false` and a `spark` connection
    come to a worker (`resume`), in the pool, and run their job here.

    Either way the job gets one typed `JobInput` (`cairn_airflow.job_inputs`): the topic's entry
    with its files, the claim's key (the plan or selection is read from storage by reference),
    and the settings resolved when the task starts, never at DAG parse time (Kafka, storage,
    Schema Registries, the table's warehouse) — in the process on Spark Connect, in one
    environment variable for spark-submit, never as arguments that show in process listings.
    The job's code goes with it as this deployment's artifact (`cairn_airflow.spark_artifact`).
    The claim is checked before any Spark work: a fenced-out attempt fails without retries and
    starts none, and a run that only records a position starts none either.

    A `spark` connection's extra may hold Cairn's own settings under `cairn`: `python`, the
    executors' Python on the cluster (`spark.pyspark.python`; by default this Python for a
    `local` master and the cluster's `python3` otherwise), and `conf`, more Spark properties
    for every job (a queue's resources, `spark.cores.max`).
    """

    template_fields = (*SparkSubmitOperator.template_fields, "payload")
    _connected: Connected | None = None
    """The run's hold on its Spark Connect session while its job runs (for `on_kill`)."""

    def __init__(
        self, *, job: job_inputs.Job, cfg: TopicConfig, payload: Any, **kwargs: Any
    ) -> None:
        """A task of `cfg`'s topic: its Spark connection (`spark_connection`) and its attempts
        killed after `spark_timeout`. An archive task whose payload is its plan task's result
        starts in the triggerer (`start_args`)."""
        super().__init__(
            application=str(MAIN),
            conn_id=spark_conn_id(cfg),
            name=f"cairn-{job}-{cfg.topic}",
            pool=SPARK_POOL,
            pool_slots=1,
            execution_timeout=cfg.spark_timeout,
            **kwargs,
        )
        self.job = job
        self.topic = cfg.topic
        self.payload = payload
        if job == "archive" and isinstance(payload, PlainXComArg):
            self.start_from_trigger = True
            self.start_trigger_args = start_args(
                cfg.topic, self._conn_id, payload.operator.task_id, cfg.spark_timeout
            )

    def execute(self, context: Any) -> None:
        with fail_fast():
            resolved = job_inputs.resolve(self.job, self.topic, pulled(self.payload))
        if resolved is None:
            return
        _, job = resolved
        conn = BaseHook.get_connection(self._conn_id)
        if conn.conn_type == SparkConnectHook.conn_type:
            self.run_connected(job)
        else:
            self.submit(job, conn, context)

    def resume(self, context: Any, event: dict[str, Any]) -> None:
        """An archive run started in the triggerer comes to a worker: to run its job here, or,
        when it staged nothing, to raise its error."""
        if "on_worker" in event:
            log.info("archive job run by this task: %s", event["on_worker"])
            self.execute(context)
            return
        message = f"topic {self.topic!r}: {event['error']}"
        if event["permanent"]:
            fail(message)
        raise AirflowException(message)

    def run_connected(self, job: JobInput) -> None:
        """The job on a session of the connection's Spark Connect server (the job's input,
        secrets included, stays in this process and reaches the server inside the run's plan,
        never on a command line)."""
        import spark_jobs.main  # pyspark: only in the process that runs a job (`MAIN`)

        url = SparkConnectHook(self._conn_id).get_connection_url()
        log.info("%s job on the Spark Connect server %s", self.job, url.split("/;", 1)[0])
        with fail_fast(), connect_session(url, code_artifact()) as self._connected:
            try:
                log.info("%s", spark_jobs.main.run(self._connected.session, job))
            finally:
                self._connected = None

    def submit(self, job: JobInput, conn: Any, context: Any) -> None:
        """spark-submit `spark_jobs/main.py` with the code artifact and the connector jars."""
        master = conn.host + (f":{conn.port}" if conn.port else "")
        with fail_fast():
            check_shared(master, job.locations())  # before any JVM starts
        jars = sorted(SPARK_JARS_DIR.glob("*.jar"))
        if not jars:
            raise FileNotFoundError(f"no Spark Kafka connector jars in {SPARK_JARS_DIR}")
        own = conn.extra_dejson.get("cairn") or {}
        self.conf = {"spark.ui.showConsoleProgress": "false", **own.get("conf", {})}
        # The executors run the cluster's Python: the connection's, else the cluster's own
        # (its spark-defaults, else `python3`); this one only on a local master. A driver on
        # this machine (client deploy mode) runs this one, whatever the executors run.
        executors = own.get("python") or (sys.executable if master.startswith("local") else None)
        if executors:
            self.conf["spark.pyspark.python"] = executors
        if conn.extra_dejson.get("deploy-mode") != "cluster":
            self.conf["spark.pyspark.driver.python"] = sys.executable
        self.jars = ",".join(map(str, jars))
        self.py_files = str(code_artifact().path)
        self.env_vars = {**to_env(job), "PYSPARK_PYTHON": "python3"}
        try:
            super().execute(context)
        except AirflowException as err:
            if re.search(rf"Error code is: {PERMANENT_EXIT}\b", str(err)):
                label = f"topic {self.topic!r} {self.job} job"
                raise AirflowFailException(f"{label} stopped for good: {err}") from err
            raise

    def on_kill(self) -> None:
        """Interrupt the session's work on Spark Connect, or kill spark-submit if it started."""
        if self._connected is not None:
            self._connected.interrupt()
        elif self._hook is not None:
            super().on_kill()
