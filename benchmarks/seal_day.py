"""Sealing ONE date, end to end, beside plain Spark doing the same work; day-scan queries before
and after; and the S3 requests of a seal as sealed dates accumulate. The Seal issue's numbers.

1. **The date.** D (3 days ago: Kafka keeps it) as a day of 10-minute archive runs leaves it:
   `--records` JSON events over `--runs` runs and `--partitions` partitions, produced with
   explicit Kafka timestamps (run r's records in its 10 minutes), `--late-fraction` of them late
   (event time 1 to `--late-hours` hours earlier in the same date, so every run also writes files
   into earlier hour folders). Every run is the protocol's own — plan, clean, write, verify,
   commit and `completeness.complete_run` (`requests_per_run.history_run`: the in-process writer
   stages the records instead of Spark) — and reads exactly its 10 minutes
   (`max_records_per_partition`). The last run also carries, on every partition, records whose
   Kafka time is past D's cutoff (end of D + `lateness` 1h): that is what makes D complete (the
   benchmark checks D is not complete before it).
2. **The seal**, as the seal DAG drives it: `seal.select` (with the topic's table in a private
   Iceberg JDBC catalog on PostgreSQL, warehouse a local folder), the real seal job through
   spark-submit of `spark_jobs/main.py` on the stack's master (its `SealInput` in the
   environment, as the operator gives it; wall time, and peak RSS of its process tree sampled
   every 0.2 s), then
   `seal.finish_seal` (commit, the table's snapshot, the proof), each timed. Checked: every hour
   folder holds exactly the (partition, offset) it held, the table's count for D is the proof's,
   and no folder has more than ceil(its bytes / `seal_target_file_mb`) files.
3. **Plain Spark** on a copy of D's folder taken before sealing, spark-submitted on the same
   master with the same jars (`spark_day.py rewrite`): one Avro file per hour folder, and the
   same plus one Parquet file per hour (what sealing also writes for the table).
4. **Day-scan queries** in one spark-submit (`spark_day.py scan`): `count(*)` and count per
   `action` over D's unsealed copy, its sealed folder and its table by name through the catalog;
   best of `--scan-rounds` each. All three must give the same answers.
5. **S3 requests per seal** (`--skip-requests` skips): a private SeaweedFS with its metrics, a
   second topic whose dates (`--date-records` each) are archived and sealed one after the other,
   its table on the same S3; the requests of each seal's select, seal job (on a local
   SparkSession in this process, as `requests_per_run.py` runs its jobs; the seals between the
   measured ones run the job's tasks in-process, without Spark) and finish_seal, and the
   table's metadata after it (its metadata file's size, the files in its metadata folder, its
   snapshots and manifests, its offset index file's size), for the first `--measured` dates and
   after `--sealed-history` sealed dates. The topic keeps `--snapshot-age` of table snapshots:
   seals come seconds apart here, so a short age keeps as many as a week keeps at a seal a day.

    .venv/bin/python benchmarks/seal_day.py                                  # 1M records, all
    .venv/bin/python benchmarks/seal_day.py --records 50000 --runs 24        # a quick check
    .venv/bin/python benchmarks/seal_day.py --records 10000000 --skip-requests --skip-scan
    .venv/bin/python benchmarks/seal_day.py --records 2000 --runs 4 --skip-peers --skip-scan \
        --sealed-history 1000 --measured 11 --date-records 8 --snapshot-age 40s   # 10 and 1,000

Private Kafka, PostgreSQL (and SeaweedFS) are started on free ports and stopped; everything lives
in a temporary folder, removed afterwards (kept when the run fails or with `--keep`).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import math
import os
import pstats
import random
import shlex
import shutil
import sys
import time
import uuid
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
from archive_throughput import (
    JOB,
    BenchError,
    JobRun,
    Peaks,
    PeerRun,
    Server,
    add_common_options,
    connect_argv,
    console,
    delete_topic,
    event_value,
    git_commit,
    print_rows,
    private_kafka,
    progress_bars,
    run_benchmark,
    spark_submit,
    submit_argv,
    task_seconds,
)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from requests_per_run import counting, history_run, private_s3, topic_config

from cairn.datafiles.avro_file import read_header
from cairn.datafiles.seal_writer import seal_folder
from cairn.jobs import SealInput, to_env
from cairn.kafka.connection import LIBRDKAFKA_LOG, KafkaConf
from cairn.pipeline import completeness, seal
from cairn.pipeline.proof import Proof
from cairn.pipeline.rebuild import day_files
from cairn.protocol import commit
from cairn.storage.layout import DataFile, date_folder, kind_folder
from cairn.storage.objects import Storage
from cairn.table import catalog as catalogs
from cairn.table import iceberg, offset_index
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack import services
from cairn_stack.process import free_port_block
from cairn_stack.settings import REPO, StackSettings

PEERS = REPO / "benchmarks" / "spark_day.py"
RUN = timedelta(days=1)
CLOSING = 2
"""Records per partition, at the end of the last run, whose Kafka time is past D's cutoff."""


