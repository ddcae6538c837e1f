"""The one entry point of Cairn's Spark jobs: `run(spark, job)` dispatches a typed `JobInput`
(`cairn.jobs`) to its job (archive, rebuild, seal). Cairn's Airflow operator calls `run` on a
Spark Connect session, or spark-submits this file with the input in `CAIRN_JOB_INPUT` and the
code artifact as `--py-files`:

    CAIRN_JOB_INPUT='{"job": "archive", ...}' spark-submit --py-files cairn-<hash>.zip \\
        --jars <spark-sql-kafka jars> spark_jobs/main.py

Before any Spark work, a job whose executors would write to a local folder on other machines is
refused (`cairn.jobs.check_shared`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import SparkSession

from cairn.errors import permanent_exit
from cairn.jobs import ArchiveInput, JobInput, LocalStorageOnCluster, check_shared, from_env
from cairn.protocol import manifest
from spark_jobs import archive, rebuild, seal

JOBS: dict[str, Callable[[SparkSession, Any], str]] = {
    "archive": archive.run,
    "rebuild": rebuild.run,
    "seal": seal.run,
}


def run(spark: SparkSession, job: JobInput) -> str:
    """Run `job` on `spark`; returns the job's one-line summary."""
    check_shared(spark.conf.get("spark.master"), job.locations())
    return JOBS[job.job](spark, job)


def run_archives(
    spark: SparkSession, jobs: Sequence[ArchiveInput], tag: str
) -> list[manifest.Outcome]:
    """Archive runs staged by one shared Spark job tagged `tag`; one outcome per run, in order
    (`spark_jobs.archive.archive`). A run refused by `check_shared` is refused alone."""
    master = spark.conf.get("spark.master")
    outcomes: dict[int, manifest.Outcome] = {}
    for i, job in enumerate(jobs):
        try:
            check_shared(master, job.locations())
        except LocalStorageOnCluster as err:
            outcomes[i] = err
    go = [i for i in range(len(jobs)) if i not in outcomes]
    if go:
        outcomes.update(zip(go, archive.archive(spark, [jobs[i] for i in go], tag), strict=True))
    return [outcomes[i] for i in range(len(jobs))]


def main() -> None:
    job = from_env(os.environ)
    name = f"cairn-{job.job}-{job.topic.entry.get('topic')}"
    spark = SparkSession.builder.appName(name).getOrCreate()
    with permanent_exit():
        summary = run(spark, job)
    spark.stop()
    print(summary, file=sys.stdout)


if __name__ == "__main__":
    main()
