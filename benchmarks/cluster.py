"""Archive and seal on a two-worker Spark standalone cluster beside local[4]; shipping the code.

Issue #29's numbers: on the same machine and the same data, in one sitting, Cairn's archive and
seal on a standalone cluster and on `local[4]`, and the one-time cost of shipping Cairn's code
to the cluster.

Every job runs as the Airflow task runs it on a `spark_connect` connection: a client process
runs `spark_jobs.main.run` with the job's typed input on `connect_session` (the session of the
code's version, to which it adds the code artifact). Two private Spark Connect servers run side
by side, set up as the stack sets up its own: one on `local[4]` (its tasks run in the server's
JVM, its Python workers on this venv), one on a private standalone cluster of a master and two
workers of 2 task slots each (`cairn_stack.cluster`: executors on .cairn/cluster-python, the
checkout hidden from every daemon). Both write to one private SeaweedFS: on a cluster the
archive root must be shared storage (`cairn.jobs.check_shared`).

1. **Archive**: `--records` JSON events (~304 bytes, `--partitions` 4) produced once with
   Kafka's ProducerPerformance; after a warm-up run of a small topic on each server, `--rounds`
   rounds, each archiving the whole topic on the local server then on the cluster, every run
   into a fresh prefix (plan, clean, the job, verify, commit: `archive_throughput.archive_round`).
2. **Seal**: a date of `--seal-records` built once by `--seal-runs` archive runs
   (`seal_day.py`'s date: the in-process writer), its root copied to a second prefix by
   server-side copies, then sealed once on each server (select, the job, finish_seal:
   `seal_day.seal_date`), each into its own table of a private Iceberg JDBC catalog
   (PostgreSQL) whose warehouse is on the same S3.
3. **Shipping the code**: on the cluster, `--rounds` times, `--ship-records` (spread over the
   partitions, so each run has tasks on both executors) archived by the first run of a new
   version of the code, by its second run, and by the version the sitting ran all along; which
   executors fetched the new version's artifact; the artifact's size and build time.

    .venv/bin/python benchmarks/cluster.py        # 1M records each, ~1 h on a quiet machine
    .venv/bin/python benchmarks/cluster.py --records 100000 --seal-records 50000 --rounds 1

Every service is private (free ports, state in a temporary folder) and stopped afterwards; the
folder is removed (kept when the run fails or with `--keep`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from archive_throughput import (
    BenchError,
    JobRun,
    Peaks,
    Round,
    Server,
    archive_round,
    console,
    event_lines,
    git_commit,
    print_rows,
    private_connect,
    private_kafka,
    produce,
    run_benchmark,
)
from requests_per_run import private_s3, topic_config
from rich.console import Console
from rich.table import Table
from seal_day import (
    CLOSING,
    Sealing,
    build_day,
    create_kept_topic,
    date_keys,
    private_postgres,
    produce_day,
    same_records,
    seal_date,
)

from cairn.kafka.connection import KafkaConf
from cairn.pipeline.rebuild import day_files
from cairn.storage.objects import Storage
from cairn_airflow import spark_artifact
from cairn_stack import cluster as standalone
from cairn_stack import demo, services
from cairn_stack.process import free_port_block
from cairn_stack.settings import StackSettings

LOCAL = "local[4]"
WORKERS, SLOTS = 2, 2
WARM_RECORDS = 20_000
"""The warm-up run's topic, as archive_throughput.py --connect warms its server."""
LATE_FRACTION, LATE_HOURS = 0.05, 6
"""The sealed date's late records, as seal_day.py's defaults."""
FETCHED = re.compile(r"INFO Executor: Fetching \S+/artifacts/([0-9a-f-]+)/pyfiles/")
SIDES = {"local": LOCAL, "cluster": f"standalone {WORKERS}x{SLOTS}"}
"""Where each side's tasks run: `local[4]`, or WORKERS workers of SLOTS task slots each."""


# --- the servers ------------------------------------------------------------------------------


