"""Spark job: re-derive the records filed under some dates from the verbatim backup.

Only adapts Spark to the core: each backup file the selection names becomes one Spark task that
re-parses the records it must (`cairn.pipeline.rebuild.rebuild_source`) into the rebuild's staging
area; the driver saves what each task staged in the attempt's manifest. It commits nothing: the
rebuild DAG's `commit` task does (`cairn.pipeline.rebuild.commit_rebuild`), as an archive run's
does.

    spark-submit spark_jobs/rebuild.py --topic T --claim _claims/<topic>/rebuild/<seq>-<k>.json

The selection arrives by reference (the claim object holds it), so a rebuild of many dates is
not limited by the command line. The Airflow task runs the same `run` on a Spark Connect session
instead when its Spark connection is a `spark_connect` one. Storage credentials (fsspec
options, JSON) come from CAIRN_STORAGE_OPTIONS, Schema Registry client configurations (avro
topics) from CAIRN_SCHEMA_REGISTRIES.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from cairn.config import TopicConfig
from cairn.errors import permanent_exit
from cairn.formats import registries_from_env
from cairn.jobs import job_args
from cairn.pipeline.rebuild import (
    RebuildResult,
    Selection,
    Source,
    load_selection,
    rebuild_source,
    save_attempt,
)
from cairn.protocol import commit
from cairn.storage.objects import Storage, options_from_env
from cairn.topics_file import find_topic

# This file's functions travel to the Python workers by value, so a Spark Connect server needs
# only `cairn` importable, whatever name the file was imported under (spark-submit's __main__,
# the Airflow task's loader, the tests' `spark_jobs.rebuild`).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rebuild(spark: SparkSession, chosen: Selection, cfg: TopicConfig, options: dict) -> str:
    """Stage the files re-derived from the chosen backup files; return the manifest's key."""
    storage = Storage(cfg.root.storage_url, **options)
    commit.check_live(storage, chosen.claim)
    registries = registries_from_env()  # Schema Registry client configs, for avro topics
    url, staged_url = storage.url, commit.staged(storage, chosen.claim).url
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
    rows = tasks.mapInArrow(one, "result string").collect()
    results = [RebuildResult.model_validate_json(row.result) for row in rows]
    commit.check_live(storage, chosen.claim)
    return save_attempt(storage, chosen, results)


def run(spark: SparkSession, argv: Sequence[str]) -> str:
    """The job on a session, from its arguments and environment: what `main` does under
    spark-submit, and what the Airflow task does on a Spark Connect session. Returns a
    one-line summary."""
    args = job_args(__doc__.splitlines()[0], argv)
    cfg = find_topic(args.topic, args.topics_file)
    options = options_from_env()
    chosen = load_selection(Storage(cfg.root.storage_url, **options), args.claim)
    key = rebuild(spark, chosen, cfg, options)
    return (
        f"re-derived {cfg.topic} {', '.join(map(str, chosen.dates))} from "
        f"{len(chosen.sources)} backup files into the attempt's staging; manifest {key}"
    )


def main() -> None:
    args = job_args(__doc__.splitlines()[0])
    spark = SparkSession.builder.appName(f"cairn-rebuild-{args.topic}").getOrCreate()
    with permanent_exit():
        summary = run(spark, sys.argv[1:])
    spark.stop()
    print(summary)


if __name__ == "__main__":
    main()
