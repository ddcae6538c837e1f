"""Rebuild time of ONE day of parsed output from the backup, and how many backup files it reads.

Archives a history of `--days` days into a fresh 4-partition topic, day by day, each with its own
archive runs (plan, clean, the real Spark archive job through spark-submit, verify, commit — the
functions of `archive_throughput.py`): `--records` records for the day that is rebuilt (the
middle one) and `--other-records` for every other day. A day's records have event times on that
day, except `--late-fraction` (1%) that are late: event times on the day before. Then rebuilds
the middle day as the rebuild DAG does: `cairn.pipeline.rebuild.select` (timed; it finds the backup
files holding the day's records from the day's files' Avro headers and claims a rebuild attempt),
the real rebuild job (`spark_jobs/main.py` with its `RebuildInput`) through spark-submit (timed,
peak RSS sampled),
commits as the DAG's commit task does (`cairn.pipeline.rebuild.commit_rebuild`), and checks
that the day's folders hold exactly the records with that event date, once each.

    .venv/bin/python benchmarks/rebuild_day.py                        # 10 days, 1M rebuilt
    .venv/bin/python benchmarks/rebuild_day.py --days 3 --records 20000 --other-records 5000

A private Kafka is started and stopped unless `--bootstrap-servers` names a running one; the
rest lives in a temporary folder, removed afterwards (kept when the run fails or with `--keep`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import fastavro
from archive_throughput import (
    JOB,
    BenchError,
    JobRun,
    add_common_options,
    archive_input,
    console,
    delete_topic,
    event_lines,
    git_commit,
    plan_and_clean,
    print_rows,
    private_kafka,
    produce,
    run_benchmark,
    spark_submit,
    submit_argv,
    topics_file,
)

from cairn.config import TopicConfig
from cairn.datafiles.file_entry import FileEntry
from cairn.jobs import RebuildInput, to_env
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import archive_run, rebuild
from cairn.protocol import manifest, tokens
from cairn.storage.objects import Storage
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack.demo import create_topic
from cairn_stack.settings import StackSettings

FIRST_DAY = date(2025, 1, 1)  # fixed, so the folders are the same every run


@dataclass
class Result:
    day: str
    days: int
    runs_per_day: int
    partitions: int
    records_in_day: int
    """Records whose event date is the day: its on-time records plus the next day's late ones."""
    records_produced: dict[str, int]
    backup_files_read: int
    backup_files_total: int
    backup_records_read: int
    backup_records_total: int
    select_seconds: float
    spark_seconds: float
    records_per_second: float
    """Records of the day written per second of the Spark rebuild job's wall time."""
    backup_records_per_second: float
    """Records of the chosen backup files read per second of the Spark rebuild job's wall time
    (each task reads its whole backup file and re-parses only the records filed in the day)."""
    files_written: int
    files_removed: int
    files_in_day_before: int
    check_seconds: float
    archive_seconds: float
    """All archive runs (produce + plan/clean/Spark/verify/commit) of the history."""
    archive_runs: int
    job: JobRun


# --- the history -----------------------------------------------------------------------------


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def archive_once(
    cfg: TopicConfig,
    storage: Storage,
    bootstrap: str,
    topics: Path,
    expected: int,
    args: argparse.Namespace,
    log: Path,
) -> float:
    """One archive run as the archive DAG does it; returns the Spark job's wall time."""
    planned = plan_and_clean(cfg, storage, bootstrap)
    argv = submit_argv(JOB, [], args.driver_memory)
    env = archive_input(cfg, planned, bootstrap)
    seconds, _ = spark_submit(argv, len(planned.plan.to_read), log, args.timeout, env=env)
    report = archive_run.verify_run(storage, planned)
    counts = archive_run.commit_run(
        cfg, storage, planned, report, KafkaConf.from_bootstrap(bootstrap)
    ).counts
    if (counts.read, counts.backup, counts.partitioned) != (expected,) * 3:
        raise BenchError(f"archive run committed {counts}, expected {expected} records; see {log}")
    return seconds