@contextlib.contextmanager
def private_cluster(state_dir: Path) -> Iterator[Server]:
    """A Spark standalone master and `WORKERS` workers of `SLOTS` task slots each, and a Spark
    Connect server on them, as `make up CLUSTER=1` starts them, on free ports."""
    master, ui, worker_ui, connect = free_port_block(4, step=WORKERS)
    settings = StackSettings(
        state_dir=state_dir,
        cluster=True,
        spark_cluster_port=master,
        spark_cluster_ui_port=ui,
        spark_worker_ui_port=worker_ui,
        spark_connect_port=connect,
        spark_workers=WORKERS,
        spark_worker_cores=SLOTS,
        spark_connect_cores=WORKERS * SLOTS,
    )
    daemons = [*standalone.spark_cluster(settings), services.spark_connect(settings)]
    with contextlib.ExitStack() as stack:
        with console.status("starting a private Spark cluster and its Spark Connect server"):
            for service in daemons:
                stack.callback(service.stop)
                service.start(settings.start_timeout)
        yield Server(settings.spark_connect_url, daemons[-1], daemons[:-1])


def executors(state_dir: Path) -> str:
    """The tasks each worker's executors ran (their logs' `Running task` lines)."""
    ran = []
    for i in range(1, WORKERS + 1):
        logs = (state_dir / "spark" / f"worker-{i}").glob("app-*/*/stderr")
        ran.append(f"worker-{i} {sum(log.read_text().count('Running task') for log in logs):,}")
    return f"tasks run: {', '.join(ran)}"


def fetched(state_dir: Path) -> set[tuple[Path, str]]:
    """(executor log, server-side session) of every Python file an executor has fetched from a
    Spark Connect session's artifacts (the server names them by its own session UUID)."""
    found = set()
    for log in (state_dir / "spark").glob("worker-*/app-*/*/stderr"):
        found |= {(log, m) for m in FETCHED.findall(log.read_text(errors="replace"))}
    return found


def master_app(server: Server) -> str:
    """The Connect server's application as the cluster's master shows it."""
    ui = next(s.ports[1] for s in server.cluster if s.name == "spark-master")
    with urllib.request.urlopen(f"http://{StackSettings().host}:{ui}/json/", timeout=10) as reply:
        state = json.load(reply)
    app = next(a for a in state["activeapps"] if a["name"] == "cairn-spark-connect")
    return f"{app['cores']} cores, {app['memoryperexecutor']} MB per executor"


# --- the sitting ------------------------------------------------------------------------------


@dataclass
class Sitting:
    """The private services the three parts share."""

    args: argparse.Namespace
    work: Path
    bootstrap: str
    options: dict
    """fsspec options of the private S3."""
    s3: StackSettings
    postgres: StackSettings
    servers: dict[str, Server]
    """By side: `local`, `cluster`."""

    def root(self, prefix: str) -> str:
        """An archive root on the private S3 (its connection id resolves the endpoint)."""
        return f"s3://{self.s3.s3_conn_id}@{self.s3.bucket}/bench/{prefix}"

    def topic(self, name: str, records: int) -> str:
        """A fresh topic of `records` events, produced with ProducerPerformance."""
        topic = f"bench.{name}-{uuid.uuid4().hex[:8]}"
        demo.create_topic(self.bootstrap, topic, self.args.partitions)
        payloads, log = self.work / "payloads.jsonl", self.work / f"{name}-producer.log"
        produce(self.bootstrap, topic, records, payloads, log)
        return topic

    def archive(
        self, side: str, topic: str, records: int, prefix: str, digest: str | None = None
    ) -> Round:
        """One whole archive run of `topic` (`records`) on `side`'s server into the fresh root
        `prefix` (`digest`: as a new version of the code, `connect_argv`)."""
        args = argparse.Namespace(**{**vars(self.args), "records": records})
        server, root = self.servers[side], self.root(prefix)
        work = self.work / prefix
        return archive_round(args, work, topic, self.bootstrap, server, root, self.options, digest)


