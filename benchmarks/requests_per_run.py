"""S3 requests ONE archive run makes, after a short and after a long history, on the stack's S3.

A run must cost the same however many runs came before it (the brief's "cost flat in history").
This starts a private Kafka and a private SeaweedFS (the stack's S3 server, with its Prometheus
metrics on) and archives a 4-partition topic to an `s3://` root, one small run at a time (a few
records per partition, as a 10-minute schedule sees them). At each `--history` mark (default 10
and 1,000 runs) it measures `--measured` runs the way the archive DAG drives them — plan (it
claims), clean, the real Spark archive job (a local SparkSession in this process; its Python
workers write the staged files), verify, commit (it publishes), complete — and reads from
SeaweedFS's own counters how many S3 requests the server answered during each, by type. The
history between the marks is made by the same protocol steps with the in-process writer
(`cairn.datafiles.writer.write_partition`, what each Spark task runs) instead of Spark, so 1,000
runs take minutes, not hours; only the measured runs start Spark work.

    .venv/bin/python benchmarks/requests_per_run.py                     # 10 and 1,000 runs
    .venv/bin/python benchmarks/requests_per_run.py --history 10,100 --measured 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from archive_throughput import (
    SCHEMA,
    BenchError,
    console,
    git_commit,
    machine,
    private_kafka,
)
from confluent_kafka import Consumer, Producer, TopicPartition

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord, write_partition
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import archive_run, completeness, run_record
from cairn.storage.objects import Storage
from cairn.topics_file import find_topic
from cairn_stack import services
from cairn_stack.demo import create_topic
from cairn_stack.process import free_port_block
from cairn_stack.settings import REPO, StackSettings

PARTITIONS = 4
PER_PARTITION = 3
COUNTED = re.compile(r'^SeaweedFS_s3_request_total\{[^}]*type="(\w+)"[^}]*\} (\d+)', re.M)


def s3_requests(metrics_url: str) -> Counter:
    """Every S3 request SeaweedFS has answered so far, by type (GET includes HEAD)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found: Counter = Counter()
    for kind, n in COUNTED.findall(text):
        found[kind] += int(n)
    return found


def private_s3(state_dir: Path, stack: ExitStack) -> tuple[dict, StackSettings]:
    """A SeaweedFS on free ports with its metrics endpoint, which `s3://` archive roots of its
    connection id reach; returns fsspec options and its settings."""
    s3, master, volume, filer, metrics = free_port_block(5, step=2)
    settings = StackSettings(
        state_dir=state_dir,
        s3_port=s3,
        seaweed_master_port=master,
        seaweed_volume_port=volume,
        seaweed_filer_port=filer,
        seaweed_metrics_port=metrics,
    )
    service = services.seaweedfs(settings)
    with console.status("starting a private SeaweedFS"):
        service.start(settings.start_timeout)
    stack.callback(service.stop)
    # what an `s3://<conn id>@bucket/...` archive root resolves its endpoint and keys from
    os.environ[f"AIRFLOW_CONN_{settings.s3_conn_id.upper()}"] = json.dumps(
        {
            "conn_type": "aws",
            "login": settings.s3_access_key,
            "password": settings.s3_secret_key,
            "extra": {"endpoint_url": f"http://{settings.host}:{settings.s3_port}"},
        }
    )
    return services.s3_options(settings), settings


def topic_config(path: Path, topic: str, root: str, **more: object) -> TopicConfig:
    """A topics file of one JSON topic with completeness (`lateness: 1h`); `more` adds
    settings."""
    lines = "".join(f"    {key}: {value}\n" for key, value in more.items())
    path.write_text(
        textwrap.dedent(f"""\
        topics:
          - topic: {topic}
            format: json
            schema: {SCHEMA}
            event_time: {{field: ts, encoding: iso8601}}
            archive_root: {root}
            lateness: 1h
        """)
        + lines
    )
    return find_topic(topic, path)


def produce_batch(producer: Producer, topic: str, n: int) -> None:
    now = datetime.now(UTC).isoformat()
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            value = {"event_id": f"e{n}-{p}-{i}", "user_id": "u", "action": "a", "amount": 1.0}
            producer.produce(topic, json.dumps(value | {"ts": now}).encode(), partition=p)
    producer.flush(30)


def read_planned(kafka: KafkaConf, planned: archive_run.Planned) -> dict[int, list[KafkaRecord]]:
    """The planned ranges, read as the Spark job's Kafka source reads them (read_committed):
    all partitions at once, in batches (a poll per record made seal_day.py's 1M-record history
    take minutes)."""
    consumer = Consumer(
        kafka.client_config({"group.id": "bench", "isolation.level": "read_committed"})
    )
    ranges = planned.plan.to_read
    found: dict[int, list[KafkaRecord]] = {p: [] for p in ranges}
    missing = {p: end - start for p, (start, end) in ranges.items()}
    try:
        consumer.assign([TopicPartition(planned.topic, p, s) for p, (s, _) in ranges.items()])
        while any(missing.values()):
            batch = consumer.consume(min(10_000, sum(missing.values())), 10)
            if not batch:
                raise BenchError(f"no more records in 10 s; still to read: {missing}")
            for msg in batch:
                if msg.error() is not None:
                    raise BenchError(f"partition {msg.partition()}: {msg.error()}")
                p, offset = msg.partition(), msg.offset()
                if offset < ranges[p][1]:
                    found[p].append(
                        KafkaRecord(
                            planned.topic, p, offset, msg.timestamp()[1], 0, msg.key(), msg.value()
                        )
                    )
                    # offsets a transaction's markers take are never delivered
                    missing[p] = ranges[p][1] - offset - 1
    finally:
        consumer.close()
    return found