def archive_history(
    args: argparse.Namespace,
    work: Path,
    bootstrap: str,
    topic: str,
    cfg: TopicConfig,
    storage: Storage,
    topics: Path,
    target: int,
) -> tuple[dict[date, tuple[int, int]], int]:
    """Produce and archive every day; returns {day: (on-time, late)} and the number of runs."""
    produced: dict[date, tuple[int, int]] = {}
    total = runs = 0
    for k in range(args.days):
        day = FIRST_DAY + timedelta(days=k)
        n = args.records if k == target else args.other_records
        late = round(n * args.late_fraction)
        produced[day] = (n - late, late)
        on_time_file, late_file = work / f"on-time-{day}.jsonl", work / f"late-{day}.jsonl"
        seed = args.seed + 2 * k
        end = midnight(day + timedelta(days=1))
        on_time_file.write_bytes(b"\n".join(event_lines(args.payloads, 24, seed, end)))
        late_lines = event_lines(max(args.payloads // 100, 10), 24, seed + 1, midnight(day))
        late_file.write_bytes(b"\n".join(late_lines))
        for r, (a, b) in enumerate(
            zip(split(n - late, args.runs_per_day), split(late, args.runs_per_day), strict=True)
        ):
            for count, payload in ((a, on_time_file), (b, late_file)):
                if count:
                    produce(bootstrap, topic, count, payload, work / "producer.log")
            total += a + b
            in_kafka = cluster.fetch_watermarks(KafkaConf.from_bootstrap(bootstrap), topic)
            if (held := sum(w.high - w.low for w in in_kafka.values())) != total:
                raise BenchError(f"{topic} holds {held} records, not {total}")
            log = work / f"archive-{day}-{r}.log"
            spark_s = archive_once(cfg, storage, bootstrap, topics, a + b, args, log)
            runs += 1
            console.print(
                f"day {day} run {r + 1}/{args.runs_per_day}: archived {a + b:,} records "
                f"({b:,} late) in {spark_s:.1f}s"
            )
    return produced, runs


# --- the rebuild -----------------------------------------------------------------------------


def rebuild_input(cfg: TopicConfig, selection: rebuild.Selection) -> dict[str, str]:
    """The rebuild job's input as the Airflow operator gives it: the topic's entry and the key
    of the claim that holds the selection."""
    job = RebuildInput(
        topic=cfg.snapshot(), claim=selection.claim.key, artifact=code_artifact().name
    )
    return to_env(job)


def committed_backups(storage: Storage, topic: str, upto_seq: int) -> list[FileEntry]:
    """The backup files of the runs committed up to token `upto_seq` (the rebuild's snapshot)."""
    return [
        e
        for token in tokens.list_tokens(storage, topic)
        if token.seq <= upto_seq and token.kind == "archive" and token.manifest is not None
        for e in manifest.load(storage, token.manifest).files
        if e.kind == "backup"
    ]


def day_files(storage: Storage, topic: str, day: date) -> tuple[list[str], list[str]]:
    """Keys of the day's partitioned files and quarantine files."""
    partitioned = [k for k in storage.list(f"partitioned/{topic}/dt={day}/") if k.endswith(".avro")]
    return partitioned, storage.list(f"quarantine/{topic}/dt={day}/")


def count_records(storage: Storage, keys: list[str]) -> tuple[int, int]:
    """Records in the files by their Avro block counts, and how many distinct Kafka
    (partition, offset) they hold (read record by record)."""
    blocks = 0
    seen: set[tuple[int, int]] = set()
    for key in keys:
        with storage.open_read(key) as f:
            blocks += sum(b.num_records for b in fastavro.block_reader(f))
        with storage.open_read(key) as f:
            seen.update((r["_kafka_partition"], r["_kafka_offset"]) for r in fastavro.reader(f))
    return blocks, len(seen)


# --- the whole benchmark ---------------------------------------------------------------------


def benchmark(args: argparse.Namespace, work: Path) -> Result:
    notes: list[str] = []
    commit = git_commit()
    target = args.days // 2
    day = FIRST_DAY + timedelta(days=target)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(private_kafka(work / "stack"))
        topic = f"bench.events-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        if args.bootstrap_servers:
            stack.callback(delete_topic, bootstrap, topic)
        topics = work / "topics.yaml"
        cap = max(args.records, args.other_records)
        cfg = topics_file(topics, topic, work / "archive", cap)
        storage = Storage(cfg.root.storage_url)

        t = time.perf_counter()
        produced, runs = archive_history(args, work, bootstrap, topic, cfg, storage, topics, target)
        archive_s = time.perf_counter() - t

    # Kafka is no longer needed: the rebuild reads the backup only.
    following = day + timedelta(days=1)
    in_day = produced[day][0] + (produced[following][1] if following in produced else 0)
    before, _ = day_files(storage, topic, day)
    with console.status("counting the day's records before the rebuild"):
        blocks, distinct = count_records(storage, before)
    if (blocks, distinct) != (in_day, in_day):
        raise BenchError(
            f"archive filed {blocks} records ({distinct} distinct) in {day}, not {in_day}"
        )

    t = time.perf_counter()
    selection = rebuild.select(storage, cfg, [day], f"bench-{uuid.uuid4().hex[:6]}")
    select_s = time.perf_counter() - t
    if selection is None:
        raise BenchError(f"select found nothing committed under {day}")
    backups = committed_backups(storage, topic, selection.claim.base_seq)
    spans = {e.key: e.last_offset - e.first_offset + 1 for e in backups}
    read_records = sum(spans[s.key] for s in selection.sources)
    console.print(
        f"select: {len(selection.sources)} of {len(backups)} backup files in {select_s:.2f}s"
    )

    argv = submit_argv(JOB, [], args.driver_memory, jars=False)  # no Kafka: no jars
    log = work / "rebuild.log"
    load = [os.getloadavg()[0]]
    spark_s, peaks = spark_submit(
        argv,
        len(selection.sources),
        log,
        args.timeout,
        label="rebuilding (spark-submit)",
        env=rebuild_input(cfg, selection),
    )
    load.append(os.getloadavg()[0])
    console.print(f"rebuild job finished in {spark_s:.1f}s")

    with console.status("committing and checking the rebuilt day"):
        t = time.perf_counter()
        token = rebuild.commit_rebuild(storage, cfg, selection)  # the rebuild DAG's commit task
        rebuilt = rebuild.load_attempt(storage, token.manifest)
        after, quarantined = day_files(storage, topic, day)
        blocks, distinct = count_records(storage, after)
        check_s = time.perf_counter() - t
    if (blocks, distinct) != (in_day, in_day):
        raise BenchError(
            f"rebuilt {day} holds {blocks} records ({distinct} distinct), not {in_day}"
        )
    if quarantined:
        raise BenchError(f"{len(quarantined)} quarantine files in {day} (expected none)")
    if odd := set(after) ^ {e.key for e in rebuilt.files}:
        raise BenchError(f"{day}'s files differ from the rebuild's, e.g. {sorted(odd)[:3]}")

    shown = [shlex.quote(a) for a in argv]
    return Result(
        day=str(day),
        days=args.days,
        runs_per_day=args.runs_per_day,
        partitions=args.partitions,
        records_in_day=in_day,
        records_produced={str(d): a + b for d, (a, b) in produced.items()},
        backup_files_read=len(selection.sources),
        backup_files_total=len(backups),
        backup_records_read=read_records,
        backup_records_total=sum(spans.values()),
        select_seconds=round(select_s, 4),
        spark_seconds=round(spark_s, 2),
        records_per_second=round(in_day / spark_s),
        backup_records_per_second=round(read_records / spark_s),
        files_written=len(rebuilt.files),
        files_removed=len(token.replaces),
        files_in_day_before=len(before),
        check_seconds=round(check_s, 1),
        archive_seconds=round(archive_s, 1),
        archive_runs=runs,
        job=JobRun.finished(peaks, args, commit, load, " ".join(shown), notes),
    )


def print_result(r: Result) -> None:
    rows = [
        ("day rebuilt", f"{r.day} (of {r.days} days, {r.runs_per_day} archive run(s) per day)"),
        ("records in day", f"{r.records_in_day:,} (checked: each once, none elsewhere)"),
        (
            "backup files read",
            f"{r.backup_files_read:,} / {r.backup_files_total:,} "
            f"({r.backup_records_read:,} / {r.backup_records_total:,} records)",
        ),
        ("select time", f"{r.select_seconds * 1000:,.0f} ms (cairn.pipeline.rebuild.select)"),
        (
            "Spark rebuild wall",
            f"{r.spark_seconds:.1f} s (spark-submit to exit, {StackSettings().spark_master})",
        ),
        (
            "throughput",
            f"{r.records_per_second:,} day records/s, "
            f"{r.backup_records_per_second:,} backup records read/s",
        ),
        ("peak RSS total", f"{r.job.peak_rss_total_mb:,} MB"),
        ("peak RSS JVM", f"{r.job.peak_rss_jvm_mb:,} MB (driver memory {r.job.driver_memory})"),
        (
            "peak RSS Python",
            f"{r.job.peak_rss_python_driver_mb:,} MB driver (rebuild.py), "
            f"{r.job.peak_rss_python_workers_mb:,} MB workers",
        ),
        (
            "files",
            f"{r.files_written:,} written, {r.files_removed:,} removed "
            f"({r.files_in_day_before:,} in the day before)",
        ),
        ("history archive", f"{r.archive_seconds:.0f} s for {r.archive_runs} runs (not above)"),
    ]
    print_rows("Cairn rebuild of one day", rows, r.job)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=10, help="days of history")
    parser.add_argument("--records", type=int, default=1_000_000, help="of the rebuilt day")
    parser.add_argument("--other-records", type=int, default=100_000, help="of each other day")
    parser.add_argument("--late-fraction", type=float, default=0.01, help="from the day before")
    parser.add_argument("--runs-per-day", type=int, default=1, help="archive runs per day")
    parser.add_argument("--payloads", type=int, default=10_000, help="distinct events per day")
    add_common_options(parser)
    return parser.parse_args()


def main() -> int:
    return run_benchmark(benchmark, print_result, parse_args(), "cairn-rebuild-bench-")


if __name__ == "__main__":
    sys.exit(main())