def archive_part(s: Sitting) -> dict[str, list[Round]]:
    """A warm-up run of a small topic on each server, then `--rounds` rounds of the big topic,
    each on the local server then on the cluster."""
    topic = s.topic("events", s.args.records)
    warm = s.topic("warm", WARM_RECORDS)
    for side in s.servers:
        s.archive(side, warm, WARM_RECORDS, f"warm-{side}")
    rounds: dict[str, list[Round]] = {side: [] for side in s.servers}
    for i in range(1, s.args.rounds + 1):
        for side in s.servers:
            console.print(f"round {i} of {s.args.rounds}: {side}")
            rounds[side].append(s.archive(side, topic, s.args.records, f"{side}-{i}"))
    return rounds


@dataclass
class SealedDate:
    date: str
    records: int
    runs: int
    files: int
    folders: int
    build_seconds: float
    copied: int
    """Objects copied to the second root."""
    copy_seconds: float


def seal_part(s: Sitting) -> tuple[SealedDate, dict[str, Sealing]]:
    """A date built once (seal_day.py's, by `--seal-runs` runs) in one root, copied to another,
    and each sealed on its side's server into its own table; checks each sealed folder holds
    the same (partition, offset) as before."""
    args = s.args
    day = datetime.now(UTC).date() - timedelta(days=3)
    per_run = math.ceil(
        (args.seal_records + CLOSING * args.partitions) / (args.seal_runs * args.partitions)
    )
    seal_args = argparse.Namespace(
        **{**vars(args), "records": args.seal_records, "runs": args.seal_runs},
        late_fraction=LATE_FRACTION,
        late_hours=LATE_HOURS,
        per_run_partition=per_run,
    )
    topic = f"bench.day-{uuid.uuid4().hex[:8]}"
    create_kept_topic(s.bootstrap, topic, args.partitions)
    files = {side: s.work / f"seal-{side}.yaml" for side in s.servers}
    cfgs = {
        side: topic_config(path, topic, s.root(f"seal-{side}"), max_records_per_partition=per_run)
        for side, path in files.items()
    }
    stores = {side: Storage(cfg.root.storage_url, **s.options) for side, cfg in cfgs.items()}
    in_day, _ = produce_day(s.bootstrap, topic, day, seal_args)
    kafka = KafkaConf.from_bootstrap(s.bootstrap, "the benchmark's broker")
    build_s = build_day(seal_args, cfgs["local"], stores["local"], kafka, day)
    console.print(f"{args.seal_runs} archive runs of {day} in {build_s:.1f}s")
    with console.status("copying the date's archive root to a second prefix"):
        copied, copy_s = copy_root(stores["local"], stores["cluster"])
    with console.status("reading the date's records"):
        before = day_files(stores["local"], topic, cfgs["local"].path_format, day)
        keys = date_keys(stores["local"], before)
    if (held := sum(len(k) for k in keys.values())) != in_day:
        raise BenchError(f"{day} holds {held:,} records after its runs, not {in_day:,}")

    reach = s.s3.model_copy(update={"postgres_port": s.postgres.postgres_port})
    sealed = {}
    for side, server in s.servers.items():
        warehouse = f"s3://{s.s3.bucket}/warehouse-{side}"
        catalog = services.iceberg_catalog(reach, warehouse, name=f"bench_{side}")
        work = s.work / f"seal-{side}"
        work.mkdir()
        cfg, storage = cfgs[side], stores[side]
        sealed[side], *_ = seal_date(
            seal_args, work, cfg, files[side], storage, catalog, day, in_day, server
        )
        with console.status("checking the sealed date record by record"):
            same_records(keys, date_keys(storage, day_files(storage, topic, cfg.path_format, day)))
    built = SealedDate(
        date=day.isoformat(),
        records=in_day,
        runs=args.seal_runs,
        files=len(before),
        folders=len(keys),
        build_seconds=round(build_s, 1),
        copied=copied,
        copy_seconds=round(copy_s, 1),
    )
    return built, sealed


def copy_root(source: Storage, target: Storage) -> tuple[int, float]:
    """Every object of `source` to the same key under `target`, by server-side copies."""
    start = time.perf_counter()
    keys = source.list()
    at, to = source.backend, target.backend  # both S3 (FsspecStore): one filesystem
    at.fs.copy([at.path(k) for k in keys], [to.path(k) for k in keys])
    if (found := len(target.list())) != len(keys):
        raise BenchError(f"copied {len(keys)} objects to {target.url}, found {found}")
    return len(keys), time.perf_counter() - start