# --- the date ---------------------------------------------------------------------------------


@dataclass
class Day:
    """The date as its archive runs left it."""

    date: str
    records: int
    """Records filed under the date (all of its runs' records but the closing ones)."""
    late: int
    runs: int
    partitions: int
    records_per_run_partition: int
    files: int
    folders: int
    bytes: int
    produce_seconds: float
    build_seconds: float
    """All runs: plan, clean, the in-process writer, verify, commit, complete_run."""


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def create_kept_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """A topic whose records Kafka keeps however old their timestamps (the dates are past)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})
    admin.create_topics([new])[topic].result(30)


class TimedProducer:
    """Produce values with explicit Kafka timestamps, fast; fails if any is lost."""

    def __init__(self, bootstrap: str) -> None:
        self.failed: list[str] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 500_000,
                "enable.idempotence": True,
                "logger": LIBRDKAFKA_LOG,  # "coordinator load in progress" while Kafka warms up
            }
        )

    def send(self, topic: str, partition: int, millis: int, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value, partition=partition, timestamp=millis, on_delivery=self._sent
                )
                return
            except BufferError:
                self.producer.poll(0.1)

    def close(self) -> None:
        if self.producer.flush(120) or self.failed:
            raise BenchError(f"producing failed: {self.failed[:3] or 'records left unsent'}")

    def _sent(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))


def produce_day(bootstrap: str, topic: str, day: date, args: argparse.Namespace) -> tuple[int, int]:
    """Every run's records, in Kafka time order per partition; returns (records filed under
    `day`, of which late)."""
    k = args.per_run_partition
    run_ms = RUN // timedelta(milliseconds=1) // args.runs
    start = midnight(day)
    cutoff = completeness.cutoff(day, UTC, timedelta(hours=1))
    # late records only where an earlier hour of the date exists (23 hours of 24)
    late_p = min(1.0, args.late_fraction * 24 / 23)
    rng = random.Random(args.seed)
    producer = TimedProducer(bootstrap)
    n = late = 0
    with progress_bars() as progress:
        task = progress.add_task("producing the date", total=args.runs * args.partitions * k)
        for r in range(args.runs):
            for p in range(args.partitions):
                for i in range(k):
                    if r == args.runs - 1 and i >= k - CLOSING:  # past the cutoff: closes D
                        at = cutoff + timedelta(minutes=1, seconds=i)
                        producer.send(topic, p, _millis(at), event_value(n, at, rng))
                        n += 1
                        continue
                    at = start + timedelta(milliseconds=r * run_ms + i * run_ms // k)
                    since = (at - start).total_seconds()
                    if since >= 3600 and rng.random() < late_p:
                        back = rng.uniform(3600, min(args.late_hours * 3600, since))
                        happened = at - timedelta(seconds=back)
                        late += 1
                    else:
                        happened = max(start, at - timedelta(seconds=rng.expovariate(1 / 30)))
                    producer.send(topic, p, _millis(at), event_value(n, happened, rng))
                    n += 1
                progress.advance(task, k)
        producer.close()
    return n - CLOSING * args.partitions, late


def build_day(
    args: argparse.Namespace, cfg, storage: Storage, kafka: KafkaConf, day: date
) -> float:
    """The date's runs, each as the archive DAG runs it (the in-process writer stages the
    records); checks that D becomes complete at the last run and not before. Returns their wall
    time."""
    start = time.perf_counter()
    with progress_bars() as progress:
        task = progress.add_task("archive runs", total=args.runs)
        for r in range(args.runs):
            history_run(cfg, storage, kafka)
            progress.advance(task)
            through = completeness.load_state(storage, cfg.topic).through
            if r < args.runs - 1 and through is not None and through >= day:
                raise BenchError(f"{day} was complete after run {r + 1} of {args.runs}")
    if (through := completeness.load_state(storage, cfg.topic).through) is None or through < day:
        raise BenchError(f"{day} is not complete after its last run (through {through})")
    return time.perf_counter() - start


def date_keys(storage: Storage, files: list[DataFile]) -> dict[str, np.ndarray]:
    """Per folder, the sorted `partition << 40 | offset` of every record its files hold (only
    those two fields are decoded)."""
    found: dict[str, array] = defaultdict(lambda: array("q"))
    for f in files:
        with storage.open_read(f.key) as data:
            writer = json.loads(read_header(data).schema)
            data.seek(0)
            fields = [{"name": n, "type": "long"} for n in ("_kafka_partition", "_kafka_offset")]
            reader = {"type": "record", "name": writer["name"], "fields": fields}
            if "namespace" in writer:
                reader["namespace"] = writer["namespace"]
            keys = found[f.folder]
            for r in fastavro.reader(data, reader_schema=reader):
                keys.append(r["_kafka_partition"] << 40 | r["_kafka_offset"])
    return {folder: np.sort(np.frombuffer(keys, dtype=np.int64)) for folder, keys in found.items()}


def same_records(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    if sorted(before) != sorted(after):
        raise BenchError(f"folders differ: {sorted(set(before) ^ set(after))[:5]}")
    for folder, keys in before.items():
        if not np.array_equal(keys, after[folder]):
            raise BenchError(
                f"{folder}: {len(keys):,} records before sealing, {len(after[folder]):,} after, "
                "or other (partition, offset)"
            )


# --- the seal ---------------------------------------------------------------------------------


@dataclass
class Sealing:
    select_seconds: float
    job_seconds: float
    job_cpu_seconds: float
    finish_seconds: float
    total_seconds: float
    files_after: int
    bytes_after: int
    table_files: int
    table_records: int
    proof_records: int
    target_mb: int
    task_seconds: list[float]
    peak_rss_mb: dict[str, int]
    command: str


def seal_date(
    args: argparse.Namespace,
    work: Path,
    cfg,
    topics: Path,
    storage: Storage,
    catalog: catalogs.Catalog,
    day: date,
    expected: int,
    server: Server | None = None,
) -> tuple[Sealing, seal.Selection, Peaks, list[float]]:
    """Select, the seal job through spark-submit (or as the Airflow task runs it on `server`, a
    Spark Connect server), finish_seal: as the seal DAG runs them."""
    t = time.perf_counter()
    target = iceberg.target(catalog, cfg.topic)
    chosen = seal.select(storage, cfg, day, f"bench-{uuid.uuid4().hex[:6]}", target)
    select_s = time.perf_counter() - t
    if chosen is None:
        raise BenchError(f"select found nothing to seal in {day}")
    job = SealInput(
        topic=cfg.snapshot(),
        claim=chosen.claim.key,
        storage_options=storage.options,
        artifact=code_artifact().name,
        table_options=iceberg.storage_options(catalog),
        table_location=chosen.table.location if chosen.table else None,
    )
    argv, tasks, also = submit_argv(JOB, [], args.driver_memory), len(chosen.folders), ()
    if server is not None:  # its tasks show in the server's log, not in this one
        argv, tasks, also = connect_argv(server.url), 0, server.processes()
    log = work / "seal.log"
    load = [os.getloadavg()[0]]
    job_s, peaks = spark_submit(
        argv,
        tasks,
        log,
        args.timeout,
        label="sealing (Spark Connect)" if server else "sealing (spark-submit)",
        also=also,
        env=to_env(job),
    )
    load.append(os.getloadavg()[0])
    with console.status("finish_seal: commit, table snapshot, proof"):
        t = time.perf_counter()
        proof = seal.finish_seal(storage, cfg, chosen, iceberg.catalog_of(catalog))
        finish_s = time.perf_counter() - t
    console.print(f"sealed {day}: select {select_s:.2f}s, job {job_s:.1f}s, finish {finish_s:.2f}s")

    if (proof.partitioned, proof.quarantined) != (expected, 0):
        raise BenchError(f"the proof counts {proof.partitioned} records, not {expected}")
    table = iceberg.catalog_of(catalog).load_table(target.identifier)
    in_table = iceberg.date_records(table, day)
    if not proof.table_records == in_table == proof.partitioned:
        raise BenchError(f"the table holds {in_table} records of {day}, the proof counts {proof}")
    after = day_files(storage, cfg.topic, cfg.path_format, day)
    if not all(f.sealed for f in after):
        raise BenchError(f"unsealed files left in {day}: {[f.key for f in after][:3]}")
    target_bytes = cfg.seal_target_file_mb * 2**20
    for folder in chosen.folders:
        size = sum(i.bytes for i in folder.inputs)
        files = [f for f in after if f.folder == folder.folder]
        if len(files) > max(1, math.ceil(size / target_bytes)):
            raise BenchError(f"{folder.folder}: {len(files)} files for {size:,} bytes")
    shown = [shlex.quote(a) for a in argv]
    if server is not None:
        shown[2] = "<the job's run() on a session of the server>"
    else:
        shown[argv.index("--jars") + 1] = "<.cairn/jars/spark/*.jar, comma-separated>"
    return (
        Sealing(
            select_seconds=round(select_s, 3),
            job_seconds=round(job_s, 2),
            job_cpu_seconds=round(peaks.cpu_seconds, 1),
            finish_seconds=round(finish_s, 3),
            total_seconds=round(select_s + job_s + finish_s, 2),
            files_after=len(after),
            bytes_after=sum(storage.size(f.key) for f in after),
            table_files=len(seal.table_files(storage, chosen)),
            table_records=in_table,
            proof_records=proof.partitioned,
            target_mb=cfg.seal_target_file_mb,
            task_seconds=sorted(task_seconds(log)),
            peak_rss_mb={role: round(rss / 2**20) for role, rss in peaks.roles.items()}
            | {"total": round(peaks.total / 2**20)},
            command="CAIRN_TABLE_OPTIONS='{}' " + " ".join(shown),
        ),
        chosen,
        peaks,
        load,
    )


def plain_spark(
    args: argparse.Namespace, work: Path, unsealed: Path, day: date, folders: int, records: int
) -> list[PeerRun]:
    """Plain Spark's rewrite of the unsealed copy: Avro only, then Avro and Parquet."""
    runs = []
    for name, parquet in (("plain Spark: Avro", False), ("plain Spark: Avro + Parquet", True)):
        out = work / f"plain-{len(runs)}"
        job = ["rewrite", "--input", str(unsealed), "--output", str(out / "avro")]
        if parquet:
            job += ["--parquet", str(out / "parquet"), "--date", day.isoformat()]
        argv = submit_argv(PEERS, job, args.driver_memory)
        log = work / f"plain-{len(runs)}.log"
        seconds, peaks = spark_submit(argv, 0, log, args.timeout, job=PEERS, label=f"peer: {name}")
        for kind in ("avro", "parquet") if parquet else ("avro",):
            written = list((out / kind).glob(f"hr=*/part-*.{kind}"))
            if len(written) != folders:
                raise BenchError(f"{name} wrote {len(written)} {kind} files, not {folders}")
        shown = [shlex.quote(a) for a in argv]
        shown[argv.index("--jars") + 1] = "<jars>"
        runs.append(
            PeerRun(
                name=name,
                seconds=round(seconds, 2),
                rounds_seconds=[round(seconds, 2)],
                records_per_second=round(records / seconds),
                peak_rss_mb=round(peaks.total / 2**20),
                cpu_seconds=round(peaks.cpu_seconds, 1),
                command=" ".join(shown),
            )
        )
        console.print(f"{name}: {seconds:.1f}s")
    return runs


