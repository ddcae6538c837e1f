"""The shared archive job's batching (`cairn_airflow.triggers.shared_archive`): which runs share
a Spark job, and what each run's trigger reports."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

from airflow.triggers.base import TaskSuccessEvent

from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.jobs import ArchiveInput
from cairn.protocol.manifest import Manifest, SparkJob
from cairn_airflow.triggers import shared_archive
from cairn_airflow.triggers.shared_archive import Batcher, SharedArchiveTrigger, SharedJobFailed


def job(claim: str) -> ArchiveInput:
    cfg = TopicConfig.model_validate({"topic": "t", "format": "raw", "archive_root": "file:///a"})
    return ArchiveInput(
        topic=cfg.snapshot(), claim=claim, kafka={"bootstrap.servers": "k:9092"}, kafka_label="k"
    )


def staged(claim: str, tag: str, runs: int) -> Manifest:
    return Manifest(
        topic="t",
        attempt_id=claim,
        run_id="r",
        generation=1,
        ranges={0: (0, 1)},
        records_read={0: 1},
        files=[],
        processing_time=datetime.now(UTC),
        created_at=datetime.now(UTC),
        spark_job=SparkJob(tag=tag, runs=runs),
    )


class Jobs:
    """A fake Spark: records each job's runs; `hold` keeps a job running until set."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.jobs: list[list[str]] = []
        self.fail = fail
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, jobs, tag):
        self.jobs.append([j.claim for j in jobs])
        self.hold.wait(5)
        if self.fail:
            raise self.fail
        return [staged(j.claim, tag, len(jobs)) for j in jobs]


def test_runs_arriving_together_share_one_job_and_each_gets_its_own_manifest():
    spark = Jobs()

    async def main():
        batcher = Batcher(spark, gather=0.05)
        return await asyncio.gather(*(batcher.archive(job(c)) for c in "abc"))

    outcomes = asyncio.run(main())

    assert spark.jobs == [["a", "b", "c"]]
    assert [o.attempt_id for o in outcomes] == ["a", "b", "c"]
    assert len({o.spark_job.tag for o in outcomes}) == 1 and outcomes[0].spark_job.runs == 3


def test_runs_arriving_while_a_job_runs_share_the_next_one_and_max_runs_splits():
    spark = Jobs()
    spark.hold.clear()

    async def main():
        batcher = Batcher(spark, gather=0.01, max_runs=2)
        first = asyncio.create_task(batcher.archive(job("a")))
        while not spark.jobs:
            await asyncio.sleep(0.01)
        later = [asyncio.create_task(batcher.archive(job(c))) for c in "bcd"]
        await asyncio.sleep(0.1)
        spark.hold.set()
        return await asyncio.gather(first, *later)

    outcomes = asyncio.run(main())

    assert spark.jobs == [["a"], ["b", "c"], ["d"]]
    assert [o.spark_job.runs for o in outcomes] == [1, 2, 2, 1]


def test_a_shared_job_failing_fails_each_run_retryably_and_a_lone_run_with_its_error():
    refused = PermanentError("the executors cannot run it")

    async def main(claims):
        batcher = Batcher(Jobs(fail=refused), gather=0.01)
        return await asyncio.gather(*(batcher.archive(job(c)) for c in claims))

    shared = asyncio.run(main("ab"))
    assert all(isinstance(o, SharedJobFailed) for o in shared)
    assert not isinstance(shared[0], PermanentError)  # its retry runs alone, and may pass
    assert "shared by 2 archive runs" in str(shared[0]) and "cannot run it" in str(shared[0])
    assert asyncio.run(main("a")) == [refused]


def test_a_run_cancelled_while_queued_leaves_the_queue():
    spark = Jobs()

    async def main():
        batcher = Batcher(spark, gather=0.05)
        gone = asyncio.create_task(batcher.archive(job("gone")))
        kept = asyncio.create_task(batcher.archive(job("kept")))
        await asyncio.sleep(0.01)
        gone.cancel()
        return await kept

    assert asyncio.run(main()).attempt_id == "kept"
    assert spark.jobs == [["kept"]]


def run_trigger(monkeypatch, outcome) -> list:
    async def archive(self, job):
        return outcome

    monkeypatch.setattr(Batcher, "archive", archive)
    trigger = SharedArchiveTrigger("t", "cairn_spark", "plan")
    monkeypatch.setattr(trigger, "_start", lambda: ("sc://s", job("a")))

    async def events():
        return [event async for event in trigger.run()]

    return asyncio.run(events())


def test_the_trigger_ends_a_staged_run_from_the_triggerer_and_resumes_a_failed_one(monkeypatch):
    [done] = run_trigger(monkeypatch, staged("a", "tag", 2))
    assert isinstance(done, TaskSuccessEvent)  # no worker takes the task up

    [failed] = run_trigger(monkeypatch, PermanentError("fenced"))
    assert failed.payload == {"error": "PermanentError: fenced", "permanent": True}


def test_the_trigger_serializes_for_the_triggerer_without_a_secret():
    kwargs = {"topic": "t", "spark_conn_id": "cairn_spark", "plan_task": "plan"}
    path, back = SharedArchiveTrigger(**kwargs).serialize()
    assert path == "cairn_airflow.triggers.shared_archive.SharedArchiveTrigger"
    assert back == kwargs
    start = shared_archive.start_args(**kwargs, timeout=timedelta(minutes=30))
    assert start.trigger_cls == path and start.trigger_kwargs == kwargs