@dataclass
class Shipping:
    artifact: str
    artifact_bytes: int
    build_seconds: float
    """`spark_artifact.build` into an empty folder."""
    records: int
    first_seconds: list[float]
    """Each round's first run of a new version: a new session."""
    second_seconds: list[float]
    """Each round's next run of that version, on the session the first one started."""
    warm_seconds: list[float]
    """Each round's same run on the session the whole sitting used."""
    fetching: list[tuple[int, int]]
    """Each round's executors that fetched an artifact during the new version's first run, and
    during its second."""


def shipping_part(s: Sitting) -> Shipping:
    """The artifact built into an empty folder; on the cluster, `--rounds` times, a small topic
    archived by the first run of a new version of the code, by its second run, and by the
    sitting's version."""
    start = time.perf_counter()
    roots = [Path(p.__file__).parent for p in spark_artifact.PACKAGES]
    built = spark_artifact.build(roots, s.work / "artifact")
    build_s = time.perf_counter() - start
    if built.digest != spark_artifact.code_artifact().digest:
        raise BenchError(f"{built.path.name} differs from {spark_artifact.code_artifact()}")
    # spread evenly (ProducerPerformance would fill one or two partitions with so few records),
    # so every run has tasks on both executors: the first run meets the new version on each
    topic, n = f"bench.ship-{uuid.uuid4().hex[:8]}", s.args.ship_records
    demo.create_topic(s.bootstrap, topic, s.args.partitions)
    lines = (s.work / "payloads.jsonl").read_bytes().split(b"\n")
    for p in range(s.args.partitions):
        values = [lines[i % len(lines)] for i in range(p, n, s.args.partitions)]
        demo.produce(s.bootstrap, topic, values, partition=p)
    walls: dict[str, list[float]] = {"first": [], "second": [], "warm": []}
    fetching = []
    for i in range(1, s.args.rounds + 1):
        new_version = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
        seen, before = [], fetched(s.work / "cluster")
        for run, digest in (("first", new_version), ("second", new_version), ("warm", None)):
            done = s.archive("cluster", topic, n, f"ship-{i}-{run}", digest)
            walls[run].append(round(done.spark_seconds, 2))
            now = fetched(s.work / "cluster")
            seen.append(len({log for log, _ in now - before}))
            before = now
        fetching.append((seen[0], seen[1]))
    return Shipping(
        artifact=built.path.name,
        artifact_bytes=built.path.stat().st_size,
        build_seconds=round(build_s, 3),
        records=s.args.ship_records,
        first_seconds=walls["first"],
        second_seconds=walls["second"],
        warm_seconds=walls["warm"],
        fetching=fetching,
    )


@dataclass
class Side:
    """One server's numbers."""

    name: str
    where: str
    archive_seconds: list[float]
    """Client start to exit of each measured round, in order."""
    archive_peak_mb: dict[str, int]
    """Peak RSS over the rounds: total and per role (`Peaks`)."""
    seal: Sealing

    @property
    def best(self) -> float:
        return min(self.archive_seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.archive_seconds)


@dataclass
class Result:
    records: int
    partitions: int
    rounds: int
    sides: list[Side]
    date: SealedDate
    shipping: Shipping
    executors: str
    job: JobRun