# --- day-scan queries -------------------------------------------------------------------------


@dataclass
class Scan:
    rounds: int
    seconds: dict[str, dict[str, list[float]]]
    """Per source (unsealed, sealed, table) and query (count, group_by_action): every round."""
    best: dict[str, dict[str, float]]
    answers: dict[str, dict[str, dict]]


def scan_day(
    args: argparse.Namespace,
    work: Path,
    unsealed: Path,
    sealed: Path,
    catalog: catalogs.Catalog,
    topic: str,
    day: date,
    expected: int,
) -> Scan:
    job = [
        *["scan", "--folder", f"unsealed={unsealed}", "--folder", f"sealed={sealed}"],
        *["--table", catalogs.spark_table(catalog, topic), "--date", day.isoformat()],
        *["--rounds", str(args.scan_rounds)],
    ]
    log = work / "scan.log"
    env = {"CAIRN_BENCH_SPARK_CONF": json.dumps(catalogs.spark_conf(catalog))}
    argv = submit_argv(PEERS, job, args.driver_memory)
    spark_submit(argv, 0, log, args.timeout, job=PEERS, label="day-scan queries", env=env)
    line = next(x for x in log.read_text().splitlines() if x.startswith("RESULT "))
    found = json.loads(line.removeprefix("RESULT "))
    answers = found["answers"]
    if any(a != answers["unsealed"] for a in answers.values()):
        raise BenchError(f"the sources answer differently: {answers}")
    if answers["unsealed"]["count"]["rows"] != expected:
        raise BenchError(f"count(*) is {answers['unsealed']['count']}, not {expected}")
    seconds = found["seconds"]
    best = {s: {q: min(t) for q, t in by.items()} for s, by in seconds.items()}
    return Scan(rounds=args.scan_rounds, seconds=seconds, best=best, answers=answers)


