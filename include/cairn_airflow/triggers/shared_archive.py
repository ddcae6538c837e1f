"""`SharedArchiveTrigger`: archive runs ready at about the same moment share one Spark job.

An archive task starts here, in the triggerer (Airflow's `start_from_trigger`), not on a
worker: it waits for no worker process and takes no slot of the Spark pool. The trigger reads
the run's plan and checks its claim (`cairn_airflow.job_inputs`), as a worker would. On a Spark
Connect connection, a first try then resolves its job's input and queues at one `Batcher` per
Spark Connect server and triggerer process, which runs the runs that arrived while its
previous job ran, and those that arrive within `gather` seconds after the first, up to
`max_runs` of them, as one Spark job (`spark_jobs.main.run_archives`): one read over all
their ranges, each run still staging its own attempt, saving its own manifest, and committing
its own token in its own Airflow run. The Batcher runs one job at a time: it, not the pool,
bounds the shared jobs.

Each trigger then ends its task. A run with its manifest succeeds from the triggerer (no
worker takes the task up); a run with an error goes to a worker, which raises it. A Spark job
that fails as a whole does not say which run caused it, so every run in it fails retryably,
and a retried or cleared try runs a job of its own on a worker, in the pool
(`CairnSparkOperator.resume`), as do a topic with `share_spark_job: false` and a `spark`
(spark-submit) connection: a run whose records fail (a retention gap, a permanent error)
fails only its own run in the end.

A restarted triggerer starts the triggers again from the database, and a run whose job had
not committed stages again, the same bytes (`spark_jobs.archive`). The trigger's arguments
name the topic, the Spark connection and the plan task, no secret: the job's input, which
holds them, stays in the triggerer's memory.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.jobs import ArchiveInput
from cairn.protocol import manifest
from cairn_airflow.step_result import pull
from cairn_airflow.triggers.loop_logger import LoopLogger

log = LoopLogger(__name__)

GATHER_SECONDS = 2.0
"""How long a job waits, after the first run arrives, for others to share it."""
MAX_RUNS = 100
"""The most runs one shared Spark job stages."""

RunJob = Callable[[Sequence[ArchiveInput], str], list[manifest.Outcome]]
"""Runs one Spark job staging every input; its tag is the second argument."""


class SharedJobFailed(Exception):
    """The shared Spark job failed as a whole; which of its runs caused it is not known."""


@dataclass
class _Waiting:
    job: ArchiveInput
    outcome: asyncio.Future[manifest.Outcome]


@dataclass
class Batcher:
    """Gathers the runs of one Spark Connect server into shared jobs, one job at a time."""

    run_job: RunJob
    gather: float = GATHER_SECONDS
    max_runs: int = MAX_RUNS
    _waiting: list[_Waiting] = field(default_factory=list)
    _loop: asyncio.Task[None] | None = None

    async def archive(self, job: ArchiveInput) -> manifest.Outcome:
        """Stage `job` in the next shared job; its outcome. Cancelled before its job starts,
        the run leaves the queue (once started, the job goes on for the others)."""
        waiting = _Waiting(job, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._jobs())
        return await waiting.outcome

    async def _jobs(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.gather)
            batch, self._waiting = self._waiting[: self.max_runs], self._waiting[self.max_runs :]
            batch = [w for w in batch if not w.outcome.done()]  # cancelled while queued
            if not batch:
                continue
            tag = f"cairn-shared-{uuid.uuid4().hex}"
            await log.info("shared Spark job %s: %d archive runs", tag, len(batch))
            try:
                outcomes = await asyncio.to_thread(self.run_job, [w.job for w in batch], tag)
            except Exception as err:
                outcomes = [_failed(err, len(batch))] * len(batch)
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.outcome.done():
                    waiting.outcome.set_result(outcome)


def _failed(err: Exception, runs: int) -> Exception:
    if runs == 1:
        return err
    return SharedJobFailed(
        f"the Spark job shared by {runs} archive runs failed ({type(err).__name__}: {err}); "
        "this run's retry runs a job of its own"
    )


_BATCHERS: dict[str, Batcher] = {}
"""One per Spark Connect server, in this triggerer process."""


def _run_on(url: str) -> RunJob:
    def run(jobs: Sequence[ArchiveInput], tag: str) -> list[manifest.Outcome]:
        import spark_jobs.main  # pyspark: only in the process that runs a job
        from cairn_airflow.hooks.spark_connect import connect_session
        from cairn_airflow.spark_artifact import code_artifact

        with connect_session(url, code_artifact(), tag) as connected:
            return spark_jobs.main.run_archives(connected.session, jobs, tag)

    return run


def batcher(url: str) -> Batcher:
    if url not in _BATCHERS:
        from airflow.sdk import conf

        _BATCHERS[url] = Batcher(
            _run_on(url),
            gather=conf.getfloat("cairn", "shared_job_gather_seconds", fallback=GATHER_SECONDS),
            max_runs=conf.getint("cairn", "shared_job_max_runs", fallback=MAX_RUNS),
        )
    return _BATCHERS[url]


Started = tuple[str, ArchiveInput] | str | None
"""How an archive run goes on: in a shared job on this Spark Connect server with this input,
on a worker for this reason, or nowhere (it only records a position)."""


def start_args(topic: str, spark_conn_id: str, plan_task: str, timeout: timedelta) -> Any:
    """What starts `topic`'s archive task in the triggerer (`start_from_trigger`): this trigger,
    which reads the run's plan from `plan_task`'s result, and the method a worker resumes."""
    from airflow.triggers.base import StartTriggerArgs

    path, kwargs = SharedArchiveTrigger(topic, spark_conn_id, plan_task).serialize()
    return StartTriggerArgs(
        trigger_cls=path, trigger_kwargs=kwargs, next_method="resume", timeout=timeout
    )


class SharedArchiveTrigger(BaseTrigger):
    """Starts one archive task: stages its run in a Spark job shared with the runs ready beside
    it, or sends it to a worker."""

    def __init__(self, topic: str, spark_conn_id: str, plan_task: str) -> None:
        super().__init__()
        self.topic, self.spark_conn_id, self.plan_task = topic, spark_conn_id, plan_task

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            "topic": self.topic,
            "spark_conn_id": self.spark_conn_id,
            "plan_task": self.plan_task,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            started = await asyncio.to_thread(self._start)
        except Exception as err:
            yield _error(err)
            return
        if started is None:
            yield TaskSuccessEvent()
            return
        if isinstance(started, str):
            yield TriggerEvent({"on_worker": started})
            return
        url, job = started
        await log.info("archive job shared on the Spark Connect server %s", url.split("/;", 1)[0])
        outcome = await batcher(url).archive(job)
        if isinstance(outcome, Exception):
            await log.error("%s: %s: %s", job.claim, type(outcome).__name__, outcome)
            yield _error(outcome)
            return
        read = sum(outcome.records_read.values())
        shared = outcome.spark_job
        await log.info(
            "wrote %d files for %d records; attempt %s; Spark job %s of %d runs",
            len(outcome.files),
            read,
            outcome.attempt_id,
            shared.tag if shared else "?",
            shared.runs if shared else 1,
        )
        yield TaskSuccessEvent()

    def _start(self) -> Started:
        """Checks the run's claim as a worker would (`cairn_airflow.job_inputs`), then resolves
        its job's input only if it shares a job: a worker resolves its own."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from cairn_airflow.job_inputs import checked, job_input

        ti: Any = self.task_instance
        planned = pull(ti, self.plan_task)
        cfg = checked(self.topic, planned)
        if cfg is None:
            return None
        if ti.try_number > 1:
            return f"try {ti.try_number}: a retried or cleared run's job is its own"
        if own := own_job(cfg, self.spark_conn_id):
            return own
        job = job_input("archive", cfg, planned)
        assert isinstance(job, ArchiveInput)
        return SparkConnectHook(self.spark_conn_id).get_connection_url(), job


def own_job(cfg: TopicConfig, spark_conn_id: str) -> str | None:
    """Why each archive run of `cfg` runs a Spark job of its own, on a worker in the Spark pool
    (`CairnSparkOperator.resume`); None when its first try shares a job from the triggerer."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from cairn_airflow.hooks.connections import connection

    if not cfg.share_spark_job:
        return "share_spark_job is false"
    conn = connection(spark_conn_id)
    if conn.conn_type != SparkConnectHook.conn_type:
        return f"connection {spark_conn_id!r} is of type {conn.conn_type!r}"
    return None


def _error(err: Exception) -> TriggerEvent:
    return TriggerEvent(
        {"error": f"{type(err).__name__}: {err}", "permanent": isinstance(err, PermanentError)}
    )
