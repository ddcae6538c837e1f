"""Spark job: read exactly the planned Kafka ranges and archive them in one pass.

Only adapts Spark to the core: Spark's Kafka source gives each task one Kafka partition's range
in offset order (committed records only), as Arrow batches; `cairn.writer.write_partition`
streams them into backup, partitioned and quarantine files in the attempt's staging area; the
driver gathers what was written into the attempt manifest.

    CAIRN_KAFKA_CONFIG='{"config": {"bootstrap.servers": "host:9092"}}' \\
        spark-submit --jars <spark-sql-kafka jars> \\
        spark_jobs/archive.py --topic <topic> --claim _claims/<topic>/archive/<seq>-<k>.json

The plan arrives by reference (the claim object holds it), so its size is not limited by the
command line. Secrets arrive as environment, never as arguments: the Kafka configuration
(librdkafka settings, mapped to the Java client's by `cairn.kafka_conf`) in CAIRN_KAFKA_CONFIG
(or only bootstrap servers in CAIRN_BOOTSTRAP_SERVERS), storage credentials (fsspec options,
JSON) in CAIRN_STORAGE_OPTIONS, Schema Registry client configurations (avro topics) in
CAIRN_SCHEMA_REGISTRIES.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import SparkSession

from cairn import fence, manifest
from cairn.config import TOPICS_FILE, TopicConfig, find_topic
from cairn.errors import permanent_exit
from cairn.formats import registries_from_env
from cairn.kafka_conf import KafkaAccessDenied, KafkaConf
from cairn.plan import kafka_assign_json, kafka_json_offsets
from cairn.run import Planned, load_planned
from cairn.storage import Storage, options_from_env
from cairn.writer import KafkaRecord, PartitionResult, write_partition

# Arrow batches handed to Python are capped in bytes as well as records, so a run of 5 MB
# values does not hold thousands of them at once: memory is bounded by the batch, not the run.
ARROW_CONF = {
    "spark.sql.execution.arrow.maxRecordsPerBatch": "5000",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(32 * 1024 * 1024),
}


def records(batches: Iterator[pa.RecordBatch]) -> Iterator[KafkaRecord]:
    for batch in batches:
        millis = batch.column("timestamp").cast(pa.int64()).to_pylist()
        for row, ts in zip(batch.to_pylist(), millis, strict=True):
            yield KafkaRecord(
                topic=row["topic"],
                partition=row["partition"],
                offset=row["offset"],
                timestamp=ts // 1000,  # Spark's timestamps are microseconds
                timestamp_type=row["timestampType"],
                key=row["key"],
                value=row["value"],
                headers=[(h["key"], h["value"]) for h in row["headers"] or []],
            )


# The Java client's exceptions for a refused login or an untrusted broker certificate.
REFUSED = re.compile(r"\b(\w*(?:AuthenticationException|SSLHandshakeException): [^\n]*)")


def archive(
    spark: SparkSession, planned: Planned, cfg: TopicConfig, kafka: KafkaConf, options: dict
) -> manifest.Manifest:
    """Read the planned ranges, stage every record, and save the attempt manifest.

    Checks the claim first: a fenced-out attempt starts no Spark work. The processing time is
    the plan's, so a retried or duplicated job of the same attempt writes the same bytes.
    """
    storage = Storage(cfg.root.storage_url, **options)
    fence.check_live(storage, planned.claim)
    for key, value in ARROW_CONF.items():
        spark.conf.set(key, value)
    staged_url = planned.staged(storage).url
    processing_time, attempt_id = planned.planned_at, planned.attempt_id
    registries = registries_from_env()  # Schema Registry client configs, for avro topics
    starting, ending = kafka_json_offsets(planned.topic, planned.plan)
    source = (
        spark.read.format("kafka")
        .options(**kafka.spark_options())
        .option("kafka.isolation.level", "read_committed")  # never an aborted transaction
        .option("assign", kafka_assign_json(planned.topic, planned.plan))
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .load()
    )

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = Storage(staged_url, **options)
        result = write_partition(
            records(batches), cfg, out, processing_time, attempt_id, registries=registries
        )
        yield pa.RecordBatch.from_pylist([{"result": result.model_dump_json()}])

    try:
        rows = source.mapInArrow(write, "result string").collect()
    except Exception as err:
        causes = list(dict.fromkeys(REFUSED.findall(str(err))))[:2]  # the exception, its cause
        if not causes:
            raise
        raise KafkaAccessDenied(
            f"{kafka.describe()}: Spark's Kafka client was refused: {'; caused by '.join(causes)}"
        ) from None
    results = [PartitionResult.model_validate_json(row.result) for row in rows]
    attempt = manifest.Manifest(
        topic=planned.topic,
        attempt_id=planned.attempt_id,
        run_id=planned.run_id,
        generation=cfg.generation,
        ranges=planned.plan.to_read,
        records_read={r.partition: r.records for r in results if r.partition is not None},
        files=[entry for r in results for entry in r.files],
        processing_time=processing_time,
        created_at=datetime.now(UTC),
        gaps=planned.plan.gaps,
        parses=cfg.parses,
    )
    fence.check_live(storage, planned.claim)
    manifest.save(storage, attempt)
    return attempt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--claim", required=True, help="key of the claim holding the plan")
    parser.add_argument("--topics-file", default=str(TOPICS_FILE))
    args = parser.parse_args()
    cfg = find_topic(args.topic, args.topics_file)
    options = options_from_env()
    kafka = KafkaConf.from_env(os.environ)
    if kafka is None:
        raise SystemExit(
            "no Kafka configuration: set CAIRN_KAFKA_CONFIG or CAIRN_BOOTSTRAP_SERVERS"
        )
    planned = load_planned(Storage(cfg.root.storage_url, **options), args.claim)
    spark = SparkSession.builder.appName(f"cairn-archive-{planned.topic}").getOrCreate()
    with permanent_exit():
        attempt = archive(spark, planned, cfg, kafka, options)
    spark.stop()
    read = sum(attempt.records_read.values())
    print(f"wrote {len(attempt.files)} files for {read} records; manifest {planned.manifest_key}")


if __name__ == "__main__":
    main()