# --- S3 requests per seal ---------------------------------------------------------------------


@dataclass
class SealRequests:
    date: str
    sealed_before: int
    steps: dict[str, dict[str, int]]
    """Per step (select, seal job, finish), the S3 requests by type."""
    table: dict[str, int]
    """The table after the seal: metadata file bytes, files in its metadata folder, snapshots,
    manifests, offset index bytes."""

    @property
    def total(self) -> int:
        return sum(sum(by.values()) for by in self.steps.values())


def requests_per_seal(
    args: argparse.Namespace, work: Path, bootstrap: str, postgres: StackSettings
) -> list[SealRequests]:
    """Archive and seal small dates one after the other on a private S3; each seal's requests."""
    sys.path.insert(0, str(REPO))  # the Spark job's module, as the tests import it
    dates = args.sealed_history + args.measured
    found = []
    with contextlib.ExitStack() as stack:
        options, s3 = private_s3(work / "seaweedfs", stack)
        spark = stack.enter_context(local_spark())
        metrics = f"http://{s3.host}:{s3.seaweed_metrics_port}/metrics"
        reach = s3.model_copy(update={"postgres_port": postgres.postgres_port})
        warehouse = f"s3://{s3.bucket}/bench-warehouse"
        catalog = services.iceberg_catalog(reach, warehouse, name="requests")
        topic = f"bench.sealed-{uuid.uuid4().hex[:6]}"
        create_kept_topic(bootstrap, topic, args.partitions)
        if args.bootstrap_servers:
            stack.callback(delete_topic, bootstrap, topic)
        root = f"s3://{s3.s3_conn_id}@{s3.bucket}/bench"
        cfg = topic_config(
            work / "requests.yaml", topic, root, table_snapshot_age=args.snapshot_age
        )
        storage = Storage(cfg.root.storage_url, **options)
        kafka = KafkaConf.from_bootstrap(bootstrap, "the benchmark's broker")
        first = datetime.now(UTC).date() - timedelta(days=dates + 3)
        producer = TimedProducer(bootstrap)
        rng = random.Random(args.seed)
        with progress_bars() as progress:
            task = progress.add_task("archiving and sealing small dates", total=dates)
            for i in range(dates):
                day = first + timedelta(days=i)
                for n in range(args.date_records):
                    at = midnight(day) + timedelta(seconds=(n + 0.5) * 86400 / args.date_records)
                    producer.send(topic, n % args.partitions, _millis(at), event_value(n, at, rng))
                producer.close()
                history_run(cfg, storage, kafka)
                shown = i < args.measured or i >= args.sealed_history  # the rest: history
                job = spark_seal(spark) if shown else history_seal
                proof, steps = counted_seal(storage, cfg, catalog, day, job, options, metrics)
                if not proof.partitioned == proof.table_records == args.date_records:
                    raise BenchError(f"{day}: sealed {proof.partitioned} records")
                found.append(
                    SealRequests(
                        date=day.isoformat(),
                        sealed_before=i,
                        steps={s: dict(sorted(c.items())) for s, c in steps.items()},
                        table=table_size(catalog, cfg.topic),
                    )
                )
                progress.advance(task)
    return found


