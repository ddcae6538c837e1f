"""Spark job: seal one complete date — merge its files and write its table files.

Only adapts Spark to the core: each folder of the date (its event-time folders and its
quarantine) becomes one Spark task that merges the folder's files into sealed files in the
seal's staging area and writes its parsed records to the table's Parquet files
(`cairn.datafiles.seal_writer.seal_folder`); the driver saves what each task wrote in the
attempt's manifest. It commits nothing: the seal DAG's `commit` task does
(`cairn.pipeline.seal.finish_seal`).
`run` takes the job's `SealInput` (`cairn.jobs`); the selection arrives by reference (the claim
object), with the storage and table options in the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from cairn.config import TopicConfig
from cairn.datafiles.seal_writer import FolderResult, seal_folder
from cairn.jobs import SealInput
from cairn.pipeline.seal import Selection, check_inputs, load_claimed, save_attempt
from cairn.storage.objects import Storage
from spark_jobs.executors import guarded, requirements, translated


def seal(
    spark: SparkSession,
    chosen: Selection,
    cfg: TopicConfig,
    options: dict[str, Any],
    table_options: dict[str, Any],
    artifact: str | None = None,
) -> str:
    """Merge every folder of the chosen date; return the attempt manifest's key. `artifact`:
    the code artifact the executors must import Cairn from (`spark_jobs.executors`)."""
    storage = Storage(cfg.root.storage_url, **options)
    chosen.check_live(storage)
    url, staged_url = storage.url, chosen.staged(storage).url
    table_url = chosen.table.location if chosen.table else None
    selection, codec = chosen.model_dump_json(), cfg.codec

    def one(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        mine = Selection.model_validate_json(selection)
        for batch in batches:
            for index in batch.column("id").to_pylist():
                result = seal_folder(
                    mine,
                    index,
                    codec,
                    Storage(url, **options),
                    Storage(staged_url, **options),
                    Storage(table_url, **table_options) if table_url else None,
                )
                yield pa.RecordBatch.from_pylist([{"result": result.model_dump_json()}])

    # One task per folder; DataFrames, not RDDs, so it also runs on Spark Connect.
    n = len(chosen.folders)
    tasks = spark.range(0, n, 1, max(1, n))
    try:
        with translated():
            rows = tasks.mapInArrow(guarded(one, requirements(artifact)), "result string")
            rows = rows.collect()
    except Exception:
        check_inputs(storage, chosen)  # an input another commit removed: final, not a retry
        raise
    results = [FolderResult.model_validate_json(row.result) for row in rows]
    return save_attempt(storage, chosen, results)


def run(spark: SparkSession, job: SealInput) -> str:
    """The job on a session (`spark_jobs.main`). Returns a one-line summary."""
    cfg = job.topic.topic()
    options = job.storage_options
    chosen = load_claimed(Storage(cfg.root.storage_url, **options), job.claim)
    key = seal(spark, chosen, cfg, options, job.table_options, job.artifact)
    return f"sealed {cfg.topic} {chosen.date} ({len(chosen.folders)} folders); manifest {key}"
