"""Spark job: re-derive one date of parsed output (and its quarantine) from the verbatim backup.

Only adapts Spark to the core: each chosen backup file becomes one Spark task that re-parses it
with today's parser (`cairn.rebuild.rebuild_source`); once every new file is complete, the
driver replaces the date's stale files (`cairn.rebuild.finish_rebuild`).

    spark-submit spark_jobs/rebuild.py --payload '<Selection JSON from the select task>'

Storage credentials (fsspec options, JSON) come from CAIRN_STORAGE_OPTIONS.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from cairn.config import TOPICS_FILE, TopicConfig, find_topic
from cairn.rebuild import RebuildResult, Selection, Source, finish_rebuild, rebuild_source
from cairn.storage import Storage, options_from_env


def rebuild(spark: SparkSession, selection: Selection, cfg: TopicConfig, options: dict) -> list:
    """Write the date's new files from the chosen backup files, then delete the stale ones."""
    url, day = cfg.root.storage_url, selection.day

    def one(source: str) -> str:
        storage = Storage(url, **options)
        return rebuild_source(
            Source.model_validate_json(source), cfg, storage, day
        ).model_dump_json()

    sources = [s.model_dump_json() for s in selection.sources]
    results = []
    if sources:
        tasks = spark.sparkContext.parallelize(sources, len(sources))
        results = [RebuildResult.model_validate_json(r) for r in tasks.map(one).collect()]
    new_files = [f for r in results for f in r.files]
    storage = Storage(url, **options)
    return finish_rebuild(storage, cfg, selection.snapshot, day, new_files, selection.sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", required=True, help="the selection (JSON)")
    parser.add_argument("--topics-file", default=str(TOPICS_FILE))
    args = parser.parse_args()
    selection = Selection.model_validate_json(args.payload)
    cfg = find_topic(selection.snapshot.topic, args.topics_file)
    spark = SparkSession.builder.appName(f"cairn-rebuild-{cfg.topic}").getOrCreate()
    deleted = rebuild(spark, selection, cfg, options_from_env())
    spark.stop()
    print(
        f"rebuilt {cfg.topic} {selection.day} from {len(selection.sources)} backup files; "
        f"removed {len(deleted)} stale files"
    )


if __name__ == "__main__":
    main()