def table_size(catalog: catalogs.Catalog, topic: str) -> dict[str, int]:
    """What the table's metadata holds now (`SealRequests.table`)."""
    where = iceberg.target(catalog, topic)
    table = iceberg.catalog_of(catalog).load_table(where.identifier)
    index = table.properties.get(offset_index.POINTER)
    return {
        "metadata bytes": len(table.io.new_input(table.metadata_location)),
        "metadata files": len(iceberg.table_storage(catalog, where).list("metadata/")),
        "snapshots": len(table.snapshots()),
        "manifests": len(table.current_snapshot().manifests(table.io)),
        "index bytes": len(table.io.new_input(index)) if index else 0,
    }


SealJob = Callable[[seal.Selection, Any, dict, dict], str]
"""A seal's job: (chosen, cfg, options, table options) → its manifest's key."""


def spark_seal(spark) -> SealJob:
    """The seal job on `spark`, as the seal DAG runs it."""
    from spark_jobs.seal import seal as seal_job

    return lambda chosen, cfg, options, table_options: seal_job(
        spark, chosen, cfg, options, table_options
    )


def history_seal(chosen: seal.Selection, cfg, options: dict, table_options: dict) -> str:
    """What the seal job's tasks and driver do, in this process and without Spark: for the
    history between the measured seals (as `history_run` archives), so a long history costs no
    Spark job per date. The files, manifest and table commit are the job's own."""
    storage = Storage(cfg.root.storage_url, **options)
    staged = commit.staged(storage, chosen.claim)
    table = Storage(chosen.table.location, **table_options) if chosen.table else None
    results = [
        seal_folder(chosen, index, cfg.codec, storage, staged, table)
        for index in range(len(chosen.folders))
    ]
    return seal.save_attempt(storage, chosen, results)


