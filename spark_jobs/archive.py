"""Spark job: read exactly the planned Kafka ranges and archive them in one pass.

Only adapts Spark to the core: Spark's Kafka source gives each task one Kafka partition's range
in offset order (committed records only), or several tiny ranges one after another
(`cairn.packing`); the JVM encodes each record's backup datum and, where
`cairn.datafiles.fastpath` can, parses and encodes its partitioned datum; Arrow batches of those
hand them to `cairn.datafiles.writer.write_partition`, which assembles backup, partitioned and
quarantine files in the attempt's staging area (the Python parser takes the values the JVM did
not); the driver gathers what was written into the attempt manifest. `run` takes the job's
`ArchiveInput` (`cairn.jobs`; `spark_jobs.main` is the entry point): the plan arrives by reference
(the claim object holds it), the Kafka settings (mapped to the Java client's by
`cairn.kafka.connection`) and storage options with the input, never as arguments.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import lit
from pyspark.sql.pandas.types import from_arrow_schema

from cairn import packing
from cairn.config import TopicConfig
from cairn.datafiles import fastpath
from cairn.datafiles.writer import PartitionResult, write_partition
from cairn.jobs import ArchiveInput
from cairn.kafka.connection import KafkaAccessDenied
from cairn.pipeline.archive_run import Planned, load_claimed, save_attempt
from cairn.protocol import manifest
from cairn.protocol.plan import kafka_source_options
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
# Those two offset requests wait behind the fetch the client sends ahead after each poll, which
# the broker holds up to `fetch.max.wait.ms` when nothing follows: at the end of every range,
# 500 ms by default. A range's end is planned from what Kafka holds, so a fetch never needs to
# wait for records to arrive: 10 ms cut Spark's time for 80 ranges of 20 records from 22 s to
# 10.5 s (docs/performance.md, 2026-11-30).
# (Users' Kafka settings are limited to identity and connection ones, so these are Cairn's.)
FETCH_OPTIONS = {
    "kafka.max.partition.fetch.bytes": str(8 * 1024 * 1024),
    "kafka.receive.buffer.bytes": str(4 * 1024 * 1024),
    "kafka.max.poll.records": "10000",
    "kafka.fetch.max.wait.ms": "10",
}


def new_nonce() -> str:
    """A fresh nonce for `fastpath.select`: one per job."""
    return "".join(secrets.choice(string.ascii_letters) for _ in range(24))


def encoded(source: DataFrame, cfg: TopicConfig, nonce: str | None = None) -> DataFrame:
    """The Kafka source's records with their datums encoded in the JVM
    (`cairn.datafiles.fastpath`)."""
    for projection in fastpath.select(cfg, nonce or new_nonce()):
        source = source.selectExpr(*projection)
    return source


# The Java client's exceptions for a refused login or an untrusted broker certificate.
REFUSED = re.compile(r"\b(\w*(?:AuthenticationException|SSLHandshakeException): [^\n]*)")
UNKNOWN_TOPIC = "UnknownTopicOrPartitionException"


@dataclass(frozen=True)
class Part:
    """One topic's run in an archive job: its entry, its archive root and its plan."""

    job: ArchiveInput
    cfg: TopicConfig
    storage: Storage
    planned: Planned


def archive(
    spark: SparkSession, jobs: Sequence[ArchiveInput], tag: str | None = None
) -> list[manifest.Outcome]:
    """Read the planned ranges of every run in `jobs` in one Spark job, stage every record, and
    save each run's attempt manifest; one outcome per run, in order.

    Each run is checked first: a fenced-out attempt (or an unreadable claim) gets its error as
    its outcome and starts no Spark work, and the others go on. A failure of the Spark job
    itself is raised: which run caused it is not known. The processing time is each plan's, so
    a retried or duplicated job of the same attempt writes the same bytes. `tag`: the job's
    tag on its session, recorded in each manifest (`SparkJob`).
    """
    for key, value in ARROW_CONF.items():
        spark.conf.set(key, value)
    outcomes: list[manifest.Outcome | None] = [None] * len(jobs)
    parts: dict[int, Part] = {}
    for i, job in enumerate(jobs):
        try:
            parts[i] = _part(job)
        except Exception as err:
            outcomes[i] = err
    results: dict[int, list[PartitionResult]] = {i: [] for i in parts}
    collected, tasks = _collect(spark, parts) if parts else ([], 0)
    for i, result in collected:
        results[i].append(result)
    staged_by = manifest.SparkJob(tag=tag, runs=len(parts), tasks=tasks) if tag and parts else None
    for i, part in parts.items():
        try:
            outcomes[i] = save_attempt(part.cfg, part.storage, part.planned, results[i], staged_by)
        except Exception as err:  # e.g. fenced out while the job ran: this run alone
            outcomes[i] = err
    return [o for o in outcomes if o is not None]


def _part(job: ArchiveInput) -> Part:
    cfg = job.topic.topic()
    storage = Storage(cfg.root.storage_url, **job.storage_options)
    planned = load_claimed(storage, job.claim)
    planned.check_live(storage)
    return Part(job, cfg, storage, planned)


