"""Spark job: read exactly the planned Kafka ranges and archive them in one pass.

Only adapts Spark to the core: Spark's Kafka source gives each task one Kafka partition's range
in offset order (committed records only); the JVM encodes each record's backup datum and, where
`cairn.datafiles.fastpath` can, parses and encodes its partitioned datum; Arrow batches of those
hand them to `cairn.datafiles.writer.write_partition`, which assembles backup, partitioned and
quarantine files in the attempt's staging area (the Python parser takes the values the JVM did
not); the driver gathers what was written into the attempt manifest. `run` takes the job's
`ArchiveInput` (`cairn.jobs`; `spark_jobs.main` is the entry point): the plan arrives by reference
(the claim object holds it), the Kafka settings (mapped to the Java client's by
`cairn.kafka.connection`) and storage options with the input, never as arguments.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from cairn.config import TopicConfig
from cairn.datafiles import fastpath
from cairn.datafiles.writer import PartitionResult, write_partition
from cairn.jobs import ArchiveInput
from cairn.kafka.connection import KafkaAccessDenied, KafkaConf
from cairn.pipeline.archive_run import Planned, load_claimed, save_attempt
from cairn.protocol import manifest
from cairn.protocol.plan import kafka_assign_json, kafka_json_offsets
from cairn.storage.objects import Storage
from spark_jobs.executors import guarded, requirements, translated

# Arrow batches handed to Python are capped in bytes as well as records, so a run of 5 MB
# values does not hold thousands of them at once: memory is bounded by the batch, not the run.
ARROW_CONF = {
    "spark.sql.execution.arrow.maxRecordsPerBatch": "5000",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(32 * 1024 * 1024),
}

# A task reads one partition's range start to end, so it fetches up to 8 MB of it at a time
# instead of the Java client's 1 MB, through a socket buffer to match: an eighth of the round
# trips made the 1M-record benchmark ~4% faster, and a task still holds one fetch at a time.
# Spark's consumer asks the broker for the partition's earliest and latest offsets after every
# poll (two round trips), so a poll may return up to 10,000 records instead of 500: a
# 250,000-record task polls 25 times, not 500, and spends ~40% less time in Kafka's client.
# (Users' Kafka settings are limited to identity and connection ones, so these are Cairn's.)
FETCH_OPTIONS = {
    "kafka.max.partition.fetch.bytes": str(8 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(4 * 1024 * 1024),
    "kafka.max.poll.records": "10000",
}


def encoded(source: DataFrame, cfg: TopicConfig) -> DataFrame:
    """The Kafka source's records with their datums encoded in the JVM
    (`cairn.datafiles.fastpath`)."""
    nonce = "".join(secrets.choice(string.ascii_letters) for _ in range(24))
    for projection in fastpath.select(cfg, nonce):
        source = source.selectExpr(*projection)
    return source


# The Java client's exceptions for a refused login or an untrusted broker certificate.
REFUSED = re.compile(r"\b(\w*(?:AuthenticationException|SSLHandshakeException): [^\n]*)")


def archive(
    spark: SparkSession,
    planned: Planned,
    cfg: TopicConfig,
    kafka: KafkaConf,
    options: dict[str, Any],
    registries: dict[str, dict[str, Any]] | None = None,
    artifact: str | None = None,
) -> manifest.Manifest:
    """Read the planned ranges, stage every record, and save the attempt manifest.

    Checks the claim first: a fenced-out attempt starts no Spark work. The processing time is
    the plan's, so a retried or duplicated job of the same attempt writes the same bytes.
    `registries`: Schema Registry client configurations (avro topics); `artifact`: the code
    artifact the executors must import Cairn from (`spark_jobs.executors`).
    """
    storage = Storage(cfg.root.storage_url, **options)
    planned.check_live(storage)
    for key, value in ARROW_CONF.items():
        spark.conf.set(key, value)
    staged_url = planned.staged(storage).url
    processing_time, attempt_id = planned.planned_at, planned.attempt_id
    registries = registries or {}
    starting, ending = kafka_json_offsets(planned.topic, planned.plan)
    source = (
        spark.read.format("kafka")
        .options(**kafka.spark_options(), **FETCH_OPTIONS)
        .option("kafka.isolation.level", "read_committed")  # never an aborted transaction
        .option("assign", kafka_assign_json(planned.topic, planned.plan))
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .load()
    )

    gap = fastpath.gap(cfg)
    if gap is not None and cfg.parses:
        print(f"{planned.topic}: values are parsed in Python, not in Spark: {gap}")

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = Storage(staged_url, **options)
        result = write_partition(
            batches, cfg, out, processing_time, attempt_id, registries=registries
        )
        yield pa.RecordBatch.from_pylist([{"result": result.model_dump_json()}])

    wanted = requirements(artifact)
    try:
        with translated():
            rows = encoded(source, cfg).mapInArrow(guarded(write, wanted), "result string")
            rows = rows.collect()
    except Exception as err:
        causes = list(dict.fromkeys(REFUSED.findall(str(err))))[:2]  # the exception, its cause
        if not causes:
            raise
        raise KafkaAccessDenied(
            f"{kafka.describe()}: Spark's Kafka client was refused: {'; caused by '.join(causes)}"
        ) from None
    results = [PartitionResult.model_validate_json(row.result) for row in rows]
    return save_attempt(cfg, storage, planned, results)


def run(spark: SparkSession, job: ArchiveInput) -> str:
    """The job on a session (`spark_jobs.main`). Returns a one-line summary."""
    cfg = job.topic.topic()
    planned = load_claimed(Storage(cfg.root.storage_url, **job.storage_options), job.claim)
    attempt = archive(
        spark, planned, cfg, job.kafka_conf(), job.storage_options, job.registries, job.artifact
    )
    read = sum(attempt.records_read.values())
    return f"wrote {len(attempt.files)} files for {read} records; manifest {planned.manifest_key}"