def history_run(cfg: TopicConfig, storage: Storage, kafka: KafkaConf) -> None:
    """One run through the protocol's steps, its records staged by the in-process writer."""
    planned = archive_run.plan_run(cfg, storage, kafka, f"history-{uuid.uuid4().hex[:6]}")
    if planned is None:
        raise BenchError("a history run found nothing to archive")
    archive_run.clean_run(storage, planned)
    staged = planned.staged(storage)
    results = [
        write_partition(records, cfg, staged, planned.planned_at, planned.attempt_id)
        for _, records in sorted(read_planned(kafka, planned).items())
    ]
    archive_run.save_attempt(cfg, storage, planned, results)
    report = archive_run.verify_run(storage, planned)
    archive_run.commit_run(cfg, storage, planned, report, kafka)
    completeness.complete_run(cfg, storage, kafka, planned.run_id)


Step = Callable[[str, Callable[[], Any]], Any]
"""Runs one named step of a run: `step(name, do)` returns `do()`."""


def counting(metrics_url: str) -> tuple[Step, dict[str, Counter]]:
    """A `Step` that also records the S3 requests SeaweedFS answered during each step."""
    counts: dict[str, Counter] = {}

    def step(name: str, do: Callable[[], Any]) -> Any:
        before = s3_requests(metrics_url)
        out = do()
        counts[name] = s3_requests(metrics_url) - before
        return out

    return step, counts


def spark_run(
    cfg: TopicConfig,
    storage: Storage,
    kafka: KafkaConf,
    spark,
    options: dict,
    step: Step = lambda _, do: do(),
) -> run_record.RunRecord | None:
    """One run as the archive DAG drives it — plan, clean, the real Spark archive job on
    `spark`, verify, commit, complete — each through `step`; None if there was nothing to read."""
    sys.path.insert(0, str(REPO))  # the Spark job's module, as the tests import it
    from spark_jobs.archive import archive

    run_id = f"measured-{uuid.uuid4().hex[:6]}"
    planned = step("plan", lambda: archive_run.plan_run(cfg, storage, kafka, run_id))
    if planned is None:
        return None
    step("clean", lambda: archive_run.clean_run(storage, planned))
    step("spark job", lambda: archive(spark, planned, cfg, kafka, options))
    report = step("verify", lambda: archive_run.verify_run(storage, planned))
    done = step("commit", lambda: archive_run.commit_run(cfg, storage, planned, report, kafka))
    step("complete", lambda: completeness.complete_run(cfg, storage, kafka, planned.run_id))
    return done


def measured_run(cfg, storage, kafka, spark, options, metrics_url) -> dict[str, Counter]:
    """One run as the archive DAG drives it; the S3 requests of each step."""
    step, counts = counting(metrics_url)
    spark_run(cfg, storage, kafka, spark, options, step)
    return counts


def local_spark(name: str) -> Any:
    """A local[2] SparkSession in this process with the Kafka connector's jars; its Python
    workers run this Python."""
    from pyspark.sql import SparkSession

    jars = sorted(str(p) for p in services.jars(StackSettings(), "spark").glob("*.jar"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )


def benchmark(args: argparse.Namespace, work: Path) -> dict:
    marks = sorted(int(m) for m in args.history.split(","))
    results = {}
    with ExitStack() as stack:
        bootstrap = stack.enter_context(private_kafka(work / "kafka"))
        options, s3 = private_s3(work / "seaweedfs", stack)
        metrics_url = f"http://{s3.host}:{s3.seaweed_metrics_port}/metrics"
        topic = f"bench.requests-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, partitions=PARTITIONS)
        cfg = topic_config(work / "topics.yaml", topic, f"s3://{s3.s3_conn_id}@{s3.bucket}/bench")
        storage = Storage(cfg.root.storage_url, **options)
        kafka = KafkaConf.from_bootstrap(bootstrap, "the benchmark's broker")
        producer = Producer({"bootstrap.servers": bootstrap})
        spark = local_spark("cairn-requests-per-run")
        stack.callback(spark.stop)
        done, started = 0, time.monotonic()
        for mark in marks:
            with console.status(f"history: {done} of {mark} runs") as status:
                while done < mark:
                    produce_batch(producer, topic, done)
                    history_run(cfg, storage, kafka)
                    done += 1
                    status.update(f"history: {done} of {mark} runs")
            runs = []
            for _ in range(args.measured):
                produce_batch(producer, topic, done)
                runs.append(measured_run(cfg, storage, kafka, spark, options, metrics_url))
                done += 1
            results[mark] = runs
            console.print(
                f"measured {args.measured} runs after {mark} ({time.monotonic() - started:.0f} s)"
            )
    return {"marks": results, "commit": git_commit(), "machine": machine()}


def show(result: dict) -> None:
    steps = ["plan", "clean", "spark job", "verify", "commit", "complete"]
    print(f"S3 requests per archive run ({PARTITIONS} partitions, {PER_PARTITION} records each)")
    print(
        f"{'runs before':>12}  " + "  ".join(f"{s:>9}" for s in steps) + f"  {'total':>6}  by type"
    )
    for mark, runs in result["marks"].items():
        for counts in runs:
            total = sum((c for c in counts.values()), Counter())
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(total.items()))
            cells = "  ".join(f"{sum(counts[s].values()):>9}" for s in steps)
            print(f"{mark:>12}  {cells}  {sum(total.values()):>6}  {kinds}")
    print(f"code {result['commit']}, {result['machine']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="10,1000", help="runs before each measurement")
    parser.add_argument("--measured", type=int, default=3, help="runs measured at each mark")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cairn-requests-"))
    try:
        result = benchmark(args, work)
    except BenchError as err:
        console.print(f"[red]benchmark failed:[/red] {err} (kept {work})")
        return 1
    if args.json:
        print(json.dumps(result, indent=2, default=dict))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