def _collect(
    spark: SparkSession, parts: dict[int, Part]
) -> tuple[list[tuple[int, PartitionResult]], int]:
    """One Spark job over every part's ranges: per group of parts (`_groups`) a Kafka source and
    a writer stage for its small ranges and one for its large ones (`cairn.packing`), all the
    results in one union; each result with its part, and how many Spark tasks read them."""
    nonce = new_nonce()
    groups = _groups(parts, nonce)
    frames = [
        frame.select(lit(g).alias("group"), "*")
        for g, group in enumerate(groups)
        for frame in _staging(spark, [parts[i] for i in group], nonce)
    ]
    owner = {(g, parts[i].planned.topic): i for g, group in enumerate(groups) for i in group}
    kafka = next(iter(parts.values())).job.kafka_conf()
    try:
        with translated():
            rows = _union(frames).collect()
    except Exception as err:
        if UNKNOWN_TOPIC in str(err):  # Kafka's words do not say which: every topic is named
            topics = sorted(part.planned.topic for part in parts.values())
            raise RuntimeError(
                f"{kafka.describe()}: Spark's Kafka client found a topic of the job gone (deleted "
                f"since it was planned?), among {', '.join(map(repr, topics[:10]))}"
                f"{f' and {len(topics) - 10} more' if len(topics) > 10 else ''} ({UNKNOWN_TOPIC})"
            ) from None
        causes = list(dict.fromkeys(REFUSED.findall(str(err))))[:2]  # the exception, its cause
        if not causes:
            raise
        raise KafkaAccessDenied(
            f"{kafka.describe()}: Spark's Kafka client was refused: {'; caused by '.join(causes)}"
        ) from None
    results = [
        (owner[(row.group, row.topic)], PartitionResult.model_validate_json(row.result))
        for row in rows
        if row.topic is not None  # a task whose ranges held no committed record
    ]
    return results, len({row.task for row in rows})


def _groups(parts: dict[int, Part], nonce: str) -> list[list[int]]:
    """The parts that one Kafka source reads and one writer stage stages: the same Kafka
    settings and the same JVM projection (topics of one configuration, as a pattern entry's
    are), at most one run of a topic. Each group costs the driver one Kafka offset reader, so a
    fleet of like topics is read by few sources, not one per topic."""
    groups: list[tuple[str, set[str], list[int]]] = []
    for i, part in parts.items():
        key = json.dumps([part.job.kafka, fastpath.select(part.cfg, nonce)], sort_keys=True)
        topic = part.planned.topic
        for same, topics, members in groups:
            if same == key and topic not in topics:
                topics.add(topic)
                members.append(i)
                break
        else:
            groups.append((key, {topic}, [i]))
    return [members for _, _, members in groups]


def _union(frames: list[DataFrame]) -> DataFrame:
    """A balanced union: the plan's depth grows as log(groups), not as groups (Spark Connect
    refuses plans nested too deeply)."""
    if len(frames) == 1:
        return frames[0]
    half = len(frames) // 2
    return _union(frames[:half]).unionAll(_union(frames[half:]))


@dataclass(frozen=True)
class _Target:
    """Where and how one part's writers stage its records (what travels to the executors)."""

    cfg: TopicConfig
    staged_url: str
    options: dict[str, Any]
    processing_time: datetime
    attempt_id: str
    registries: dict[str, dict[str, Any]]


RESULT = pa.schema([("topic", pa.string()), ("result", pa.string()), ("task", pa.int32())])


def _staging(spark: SparkSession, parts: list[Part], nonce: str) -> list[DataFrame]:
    """One group's records, read by its Kafka sources (`cairn.packing`: the small ranges packed
    into few tasks, each large one a task of its own) and staged in each part's staging area by
    its writers: one `write_partition` per range, so per topic-partition of a part."""
    first = parts[0]
    targets = {
        part.planned.topic: _Target(
            part.cfg,
            part.planned.staged(part.storage).url,
            part.job.storage_options,
            part.planned.planned_at,
            part.planned.attempt_id,
            part.job.registries,
        )
        for part in parts
    }
    ranges = {part.planned.topic: part.planned.plan.to_read for part in parts}
    for part in parts:
        gap = fastpath.gap(part.cfg)
        if gap is not None and part.cfg.parses:
            print(f"{part.planned.topic}: values are parsed in Python, not in Spark: {gap}")

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = TaskContext.get().partitionId()
        rows = []
        for (topic, _), run in packing.partition_runs(batches):
            target = targets[topic]
            result = write_partition(
                run,
                target.cfg,
                Storage(target.staged_url, **target.options),
                target.processing_time,
                target.attempt_id,
                registries=target.registries,
            )
            rows.append({"topic": topic, "result": result.model_dump_json(), "task": task})
        # A task whose ranges held no committed record stages nothing, and says so.
        yield pa.RecordBatch.from_pylist(rows or [{"task": task}], schema=RESULT)

    def read(source: packing.Source) -> DataFrame:
        records = (
            spark.read.format("kafka")
            .options(**first.job.kafka_conf().spark_options(), **FETCH_OPTIONS)
            .options(**kafka_source_options(source.ranges))
            .option("kafka.isolation.level", "read_committed")  # never an aborted transaction
            .option("kafka.allow.auto.create.topics", "false")  # nor a topic deleted since plan
            .option("failOnDataLoss", "true")
            .option("includeHeaders", "true")
            .load()
        )
        return records if source.tasks is None else records.coalesce(source.tasks)

    staged = guarded(write, requirements(first.job.artifact))
    return [
        encoded(read(source), first.cfg, nonce).mapInArrow(staged, from_arrow_schema(RESULT))
        for source in packing.pack(ranges)
    ]


def run(spark: SparkSession, job: ArchiveInput) -> str:
    """The job on a session (`spark_jobs.main`). Returns a one-line summary."""
    (outcome,) = archive(spark, [job])
    if isinstance(outcome, Exception):
        raise outcome
    read = sum(outcome.records_read.values())
    return f"wrote {len(outcome.files)} files for {read} records; attempt {outcome.attempt_id}"