def counted_seal(
    storage: Storage,
    cfg,
    catalog: catalogs.Catalog,
    day: date,
    job: SealJob,
    options: dict,
    metrics: str,
) -> tuple[Proof, dict[str, Counter]]:
    """One seal of `day` as the seal DAG runs it, its job `job`; the S3 requests that SeaweedFS
    answered during each step."""
    step, counts = counting(metrics)

    def select() -> seal.Selection | None:  # the DAG's select task finds the table first
        return seal.select(storage, cfg, day, f"seal-{day}", iceberg.target(catalog, cfg.topic))

    chosen = step("select", select)
    if chosen is None:
        raise BenchError(f"select found nothing to seal in {day}")
    table_options = iceberg.storage_options(catalog)
    step("seal job", lambda: job(chosen, cfg, options, table_options))
    found = iceberg.catalog_of(catalog)
    return step("finish", lambda: seal.finish_seal(storage, cfg, chosen, found)), counts


# --- a profile of one folder ------------------------------------------------------------------


def profile_folder(chosen: seal.Selection, unsealed_root: Path, work: Path, codec: str) -> str:
    """cProfile of `seal_folder` on the largest folder, in this process, on the unsealed copy."""
    index = max(range(len(chosen.folders)), key=lambda i: len(chosen.folders[i].inputs))
    folder = chosen.folders[index]
    staged, table = work / "profile-staged", work / "profile-table"
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    result = seal_folder(
        chosen,
        index,
        codec,
        Storage(unsealed_root.as_uri()),
        Storage(staged.as_uri()),
        Storage(table.as_uri()),
    )
    profiler.disable()
    seconds = time.perf_counter() - start
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    head = (
        f"seal_folder on {folder.folder}: {len(folder.inputs)} files, "
        f"{result.records_read:,} records in {seconds:.2f} s (under cProfile)\n"
    )
    return head + out.getvalue()


# --- the whole benchmark ----------------------------------------------------------------------


