"""Spark job: re-derive the records filed under some dates from the verbatim backup.

Only adapts Spark to the core: each backup file the selection names becomes one Spark task that
re-parses the records it must (`cairn.pipeline.rebuild.rebuild_source`) into the rebuild's staging
area; the driver saves what each task staged in the attempt's manifest. It commits nothing: the
rebuild DAG's `commit` task does (`cairn.pipeline.rebuild.commit_rebuild`), as an archive run's
does. `run` takes the job's `RebuildInput` (`cairn.jobs`); the selection arrives by reference
(the claim object holds it), so a rebuild of many dates is not limited by what a job is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from cairn.config import TopicConfig
from cairn.jobs import RebuildInput
from cairn.pipeline.rebuild import (
    RebuildResult,
    Selection,
    Source,
    load_claimed,
    rebuild_source,
    save_attempt,
)
from cairn.storage.objects import Storage
from spark_jobs.executors import guarded, requirements, translated


def rebuild(
    spark: SparkSession,
    chosen: Selection,
    cfg: TopicConfig,
    options: dict[str, Any],
    registries: dict[str, dict[str, Any]] | None = None,
    artifact: str | None = None,
) -> str:
    """Stage the files re-derived from the chosen backup files; return the manifest's key.
    `registries`: Schema Registry client configurations (avro topics); `artifact`: the code
    artifact the executors must import Cairn from (`spark_jobs.executors`)."""
    storage = Storage(cfg.root.storage_url, **options)
    chosen.check_live(storage)
    registries = registries or {}
    url, staged_url = storage.url, chosen.staged(storage).url
    sources = [s.model_dump_json() for s in chosen.sources]

    def one(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column("id").to_pylist():
                result = rebuild_source(
                    Source.model_validate_json(sources[index]),
                    cfg,
                    Storage(url, **options),
                    Storage(staged_url, **options),
                    registries=registries,
                )
                yield pa.RecordBatch.from_pylist([{"result": result.model_dump_json()}])

    # One Spark task per backup file; DataFrames, not RDDs, so it also runs on Spark Connect.
    tasks = spark.range(0, len(sources), 1, max(1, len(sources)))
    with translated():
        rows = tasks.mapInArrow(guarded(one, requirements(artifact)), "result string").collect()
    results = [RebuildResult.model_validate_json(row.result) for row in rows]
    return save_attempt(storage, chosen, results)


def run(spark: SparkSession, job: RebuildInput) -> str:
    """The job on a session (`spark_jobs.main`). Returns a one-line summary."""
    cfg = job.topic.topic()
    options = job.storage_options
    chosen = load_claimed(Storage(cfg.root.storage_url, **options), job.claim)
    key = rebuild(spark, chosen, cfg, options, job.registries, job.artifact)
    return (
        f"re-derived {cfg.topic} {', '.join(map(str, chosen.dates))} from "
        f"{len(chosen.sources)} backup files into the attempt's staging; manifest {key}"
    )