def benchmark(args: argparse.Namespace, work: Path) -> Result:
    commit = git_commit()  # before the run: others may commit while it goes
    args.connect, args.driver_memory = True, services.SERVER_JVM["spark.driver.memory"]  # JobRun
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(private_kafka(work / "kafka"))
        options, s3 = private_s3(work / "seaweedfs", stack)
        postgres = stack.enter_context(private_postgres(work / "postgres"))
        servers = {
            "local": stack.enter_context(private_connect(work / "local", spark_master=LOCAL)),
            "cluster": stack.enter_context(private_cluster(work / "cluster")),
        }
        sitting = Sitting(args, work, bootstrap, options, s3, postgres, servers)
        lines = event_lines(args.payloads, args.spread_hours, args.seed)
        (work / "payloads.jsonl").write_bytes(b"\n".join(lines))
        load = [os.getloadavg()[0]]
        rounds = archive_part(sitting)
        date, sealed = seal_part(sitting)
        load.append(os.getloadavg()[0])
        shipping = shipping_part(sitting)
        ran = f"{master_app(servers['cluster'])}; {executors(work / 'cluster')}"

    sides = [
        Side(
            name=side,
            where=SIDES[side],
            archive_seconds=[round(r.spark_seconds, 2) for r in rounds[side]],
            archive_peak_mb=peak_mb([r.peaks for r in rounds[side]]),
            seal=sealed[side],
        )
        for side in servers
    ]
    best = min(rounds["cluster"], key=lambda r: r.spark_seconds)
    shown = [shlex.quote(a) for a in best.argv]
    shown[2] = "<the job's run() on a session of the server>"
    notes = [
        "memory: peak RSS of the job's client (python driver) with the server's process tree, "
        "sampled every 0.2 s; local: the Connect server's JVM (it runs the tasks) and its "
        "Python workers; cluster: the Connect server's JVM (the driver), the master, both "
        "workers, their executors' JVMs and the executors' Python workers",
        f"the sealed date was built by {args.seal_runs} archive runs with the in-process writer "
        f"(seal_day.py's date, {LATE_FRACTION:.0%} of its records 1-{LATE_HOURS} h late), then "
        "copied to the second root by server-side copies",
        "a new version is simulated honestly: an Artifact of the same zip with a fresh digest "
        "gives a fresh session id, so the server opens a new session and adds the artifact to "
        "it, and the executors fetch the zip and start new Python workers (Spark keys them by "
        "session) that import Cairn from it; the version's second run finds all of that",
    ]
    if max(load) > (os.cpu_count() or 1):
        notes.append(
            f"others loaded the machine (1-minute load up to {max(load):.1f} on "
            f"{os.cpu_count()} cores): each side got the share of the CPU its processes won, so "
            "the walls and the ratios are not those of a quiet machine"
        )
    command = "CAIRN_JOB_INPUT=<ArchiveInput JSON> " + " ".join(shown)
    return Result(
        records=args.records,
        partitions=args.partitions,
        rounds=args.rounds,
        sides=sides,
        date=date,
        shipping=shipping,
        executors=ran,
        job=JobRun.finished(best.peaks, args, commit, load, command, notes),
    )


def peak_mb(rounds: list[Peaks]) -> dict[str, int]:
    """The highest of the rounds' peaks: total and per role, in MB."""
    found = {"total": max(p.total for p in rounds)}
    for role in ("jvm", "python driver", "python workers"):
        found[role] = max(p.roles[role] for p in rounds)
    return {role: round(rss / 2**20) for role, rss in found.items()}


# --- printing ---------------------------------------------------------------------------------