@dataclass
class Result:
    day: Day
    sealing: Sealing
    peers: list[PeerRun]
    scan: Scan | None
    requests: list[SealRequests]
    measured: int
    """Seals shown at the start and at the end of `requests`."""
    profile: str | None
    job: JobRun
    ratios: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def local_spark() -> Iterator:
    """A SparkSession in this process on the stack's master, with the stack's jars: the
    requests part's seal jobs (started after the measured spark-submits)."""
    from pyspark.sql import SparkSession

    jars = sorted(str(p) for p in services.jars(StackSettings(), "spark").glob("*.jar"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(StackSettings().spark_master)
        .appName("cairn-seal-bench")
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    with console.status("starting a local SparkSession in this process"):
        spark = builder.getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def private_postgres(state_dir: Path) -> Iterator[StackSettings]:
    """The stack's PostgreSQL (Airflow's and the Iceberg catalog's databases) on a free port."""
    (port,) = free_port_block(1)
    settings = StackSettings(state_dir=state_dir, postgres_port=port)
    service = services.postgres(settings)
    with console.status("starting a private PostgreSQL (the Iceberg catalog)"):
        service.start(settings.start_timeout)
    try:
        yield settings
    finally:
        service.stop()


def benchmark(args: argparse.Namespace, work: Path) -> Result:
    commit = git_commit()  # before the run: others may commit while it goes
    day = datetime.now(UTC).date() - timedelta(days=3)
    args.per_run_partition = math.ceil(
        (args.records + CLOSING * args.partitions) / (args.runs * args.partitions)
    )
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(private_kafka(work / "kafka"))
        postgres = stack.enter_context(private_postgres(work / "postgres"))
        warehouse = work / "warehouse"
        warehouse.mkdir()
        catalog = services.iceberg_catalog(postgres, warehouse.as_uri(), name="bench")

        topic = f"bench.day-{uuid.uuid4().hex[:8]}"
        create_kept_topic(bootstrap, topic, args.partitions)
        if args.bootstrap_servers:
            stack.callback(delete_topic, bootstrap, topic)
        topics = work / "topics.yaml"
        cfg = topic_config(
            topics,
            topic,
            (work / "archive").as_uri(),
            max_records_per_partition=args.per_run_partition,  # a run reads its 10 minutes
        )
        storage = Storage(cfg.root.storage_url)
        kafka = KafkaConf.from_bootstrap(bootstrap, "the benchmark's broker")

        t = time.perf_counter()
        in_day, late = produce_day(bootstrap, topic, day, args)
        produce_s = time.perf_counter() - t
        console.print(f"produced {in_day:,} records of {day} ({late:,} late) in {produce_s:.1f}s")
        build_s = build_day(args, cfg, storage, kafka, day)
        console.print(f"{args.runs} archive runs in {build_s:.1f}s")

        before = day_files(storage, topic, cfg.path_format, day)
        folder = kind_folder("partitioned", topic, date_folder(cfg.path_format, day))
        unsealed_root = work / "unsealed"
        unsealed = unsealed_root / folder
        with console.status("copying the date aside and reading its records"):
            shutil.copytree(work / "archive" / folder, unsealed)
            keys = date_keys(storage, before)
        if (held := sum(len(k) for k in keys.values())) != in_day:
            raise BenchError(f"{day} holds {held:,} records after its runs, not {in_day:,}")
        built = Day(
            date=day.isoformat(),
            records=in_day,
            late=late,
            runs=args.runs,
            partitions=args.partitions,
            records_per_run_partition=args.per_run_partition,
            files=len(before),
            folders=len(keys),
            bytes=sum(storage.size(f.key) for f in before),
            produce_seconds=round(produce_s, 1),
            build_seconds=round(build_s, 1),
        )

        sealing, chosen, peaks, load = seal_date(
            args, work, cfg, topics, storage, catalog, day, in_day
        )
        with console.status("checking the sealed date record by record"):
            same_records(keys, date_keys(storage, day_files(storage, topic, cfg.path_format, day)))
        peers = [] if args.skip_peers else plain_spark(args, work, unsealed, day, len(keys), in_day)
        scan = None
        if not args.skip_scan:
            sealed = work / "archive" / folder
            scan = scan_day(args, work, unsealed, sealed, catalog, topic, day, in_day)
        profile = None
        if args.profile:
            with console.status("profiling seal_folder on the largest folder"):
                profile = profile_folder(chosen, unsealed_root, work, cfg.codec)
        requests = [] if args.skip_requests else requests_per_seal(args, work, bootstrap, postgres)

    ratios = {}
    for peer in peers:
        ratios[f"seal / {peer.name}"] = round(sealing.total_seconds / peer.seconds, 2)
        ratios[f"seal job / {peer.name}"] = round(sealing.job_seconds / peer.seconds, 2)
        ratios[f"seal job CPU / {peer.name}"] = round(sealing.job_cpu_seconds / peer.cpu_seconds, 2)
    if scan is not None:
        for query in ("count", "group_by_action"):
            for source in ("sealed", "table"):
                unsealed_s = scan.best["unsealed"][query]
                ratios[f"{query}: unsealed / {source}"] = round(
                    unsealed_s / scan.best[source][query], 2
                )
    job = JobRun.finished(peaks, args, commit, load, sealing.command, [])
    return Result(
        day=built,
        sealing=sealing,
        peers=peers,
        scan=scan,
        requests=requests,
        measured=args.measured,
        profile=profile,
        job=job,
        ratios=ratios,
    )


def print_result(r: Result) -> None:
    d, s = r.day, r.sealing
    mb = s.peak_rss_mb
    tasks = s.task_seconds
    rows = [
        (
            "date",
            f"{d.date}: {d.records:,} records ({d.late:,} late, {d.late / d.records:.1%}) from "
            f"{d.runs} runs over {d.partitions} partitions",
        ),
        ("files before", f"{d.files:,} in {d.folders} hour folders, {d.bytes / 2**20:,.1f} MB"),
        (
            "files after",
            f"{s.files_after:,} sealed ({s.bytes_after / 2**20:,.1f} MB; at most "
            f"ceil(bytes / {s.target_mb} MB) per folder) + {s.table_files} Parquet table files",
        ),
        ("building", f"produce {d.produce_seconds:.0f} s, {d.runs} runs {d.build_seconds:.0f} s"),
        (
            "seal",
            f"{s.total_seconds:.1f} s = select {s.select_seconds:.2f} + job {s.job_seconds:.1f} "
            f"(spark-submit to exit, {StackSettings().spark_master}) + finish_seal "
            f"{s.finish_seconds:.2f}; the job's CPU {s.job_cpu_seconds:.0f} s",
        ),
        (
            "seal job tasks",
            f"{len(tasks)} (one per folder): {min(tasks):.1f}–{max(tasks):.1f} s, "
            f"sum {sum(tasks):.0f} s"
            if tasks
            else "none found in the log",
        ),
        (
            "seal job peak RSS",
            f"{mb['total']:,} MB: JVM {mb['jvm']:,}, Python driver {mb['python driver']:,}, "
            f"workers {mb['python workers']:,} (driver memory {r.job.driver_memory})",
        ),
        (
            "checks",
            f"each hour folder holds the same {d.records:,} (partition, offset); table "
            f"{s.table_records:,} = proof {s.proof_records:,}",
        ),
    ]
    for peer in r.peers:
        rows.append(
            (
                peer.name,
                f"{peer.seconds:.1f} s (spark-submit to exit), CPU {peer.cpu_seconds:.0f} s, "
                f"peak RSS {peer.peak_rss_mb:,} MB",
            )
        )
        rows.append(
            (
                "  seal / it",
                f"{r.ratios[f'seal / {peer.name}']:.2f}x "
                f"(the job alone {r.ratios[f'seal job / {peer.name}']:.2f}x; its CPU "
                f"{r.ratios[f'seal job CPU / {peer.name}']:.2f}x)",
            )
        )
    if r.scan is not None:
        for query, label in (("count", "count(*)"), ("group_by_action", "GROUP BY action")):
            best = r.scan.best
            cells = ", ".join(
                f"{src} {best[src][query]:.2f} s" for src in ("unsealed", "sealed", "table")
            )
            rows.append(
                (
                    f"scan {label}",
                    f"{cells} (best of {r.scan.rounds}); unsealed / sealed "
                    f"{r.ratios[f'{query}: unsealed / sealed']:.1f}x, unsealed / table "
                    f"{r.ratios[f'{query}: unsealed / table']:.1f}x",
                )
            )
    if r.requests:
        m = r.measured
        shown = [*r.requests[:m], *r.requests[-m:]] if len(r.requests) > 2 * m else r.requests
        for q in shown:
            steps = ", ".join(f"{name} {sum(by.values())}" for name, by in q.steps.items())
            kinds = Counter()
            for by in q.steps.values():
                kinds.update(by)
            types = " ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
            rows.append(
                (
                    f"S3 requests, seal {q.sealed_before + 1}",
                    f"{q.total} ({steps}; {types}) after {q.sealed_before} sealed dates",
                )
            )
            rows.append(("  table after it", ", ".join(f"{k} {v:,}" for k, v in q.table.items())))
    print_rows("Cairn seal of one date", rows, r.job)
    if r.profile:
        print(r.profile)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="in the sealed date")
    parser.add_argument("--runs", type=int, default=144, help="archive runs over the date")
    parser.add_argument("--late-fraction", type=float, default=0.05)
    parser.add_argument(
        "--late-hours", type=float, default=6, help="late records are 1 to this many hours late"
    )
    parser.add_argument("--scan-rounds", type=int, default=3)
    parser.add_argument("--sealed-history", type=int, default=30, help="dates sealed before")
    parser.add_argument(
        "--measured", type=int, default=3, help="seals measured at the start and the end"
    )
    parser.add_argument("--date-records", type=int, default=400, help="of each small date")
    parser.add_argument(
        "--snapshot-age", default="7d", help="the small dates' topic's table_snapshot_age"
    )
    parser.add_argument("--skip-peers", action="store_true", help="no plain Spark")
    parser.add_argument("--skip-scan", action="store_true", help="no day-scan queries")
    parser.add_argument("--skip-requests", action="store_true", help="no S3 requests per seal")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile seal_folder on the largest folder"
    )
    add_common_options(parser)
    args = parser.parse_args()
    if args.connect:
        parser.error("--connect: the seal job runs through spark-submit here")
    if args.late_hours < 1:
        parser.error("--late-hours must be at least 1")
    return args


def main() -> int:
    return run_benchmark(benchmark, print_result, parse_args(), "cairn-seal-bench-")


def _millis(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


if __name__ == "__main__":
    sys.exit(main())
