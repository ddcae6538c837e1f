"""Spark job: re-derive the records filed under some dates from the verbatim backup.

Only adapts Spark to the core: each backup file the selection names becomes one Spark task that
re-parses the records it must (`cairn.rebuild.rebuild_source`) into the rebuild's staging area;
the driver then replaces the dates' files, or refuses and changes nothing
(`cairn.rebuild.finish_rebuild`).

    spark-submit spark_jobs/rebuild.py --topic T --claim _claims/<topic>/rebuild/<seq>-<k>.json

The selection arrives by reference (the claim object holds it), so a rebuild of many dates is
not limited by the command line. Storage credentials (fsspec options, JSON) come from
CAIRN_STORAGE_OPTIONS, Schema Registry client configurations (avro topics) from
CAIRN_SCHEMA_REGISTRIES.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from cairn import fence, staging
from cairn.config import TOPICS_FILE, TopicConfig, find_topic
from cairn.errors import permanent_exit
from cairn.formats import registries_from_env
from cairn.rebuild import (
    RebuildManifest,
    RebuildResult,
    Selection,
    Source,
    finish_rebuild,
    load_selection,
    rebuild_source,
)
from cairn.storage import Storage, options_from_env


def rebuild(
    spark: SparkSession, chosen: Selection, cfg: TopicConfig, options: dict
) -> RebuildManifest:
    """Stage the re-derived files from the chosen backup files, then replace the dates' files."""
    storage = Storage(cfg.root.storage_url, **options)
    claim = chosen.claim
    if fence.decided_for(storage, claim.topic, "rebuild", claim.seq) == claim.attempt_id:
        return finish_rebuild(storage, cfg, chosen, [])  # a retry after it committed
    fence.check_live(storage, claim)
    url = storage.url
    registries = registries_from_env()  # Schema Registry client configs, for avro topics
    staged_url = staging.staged(storage, chosen.snapshot.topic, chosen.claim.attempt_id).url

    def one(source: str) -> str:
        result = rebuild_source(
            Source.model_validate_json(source),
            cfg,
            Storage(url, **options),
            Storage(staged_url, **options),
            registries=registries,
        )
        return result.model_dump_json()

    sources = [s.model_dump_json() for s in chosen.sources]
    tasks = spark.sparkContext.parallelize(sources, max(1, len(sources)))
    results = [RebuildResult.model_validate_json(r) for r in tasks.map(one).collect()]
    return finish_rebuild(storage, cfg, chosen, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--claim", required=True, help="key of the claim holding the selection")
    parser.add_argument("--topics-file", default=str(TOPICS_FILE))
    args = parser.parse_args()
    cfg = find_topic(args.topic, args.topics_file)
    options = options_from_env()
    chosen = load_selection(Storage(cfg.root.storage_url, **options), args.claim)
    spark = SparkSession.builder.appName(f"cairn-rebuild-{cfg.topic}").getOrCreate()
    with permanent_exit():
        done = rebuild(spark, chosen, cfg, options)
    spark.stop()
    print(
        f"rebuilt {cfg.topic} {', '.join(map(str, done.dates))} from {len(done.sources)} backup "
        f"files: {len(done.files)} files written, {len(done.removed)} removed"
    )


if __name__ == "__main__":
    main()
