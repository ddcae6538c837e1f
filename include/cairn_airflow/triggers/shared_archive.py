"""`SharedArchiveTrigger`: archive runs ready at about the same moment share one Spark job.

On a Spark Connect connection, a run's archive task starts no Spark job of its own: it defers
to this trigger with its job's input (`cairn.jobs.ArchiveInput`). In the triggerer, the
triggers of one process queue at one `Batcher` per Spark Connect server, which runs the runs
that arrived while its previous job ran, and those that arrive within `gather` seconds after
the first, up to `max_runs` of them, as one Spark job (`spark_jobs.main.run_archives`): one
read over all their ranges, each run still staging its own attempt, saving its own manifest,
and committing its own token in its own Airflow run.

Each trigger then ends its task. A run with its manifest succeeds from the triggerer (no
worker takes the task up again); a run with an error resumes on a worker, which raises it. A
Spark job that fails as a whole does not say which run caused it, so every run in it fails
retryably, and a retried task runs a job of its own (`CairnSparkOperator`): a run whose
records fail (a retention gap, a permanent error) fails only its own run in the end.

A restarted triggerer starts the triggers again from the database: a run whose job had
finished finds its manifest; one whose job had not stages again, the same bytes
(`spark_jobs.archive`). The job's input holds secrets: Airflow stores trigger arguments
encrypted, and this trigger's `repr` leaves them out.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from cairn.errors import PermanentError
from cairn.jobs import ArchiveInput
from cairn.protocol import manifest

log = logging.getLogger(__name__)

GATHER_SECONDS = 2.0
"""How long a job waits, after the first run arrives, for others to share it."""
MAX_RUNS = 100
"""The most runs one shared Spark job stages."""

Outcome = manifest.Manifest | Exception
RunJob = Callable[[Sequence[ArchiveInput], str], list[Outcome]]
"""Runs one Spark job staging every input; its tag is the second argument."""


class SharedJobFailed(Exception):
    """The shared Spark job failed as a whole; which of its runs caused it is not known."""


@dataclass
class _Waiting:
    job: ArchiveInput
    outcome: asyncio.Future[Outcome]


@dataclass
class Batcher:
    """Gathers the runs of one Spark Connect server into shared jobs, one job at a time."""

    run_job: RunJob
    gather: float = GATHER_SECONDS
    max_runs: int = MAX_RUNS
    _waiting: list[_Waiting] = field(default_factory=list)
    _loop: asyncio.Task[None] | None = None

    async def archive(self, job: ArchiveInput) -> Outcome:
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
            log.info("shared Spark job %s: %d archive runs", tag, len(batch))
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
    def run(jobs: Sequence[ArchiveInput], tag: str) -> list[Outcome]:
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


class SharedArchiveTrigger(BaseTrigger):
    """Stages one archive run in a Spark job shared with the runs ready beside it."""

    def __init__(self, url: str, job: str) -> None:
        super().__init__()
        self.url, self.job = url, job

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {"url": self.url, "job": self.job}

    def __repr__(self) -> str:  # the job's input holds secrets
        return f"<{type(self).__name__} {self.url.split('/;', 1)[0]}>"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        job = ArchiveInput.model_validate_json(self.job)
        outcome = await batcher(self.url).archive(job)
        if isinstance(outcome, Exception):
            log.error("%s: %s: %s", job.claim, type(outcome).__name__, outcome)
            yield TriggerEvent(
                {
                    "error": f"{type(outcome).__name__}: {outcome}",
                    "permanent": isinstance(outcome, PermanentError),
                }
            )
            return
        read = sum(outcome.records_read.values())
        shared = outcome.spark_job
        log.info(
            "wrote %d files for %d records; attempt %s; Spark job %s of %d runs",
            len(outcome.files),
            read,
            outcome.attempt_id,
            shared.tag if shared else "?",
            shared.runs if shared else 1,
        )
        yield TaskSuccessEvent()
