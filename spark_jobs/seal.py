"""Spark job: seal one complete date — merge its files and write its table files.

Only adapts Spark to the core: each folder of the date (its event-time folders and its
quarantine) becomes one Spark task that merges the folder's files into sealed files in the
seal's staging area and writes its parsed records to the table's Parquet files
(`cairn.pipeline.seal.seal_folder`); the driver saves what each task wrote in the attempt's
manifest. It commits nothing: the seal DAG's `commit` task does (`cairn.pipeline.seal.finish_seal`).

    spark-submit spark_jobs/seal.py --topic T --claim _claims/<topic>/seal/<seq>-<k>.json

The selection arrives by reference (the claim object). Storage credentials (fsspec options,
JSON) come from CAIRN_STORAGE_OPTIONS, the table's (its warehouse's) from CAIRN_TABLE_OPTIONS.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from cairn.config import TopicConfig
from cairn.errors import permanent_exit
from cairn.jobs import job_args
from cairn.pipeline.seal import (
    FolderResult,
    Selection,
    check_inputs,
    load_selection,
    save_attempt,
    seal_folder,
)
from cairn.protocol import commit
from cairn.storage.objects import Storage, options_from_env
from cairn.topics_file import find_topic

# This file's functions travel to the Python workers by value (see spark_jobs/archive.py).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TABLE_OPTIONS = "CAIRN_TABLE_OPTIONS"
"""fsspec options that reach the table's location (its warehouse), JSON."""


def seal(
    spark: SparkSession, chosen: Selection, cfg: TopicConfig, options: dict, table_options: dict
) -> str:
    """Merge every folder of the chosen date; return the attempt manifest's key."""
    storage = Storage(cfg.root.storage_url, **options)
    commit.check_live(storage, chosen.claim)
    url, staged_url = storage.url, commit.staged(storage, chosen.claim).url
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
    try:
        rows = spark.range(0, n, 1, max(1, n)).mapInArrow(one, "result string").collect()
    except Exception:
        check_inputs(storage, chosen)  # an input another commit removed: final, not a retry
        raise
    results = [FolderResult.model_validate_json(row.result) for row in rows]
    return save_attempt(storage, chosen, results)


def run(spark: SparkSession, argv: Sequence[str]) -> str:
    """The job on a session (what `main` does under spark-submit, and the Airflow task on a
    Spark Connect session). Returns a one-line summary."""
    args = job_args(__doc__.splitlines()[0], argv)
    cfg = find_topic(args.topic, args.topics_file)
    options = options_from_env()
    chosen = load_selection(Storage(cfg.root.storage_url, **options), args.claim)
    key = seal(spark, chosen, cfg, options, json.loads(os.environ.get(TABLE_OPTIONS) or "{}"))
    return f"sealed {cfg.topic} {chosen.date} ({len(chosen.folders)} folders); manifest {key}"


def main() -> None:
    args = job_args(__doc__.splitlines()[0])
    spark = SparkSession.builder.appName(f"cairn-seal-{args.topic}").getOrCreate()
    with permanent_exit():
        summary = run(spark, sys.argv[1:])
    spark.stop()
    print(summary)


if __name__ == "__main__":
    main()