def print_result(r: Result) -> None:
    out = Console(width=None if sys.stdout.isatty() else 120)
    local, cluster = r.sides
    memory = ("peak RSS MB", "JVMs", "client", "Py workers")

    def table(heading: str, *columns: str) -> Table:
        out.print(f"\n[bold]{heading}[/bold]")
        found = Table()
        for i, column in enumerate(columns):
            found.add_column(column, justify="left" if i == 0 else "right")
        return found

    def rss(mb: dict[str, int]) -> list[str]:
        return [f"{mb[k]:,}" for k in ("total", "jvm", "python driver", "python workers")]

    archive = table(
        f"Archive: {r.records:,} records over {r.partitions} partitions, client start to exit; "
        f"{r.rounds} round(s) per server, alternating, after a warm-up run on each",
        *("server", "rounds (s)", "best (s)", "median (s)", "records/s", *memory),
    )
    for side in r.sides:
        rounds = ", ".join(f"{s:.1f}" for s in side.archive_seconds)
        best, median, rate = (
            f"{side.best:.1f}",
            f"{side.median:.1f}",
            f"{r.records / side.best:,.0f}",
        )
        archive.add_row(side.where, rounds, best, median, rate, *rss(side.archive_peak_mb))
    archive.add_row(
        "cluster/local",
        "",
        f"{cluster.best / local.best:.2f}x",
        f"{cluster.median / local.median:.2f}x",
        f"{local.best / cluster.best:.2f}x",
        *[""] * len(memory),
    )
    out.print(archive)

    d = r.date
    seal = table(
        f"Seal of {d.date}: {d.records:,} records in {d.files:,} files, {d.folders} hour folders "
        f"(built by {d.runs} archive runs in {d.build_seconds:.0f} s; the root's {d.copied:,} "
        f"objects copied to a second root in {d.copy_seconds:.1f} s)",
        *("server", "select (s)", "job (s)", "finish (s)", "total (s)", "files", *memory),
    )
    for side in r.sides:
        s = side.seal
        seal.add_row(
            side.where,
            f"{s.select_seconds:.2f}",
            f"{s.job_seconds:.1f}",
            f"{s.finish_seconds:.2f}",
            f"{s.total_seconds:.1f}",
            f"{s.files_after:,} + {s.table_files:,}",
            *rss(s.peak_rss_mb),
        )
    seal.add_row(
        "cluster/local",
        "",
        f"{cluster.seal.job_seconds / local.seal.job_seconds:.2f}x",
        "",
        f"{cluster.seal.total_seconds / local.seal.total_seconds:.2f}x",
        *[""] * (1 + len(memory)),
    )
    out.print(seal)

    s = r.shipping
    ship = table(
        f"Shipping the code to the cluster: {s.records:,} records archived (spread over the "
        f"partitions), client start to exit, {len(s.first_seconds)} round(s), each with a new "
        f"version; the artifact {s.artifact}: {s.artifact_bytes / 1024:,.0f} KiB, built in "
        f"{s.build_seconds:.2f} s into an empty folder",
        *("run", "rounds (s)", "median (s)", "what it paid"),
    )
    ship.columns[3].justify = "left"
    first = ", ".join(str(a) for a, _ in s.fetching)
    again = sum(b for _, b in s.fetching)
    for name, walls, paid in (
        (
            "first run of a new version",
            s.first_seconds,
            f"a new session and artifact; executors fetching it: {first} (of {WORKERS})",
        ),
        (
            "its second run",
            s.second_seconds,
            "reuses all of that"
            + (f" (but {again} executor(s) fetched it only now)" if again else ", no fetch"),
        ),
        ("the sitting's version", s.warm_seconds, "its long-warm session"),
    ):
        rounds = ", ".join(f"{w:.1f}" for w in walls)
        ship.add_row(name, rounds, f"{statistics.median(walls):.1f}", paid)
    cost = statistics.median(s.first_seconds) - statistics.median(s.second_seconds)
    ship.add_row("one-time cost", "", f"{cost:.1f}", "median first - median second")
    out.print(ship)

    print_rows(
        "Cairn on a Spark cluster beside local[4]",
        [
            ("cluster", f"{SIDES['cluster']}: {r.executors}"),
            ("server JVMs", f"driver memory {r.job.driver_memory} (the stack's)"),
            ("seal files", "sealed Avro files + Parquet files of the table"),
        ],
        r.job,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="archived each round")
    parser.add_argument("--seal-records", type=int, default=1_000_000, help="in the sealed date")
    parser.add_argument("--seal-runs", type=int, default=24, help="archive runs over the date")
    parser.add_argument("--rounds", type=int, default=3, help="archive rounds on each server")
    parser.add_argument("--ship-records", type=int, default=1_000, help="of the shipping runs")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--payloads", type=int, default=10_000, help="distinct events")
    parser.add_argument("--spread-hours", type=int, default=48, help="event-time spread")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per Spark job")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser.parse_args()


def main() -> int:
    return run_benchmark(benchmark, print_result, parse_args(), "cairn-cluster-bench-")


if __name__ == "__main__":
    sys.exit(main())
