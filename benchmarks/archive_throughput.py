"""Archive throughput and peak memory of ONE Cairn run, end to end, on this machine.

Fills a fresh 4-partition topic with N JSON events (~300 bytes) using Kafka's own
ProducerPerformance tool, then drives one run exactly as the archive DAG does — plan (which
claims the token and stores the plan in the claim), clean, the real Spark job through
spark-submit (given the claim's key; it stages the files), verify, commit (which publishes
them) — timing the Spark job from submit to exit and sampling the RSS of its process tree (JVM +
Python driver + Python workers) every 0.2 s.

    .venv/bin/python benchmarks/archive_throughput.py                  # 1,000,000 records
    .venv/bin/python benchmarks/archive_throughput.py --records 200000 --json

A private Kafka (free ports, state in a temporary folder) is started and stopped unless
`--bootstrap-servers` names a running one. Everything else lives in the temporary folder, which
is removed afterwards (kept, with the Spark log, when the run fails or with `--keep`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fastavro
import psutil
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from cairn.config import INCLUDE_DIR, TopicConfig
from cairn.datafiles.writer import DEFAULT_MAX_OPEN_FILES
from cairn.jobs import ArchiveInput, to_env
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import archive_run, run_record
from cairn.protocol import manifest
from cairn.storage.objects import Storage
from cairn.topics_file import find_topic
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack import services
from cairn_stack.demo import create_topic
from cairn_stack.process import free_port_block
from cairn_stack.settings import REPO, StackSettings

JOB = REPO / "spark_jobs" / "main.py"
"""The jobs' one entry point, spark-submitted as the Airflow operator submits it."""
SCHEMA = INCLUDE_DIR / "schemas" / "demo_event.avsc"
VENV_BIN = Path(sys.executable).parent
SAMPLE_EVERY = 0.2
EVENTS_END = datetime(2025, 1, 1, tzinfo=UTC)  # fixed, so the folders are the same every run
AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/126.0.0.0 Safari/537.36"
)

console = Console(stderr=True)


class BenchError(RuntimeError):
    """A step failed; the message says which and where to look."""


@dataclass
class JobRun:
    """What every benchmark reports beside its own numbers: the Spark job's peak memory, and
    where, when and how it ran."""

    peak_rss_total_mb: float
    peak_rss_jvm_mb: float
    peak_rss_python_driver_mb: float
    peak_rss_python_workers_mb: float
    driver_memory: str
    machine: str
    date: str
    commit: str
    load_average: tuple[float, float]
    """1-minute load before and after the Spark job: above ~2 on 2 cores, others competed."""
    command: str
    spark_command: str
    notes: list[str]

    @classmethod
    def finished(
        cls,
        peaks: Peaks,
        args: argparse.Namespace,
        commit: str,
        load: list[float],
        spark_command: str,
        notes: list[str],
    ) -> JobRun:
        """The record of a job that just finished, `commit` and `load` taken around it."""
        mb = {role: round(rss / 2**20) for role, rss in peaks.roles.items()}
        script = f"benchmarks/{Path(sys.argv[0]).name}"
        return cls(
            peak_rss_total_mb=round(peaks.total / 2**20),
            peak_rss_jvm_mb=mb["jvm"],
            peak_rss_python_driver_mb=mb["python driver"],
            peak_rss_python_workers_mb=mb["python workers"],
            # a Connect server's JVM is set up as the stack's (services.SERVER_JVM)
            driver_memory=(
                services.SERVER_JVM["spark.driver.memory"] if args.connect else args.driver_memory
            ),
            machine=machine(),
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            commit=commit,
            load_average=(round(load[0], 2), round(load[1], 2)),
            command=shlex.join([".venv/bin/python", script, *sys.argv[1:]]),
            spark_command=spark_command,
            notes=notes,
        )


@dataclass
class Result:
    records: int
    partitions: int
    records_per_partition: dict[int, int]
    value_bytes: int
    mean_value_bytes: float
    produce_seconds: float
    spark_seconds: float
    rounds_seconds: list[float]
    """Every round's Spark job wall time, in order; the result is the fastest round."""
    records_per_second: float
    mb_per_second: float
    peak_processes: int
    files: dict[str, int]
    output_bytes: int
    task_seconds: list[float]
    plan_clean_seconds: float
    verify_seconds: float
    commit_seconds: float
    spread_hours: int
    job: JobRun
    spark_how: str
    peers: list[PeerRun] = field(default_factory=list)


@dataclass
class PeerRun:
    """A peer measured on the same topic in the same sitting, start to exit."""

    name: str
    seconds: float
    """The fastest of its rounds, as Cairn's result."""
    rounds_seconds: list[float]
    records_per_second: float
    peak_rss_mb: int
    command: str
    cpu_seconds: float = 0
    """Its process tree's CPU (`Peaks.cpu_seconds`), where measured."""


# --- data ------------------------------------------------------------------------------------


def event_lines(
    count: int, spread_hours: int, seed: int, end: datetime = EVENTS_END
) -> list[bytes]:
    """Distinct JSON events like cairn_stack.demo.sample_events, ~300 bytes each, with event
    times spread over the `spread_hours` before `end` (a fixed instant by default)."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        ts = end - timedelta(milliseconds=rng.randrange(spread_hours * 3_600_000))
        lines.append(event_value(i, ts, rng))
    return lines


ACTIONS = ["view", "click", "add_to_cart", "purchase", "refund"]


def event_value(i: int, ts: datetime, rng: random.Random) -> bytes:
    """One JSON event like cairn_stack.demo.sample_events (~300 bytes) that happened at `ts`."""
    event = {
        "event_id": f"evt-{i:09d}",
        "user_id": f"user-{rng.randrange(100000):06d}",
        "action": rng.choice(ACTIONS),
        "amount": round(rng.uniform(0, 500), 2),
        "ts": ts.isoformat(timespec="milliseconds"),
        "page": f"/products/{rng.randrange(5000)}?ref=campaign-{rng.randrange(40)}&utm_source=mail",
        "agent": AGENT,
    }
    return json.dumps(event).encode()


def produce(bootstrap: str, topic: str, records: int, payload_file: Path, log: Path) -> float:
    """Fill `topic` with Kafka's ProducerPerformance; returns its wall time in seconds."""
    jars = services.jars(StackSettings(), "kafka")
    argv = [
        *[services.java() or "java", "-Xmx512m", "-cp", f"{jars}/*"],
        "org.apache.kafka.tools.ProducerPerformance",
        *["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records)],
        *["--throughput", "-1", "--payload-file", str(payload_file)],
        *["--reporting-interval", "1000"],
        *["--command-property", "acks=1", "linger.ms=20", "batch.size=262144"],
        "compression.type=lz4",
    ]
    sent = re.compile(r"^(\d+) records sent")
    start = time.perf_counter()
    with (
        open(log, "w") as out,
        progress_bars() as progress,
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        task = progress.add_task("producing (ProducerPerformance)", total=records)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if m := sent.match(line):
                progress.advance(task, int(m.group(1)))
        progress.update(task, completed=records)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"ProducerPerformance exited {proc.returncode}; see {log}")
    return seconds


def topics_file(path: Path, topic: str, archive: Path | str, records: int) -> TopicConfig:
    """A topics file of one JSON topic archived afresh into `archive` (a folder, or a root's
    URL such as `s3://<conn id>@<bucket>/<prefix>`)."""
    root = archive.as_uri() if isinstance(archive, Path) else archive
    entry = f"""\
        topics:
          - topic: {topic}
            format: json
            schema: {SCHEMA}
            event_time: {{field: ts, encoding: iso8601}}
            archive_root: {root}
            start_new_archive: true  # every round archives the topic afresh
            max_records_per_partition: {max(records, 1)}
        """
    path.write_text(textwrap.dedent(entry))
    return find_topic(topic, path)


# --- the Spark job ---------------------------------------------------------------------------


@dataclass
class Peaks:
    """Peak RSS in bytes: of the whole tree, and per role (java, Python driver, Python workers).

    RSS counts pages shared by forked workers once per process, so the total slightly overstates.
    """

    total: int = 0
    roles: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    processes: int = 0
    job: Path = JOB
    """The Spark job's script: a Python process running it is the driver."""
    _cmdlines: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    _cpu: dict[tuple[int, str], float] = field(default_factory=dict)

    @property
    def cpu_seconds(self) -> float:
        """User and system CPU of every process of the trees, as last sampled: on a machine
        others load too, less noisy than wall time (a process that lives less than a sample
        is missed; Spark's Python workers are reused and live to the end)."""
        return sum(self._cpu.values())

    def sample(self, root: psutil.Process, *others: psutil.Process) -> int:
        """Add one sample of the process trees of `root` and `others`; returns their RSS."""
        procs = []
        for top in (root, *others):
            with contextlib.suppress(psutil.NoSuchProcess):
                procs += [top, *top.children(recursive=True)]
        if not procs:
            return 0
        now = dict.fromkeys(ROLES, 0)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                rss = p.memory_info().rss
                role = _role(p, self._cmdlines, self.job)
                now[role] += rss
                cpu = p.cpu_times()
                self._cpu[p.pid, p.name()] = cpu.user + cpu.system
        for role, rss in now.items():
            self.roles[role] = max(self.roles[role], rss)
        self.processes = max(self.processes, len(procs))
        total = sum(now.values())
        self.total = max(self.total, total)
        return total


ROLES = ("jvm", "python driver", "python workers", "other")


def _role(p: psutil.Process, cmdlines: dict[tuple[int, str], list[str]], job: Path = JOB) -> str:
    """The process's role; keyed by pid and name, as spark-submit's shell execs into java."""
    name = p.name()
    if name == "java":
        return "jvm"
    if not name.startswith("python"):
        return "other"
    cmdline = cmdlines.get((p.pid, name)) or cmdlines.setdefault((p.pid, name), p.cmdline())
    return "python driver" if str(job) in cmdline else "python workers"


def plan_and_clean(cfg: TopicConfig, storage: Storage, bootstrap: str) -> archive_run.Planned:
    """Plan (claiming the next token) and clean as the archive DAG does; the plan must read
    everything in Kafka in one archive_run."""
    planned = archive_run.plan_run(
        cfg, storage, KafkaConf.from_bootstrap(bootstrap), f"bench-{uuid.uuid4().hex[:6]}"
    )
    if planned is None:
        raise BenchError(f"topic {cfg.topic}: nothing to archive (plan_run returned None)")
    archive_run.clean_run(storage, planned)
    if planned.plan.capped:
        raise BenchError(f"plan is capped, one run would not read all: {planned.plan}")
    return planned


def archive_input(
    cfg: TopicConfig, planned: archive_run.Planned, bootstrap: str, options: dict | None = None
) -> dict[str, str]:
    """The archive job's input as the Airflow operator gives it (the environment of a
    spark-submitted job): the topic's entry, the claim that holds the plan, Kafka's address,
    the archive root's fsspec `options` (an S3 root's endpoint and keys)."""
    job = ArchiveInput(
        topic=cfg.snapshot(),
        claim=planned.claim.key,
        storage_options=options or {},
        artifact=code_artifact().name,
        kafka={"bootstrap.servers": bootstrap},
        kafka_label="the benchmark's broker",
    )
    return to_env(job)


def submit_argv(script: Path, args: list[str], driver_memory: str, jars: bool = True) -> list[str]:
    """spark-submit of `script` on the stack's master, with the code artifact and the stack's
    Spark jars (Kafka, Avro, Iceberg, PostgreSQL) as the Airflow operator gives them."""
    stack = StackSettings()
    given = []
    if jars:
        given = [
            "--jars",
            ",".join(sorted(str(p) for p in services.jars(stack, "spark").glob("*.jar"))),
        ]
    return [
        str(VENV_BIN / "spark-submit"),
        *["--master", stack.spark_master, "--driver-memory", driver_memory, *given],
        *["--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false"],
        *["--py-files", str(code_artifact().path)],
        str(script),
        *args,
    ]


def spark_submit(
    argv: list[str],
    tasks: int,
    log: Path,
    timeout: float,
    job: Path = JOB,
    label: str = "archiving (spark-submit)",
    also: tuple[psutil.Process, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[float, Peaks]:
    """Run the job (`job`: its script, or the Spark Connect client that runs it), with `env`
    added to its environment; returns its wall time and memory peaks. Fails loudly with the
    log's tail."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        **(env or {}),
    }
    return run_sampled(argv, log, timeout, label, env, Peaks(job=job), tasks, also)


# The Airflow task's side of a Spark Connect run: the job's `run` on a session of the server,
# held as the operator holds it (cairn_airflow.hooks.spark_connect). With a digest (argv[3]),
# the same code as if it were a new version: the session of that digest (cluster.py).
CONNECT_CLIENT = """
import os, sys
from cairn.jobs import from_env
from cairn_airflow.hooks.spark_connect import connect_session
from cairn_airflow.spark_artifact import Artifact, code_artifact
from spark_jobs.main import run
artifact = code_artifact()
if len(sys.argv) > 3:
    artifact = Artifact(artifact.path, sys.argv[3])
with connect_session(sys.argv[2], artifact) as connected:  # argv[1]: for the sampler
    print(run(connected.session, from_env(os.environ)))
"""


def connect_argv(url: str, digest: str | None = None) -> list[str]:
    """The job as the Airflow task runs it on a `spark_connect` connection, its input in the
    environment (`main.py` is in the command line so the sampler counts this process as the
    job's driver); with `digest`, on the session of a new version of the same code."""
    return [sys.executable, "-c", CONNECT_CLIENT, str(JOB), url, *([digest] if digest else [])]


@dataclass
class Server:
    """A Spark Connect server: its URL, its service, and the services whose processes also run
    its jobs (a standalone cluster's master and workers, whose executors run the tasks)."""

    url: str
    service: services.Service
    cluster: list[services.Service] = field(default_factory=list)

    def processes(self) -> tuple[psutil.Process, ...]:
        """The process trees sampled with the job's client."""
        found = []
        for service in [self.service, *self.cluster]:
            if (pid := service.pid()) is None:
                raise BenchError(f"{service.name} is not running; see {service.log}")
            found.append(psutil.Process(pid))
        return tuple(found)


@contextlib.contextmanager
def private_connect(state_dir: Path, **settings: object) -> Iterator[Server]:
    """A Spark Connect server as the local stack runs one (on its `spark_master`, unless
    `settings` say otherwise), on a free port."""
    (port,) = free_port_block(1)
    stack = StackSettings(state_dir=state_dir, spark_connect_port=port, **settings)
    service = services.spark_connect(stack)
    with console.status("starting a private Spark Connect server"):
        service.start(stack.start_timeout)
    try:
        yield Server(stack.spark_connect_url, service)
    finally:
        service.stop()


def run_sampled(
    argv: list[str],
    log: Path,
    timeout: float,
    label: str,
    env: dict[str, str] | None = None,
    peaks: Peaks | None = None,
    tasks: int = 0,
    also: tuple[psutil.Process, ...] = (),
) -> tuple[float, Peaks]:
    """Run a command to exit, sampling its process tree's RSS (and that of the processes `also`
    names: a Spark Connect server); returns its wall time and peaks. With `tasks`, progress
    counts the Spark tasks its log reports finished."""
    peaks = peaks or Peaks()
    with open(log, "wb") as out, progress_bars() as progress:
        task = progress.add_task(label, total=tasks)
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )
        root = psutil.Process(proc.pid)
        try:
            while proc.poll() is None:
                if time.perf_counter() - start > timeout:
                    raise BenchError(f"{argv[0]} still running after {timeout:.0f}s")
                rss = peaks.sample(root, *also)
                progress.update(
                    task,
                    completed=_finished_tasks(log) if tasks else 0,
                    description=f"{label} rss {rss / 2**20:,.0f} MB",
                )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(SAMPLE_EVERY)  # returns at the exit, not up to a sample later
        finally:
            if proc.poll() is None:  # timeout or Ctrl-C: stop the job we started, all of it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.perf_counter() - start
        progress.update(task, completed=tasks)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise BenchError(f"{argv[0]} exited {proc.returncode}; see {log}:\n{tail}")
    return seconds, peaks


_TASK_DONE = re.compile(r"Finished task \S+ in stage \S+ \(TID \d+\) in (\d+) ms")


def _finished_tasks(log: Path) -> int:
    with open(log, errors="replace") as f:
        return sum(1 for line in f if _TASK_DONE.search(line))


def task_seconds(log: Path) -> list[float]:
    text = log.read_text(errors="replace")
    return [int(ms) / 1000 for ms in _TASK_DONE.findall(text)]


# --- the whole benchmark ---------------------------------------------------------------------


@dataclass
class Round:
    """One whole archive run of the topic into its own archive root."""

    planned: archive_run.Planned
    spark_seconds: float
    peaks: Peaks
    plan_clean_seconds: float
    verify_seconds: float
    commit_seconds: float
    summary: run_record.RunRecord
    storage: Storage
    task_seconds: list[float]
    load: list[float]
    argv: list[str]


def archive_round(
    args: argparse.Namespace,
    work: Path,
    topic: str,
    bootstrap: str,
    server: Server | None,
    root: str | None = None,
    options: dict | None = None,
    digest: str | None = None,
) -> Round:
    """Plan, clean, the Spark job, verify and commit, as the archive DAG runs them, into a new
    archive root (`root` with fsspec `options`, else a folder under `work`); checks that the
    committed counts account for every record. `digest`: see `connect_argv`."""
    work.mkdir()
    topics = work / "topics.yaml"
    cfg = topics_file(topics, topic, root or work / "archive", args.records)
    storage = Storage(cfg.root.storage_url, **(options or {}))
    t = time.perf_counter()
    planned = plan_and_clean(cfg, storage, bootstrap)
    plan_clean_s = time.perf_counter() - t

    tasks = len(planned.plan.to_read)
    spark_log, also = work / "spark.log", ()
    if server is not None:
        argv, spark_log = connect_argv(server.url, digest), server.service.log
        also = server.processes()
        tasks = 0  # the server's log counts the earlier runs' tasks too
    else:
        argv = submit_argv(JOB, [], args.driver_memory)
    first_task = len(task_seconds(spark_log)) if spark_log.exists() else 0
    load = [os.getloadavg()[0]]
    env = archive_input(cfg, planned, bootstrap, options)
    spark_s, peaks = spark_submit(argv, tasks, work / "spark.log", args.timeout, also=also, env=env)
    console.print(f"spark job finished in {spark_s:.1f}s")
    load.append(os.getloadavg()[0])

    with console.status("verifying"):
        t = time.perf_counter()
        report = archive_run.verify_run(storage, planned)
        verify_s = time.perf_counter() - t
    with console.status("committing"):
        t = time.perf_counter()
        summary = archive_run.commit_run(
            cfg, storage, planned, report, KafkaConf.from_bootstrap(bootstrap)
        )
        commit_s = time.perf_counter() - t
    c = summary.counts
    if (c.read, c.backup, c.partitioned + c.quarantined) != (args.records,) * 3:
        raise BenchError(f"committed counts {c} do not account for {args.records} records")
    return Round(
        planned=planned,
        spark_seconds=spark_s,
        peaks=peaks,
        plan_clean_seconds=plan_clean_s,
        verify_seconds=verify_s,
        commit_seconds=commit_s,
        summary=summary,
        storage=storage,
        task_seconds=task_seconds(spark_log)[first_task:],
        load=load,
        argv=argv,
    )


def benchmark(args: argparse.Namespace, work: Path) -> Result:
    notes: list[str] = []
    commit = git_commit()  # before the run: others may commit while it goes
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(private_kafka(work / "stack"))
        topic = f"bench.events-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        if args.bootstrap_servers:  # someone else's Kafka: leave no topic behind
            stack.callback(delete_topic, bootstrap, topic)

        payloads = work / "payloads.jsonl"
        payloads.write_bytes(b"\n".join(event_lines(args.payloads, args.spread_hours, args.seed)))
        produce_s = produce(bootstrap, topic, args.records, payloads, work / "producer.log")
        console.print(f"produced {args.records:,} records to {topic} in {produce_s:.1f}s")
        in_kafka = cluster.fetch_watermarks(KafkaConf.from_bootstrap(bootstrap), topic)
        total = sum(w.high - w.low for w in in_kafka.values())
        if total != args.records:
            raise BenchError(f"{topic} holds {total} records, not {args.records}")

        peers = run_peers(bootstrap, topic, args, work) if args.peers else []

        server = None
        if args.connect:
            server = stack.enter_context(private_connect(work / "connect"))
            warm_up(server.url, bootstrap, work, args)
            notes.append(
                "the warm-up and the measured runs join the server's shared Cairn session, as "
                "the Airflow task's runs do (cairn_airflow.hooks.spark_connect): its Python "
                "workers are started and have imported cairn"
            )
        rounds = [
            archive_round(args, work / f"round-{i + 1}", topic, bootstrap, server)
            for i in range(args.rounds)
        ]
        best = min(rounds, key=lambda r: r.spark_seconds)
        if best.summary.counts.quarantined:
            notes.append(
                f"{best.summary.counts.quarantined} records were quarantined (expected none)"
            )
        attempt = manifest.load(best.storage, best.planned.manifest_key)
        with console.status("summing value sizes from the backup files"):
            value_bytes = backup_value_bytes(best.storage, attempt)

    files: dict[str, int] = {"backup": 0, "partitioned": 0, "quarantine": 0}
    for entry in attempt.files:
        files[entry.kind] = files.get(entry.kind, 0) + 1
    files["total"] = len(attempt.files)
    if files["partitioned"] > 10 * args.spread_hours * args.partitions:
        notes.append(
            f"{files['partitioned']:,} partitioned files for {args.spread_hours} hour folders: "
            "events arrive in random time order and the writer keeps at most "
            f"{DEFAULT_MAX_OPEN_FILES} folders open, so most records evict a file and start "
            "a new one"
        )
    shown = [shlex.quote(a) for a in best.argv]
    if args.connect:
        shown[2] = "<the job's run() on a session of the server>"
    else:
        shown[best.argv.index("--jars") + 1] = "<.cairn/jars/spark/*.jar, comma-separated>"
    spark_s = best.spark_seconds
    return Result(
        spark_how=(
            f"client start to exit, on a warm Spark Connect server, {StackSettings().spark_master}"
            if args.connect
            else f"spark-submit to exit, {StackSettings().spark_master}"
        ),
        records=args.records,
        partitions=args.partitions,
        records_per_partition={
            p: end - start for p, (start, end) in best.planned.plan.to_read.items()
        },
        value_bytes=value_bytes,
        mean_value_bytes=round(value_bytes / args.records, 1),
        produce_seconds=round(produce_s, 2),
        spark_seconds=round(spark_s, 2),
        rounds_seconds=[round(r.spark_seconds, 2) for r in rounds],
        records_per_second=round(args.records / spark_s),
        mb_per_second=round(value_bytes / spark_s / 1e6, 3),
        peak_processes=best.peaks.processes,
        files=files,
        output_bytes=best.summary.counts.bytes,
        task_seconds=best.task_seconds,
        plan_clean_seconds=round(best.plan_clean_seconds, 2),
        verify_seconds=round(best.verify_seconds, 2),
        commit_seconds=round(best.commit_seconds, 2),
        spread_hours=args.spread_hours,
        job=JobRun.finished(
            best.peaks,
            args,
            commit,
            best.load,
            f"CAIRN_BOOTSTRAP_SERVERS={bootstrap} " + " ".join(shown),
            notes,
        ),
        peers=peers,
    )


def warm_up(url: str, bootstrap: str, work: Path, args: argparse.Namespace) -> None:
    """One archive run of a small topic on the server first, as a deployed server has done
    before: the measured run then pays no JVM start nor first-query compilation."""
    topic, records = f"bench.warm-{uuid.uuid4().hex[:8]}", 20_000
    create_topic(bootstrap, topic, args.partitions)
    produce(bootstrap, topic, records, work / "payloads.jsonl", work / "warm-producer.log")
    topics = work / "warm.yaml"
    cfg = topics_file(topics, topic, work / "warm-archive", records)
    planned = plan_and_clean(cfg, Storage(cfg.root.storage_url), bootstrap)
    env = archive_input(cfg, planned, bootstrap)
    spark_submit(connect_argv(url), 0, work / "warm.log", args.timeout, label="warming up", env=env)


def run_peers(bootstrap: str, topic: str, args: argparse.Namespace, work: Path) -> list:
    """Kafka's ConsumerPerformance (the read ceiling) and the hand-written archiver
    (`naive_archiver.py`, into a new folder each round), each reading the whole topic once a
    round; each keeps its fastest round, as Cairn does."""
    jars = services.jars(StackSettings(), "kafka")
    perf = [
        *[services.java() or "java", "-Xmx512m", "-cp", f"{jars}/*"],
        "org.apache.kafka.tools.ConsumerPerformance",
        *["--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(args.records)],
        *["--timeout", "60000"],
    ]
    naive = [sys.executable, str(REPO / "benchmarks" / "naive_archiver.py"), bootstrap, topic]
    peers = [
        ("Kafka ConsumerPerformance (read only)", lambda _: perf, "consumer-perf"),
        ("hand-written archiver (naive_archiver.py)", lambda i: [*naive, f"naive-{i}"], "naive"),
    ]
    found = []
    for name, argv, label in peers:
        runs, log = [], work / f"{label}.log"
        for i in range(1, args.rounds + 1):
            runs.append(run_sampled(argv(i), log, args.timeout, f"peer: {name}"))
            if label == "naive":
                archived = re.search(r"archived (\d+) records", log.read_text())
                if archived is None or int(archived.group(1)) != args.records:
                    raise BenchError(f"the hand-written archiver did not archive all; see {log}")
        seconds, peaks = min(runs, key=lambda r: r[0])
        found.append(
            PeerRun(
                name=name,
                seconds=round(seconds, 2),
                rounds_seconds=[round(s, 2) for s, _ in runs],
                records_per_second=round(args.records / seconds),
                peak_rss_mb=round(peaks.total / 2**20),
                command=shlex.join(argv(1)),
            )
        )
    return found


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.delete_topics([topic])[topic].result(30)


@contextlib.contextmanager
def private_kafka(state_dir: Path) -> Iterator[str]:
    """A single-node KRaft broker on free ports, state under `state_dir`; yields bootstrap."""
    (port,) = free_port_block(1, step=3)
    settings = StackSettings(
        state_dir=state_dir,
        kafka_port=port,
        kafka_controller_port=port + 1,
        kafka_sasl_port=port + 2,
    )
    service = services.kafka(settings)
    with console.status("starting a private Kafka"):
        service.start(settings.start_timeout)
    try:
        yield settings.bootstrap_servers
    finally:
        service.stop()


def backup_value_bytes(storage: Storage, attempt: manifest.Manifest) -> int:
    """The sum of Kafka value sizes, read back from the verbatim backup files."""
    total = 0
    for entry in attempt.files:
        if entry.kind == "backup":
            with storage.open_read(entry.key) as f:
                total += sum(len(r["value"] or b"") for r in fastavro.reader(f))
    return total


def git_commit() -> str:
    """HEAD, marked dirty when the code the run uses has uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip()

    dirty = git("status", "--porcelain", "-uno", "--", "include/cairn", "spark_jobs")
    return git("rev-parse", "--short", "HEAD") + (" (dirty)" if dirty else "")


def machine() -> str:
    mem = psutil.virtual_memory().total / 2**30
    cpu = platform.machine()
    with contextlib.suppress(OSError):
        names = re.findall(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        cpu = names[0] if names else cpu
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GB RAM, {system}"


def progress_bars() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def print_result(r: Result) -> None:
    files = ", ".join(f"{n:,} {kind}" for kind, n in r.files.items() if kind != "total")
    tasks = ", ".join(f"{s:.1f}" for s in r.task_seconds)
    rows = [
        ("records", f"{r.records:,} over {r.partitions} partitions {r.records_per_partition}"),
        ("bytes in Kafka", f"{r.value_bytes:,} value bytes ({r.mean_value_bytes} per record)"),
        ("produce time", f"{r.produce_seconds:.1f} s (ProducerPerformance, not part of below)"),
        ("plan + clean", f"{r.plan_clean_seconds:.2f} s"),
        ("Spark job wall", f"{r.spark_seconds:.1f} s ({r.spark_how})"),
        ("rounds", ", ".join(f"{s:.1f}" for s in r.rounds_seconds) + " s (the fastest counts)"),
        ("throughput", f"{r.records_per_second:,} records/s, {r.mb_per_second:.2f} MB/s"),
        ("Spark tasks", f"{tasks} s (in finishing order)"),
        ("peak RSS total", f"{r.job.peak_rss_total_mb:,} MB ({r.peak_processes} processes)"),
        ("peak RSS JVM", f"{r.job.peak_rss_jvm_mb:,} MB (driver memory {r.job.driver_memory})"),
        (
            "peak RSS Python",
            f"{r.job.peak_rss_python_driver_mb:,} MB driver (archive.py), "
            f"{r.job.peak_rss_python_workers_mb:,} MB workers (pyspark daemon + workers)",
        ),
        ("files written", f"{r.files['total']:,}: {files}"),
        ("output bytes", f"{r.output_bytes:,}"),
        ("verify, commit", f"{r.verify_seconds:.1f} s, {r.commit_seconds:.1f} s"),
    ]
    for peer in r.peers:
        rows += [
            (
                peer.name,
                f"{peer.records_per_second:,} records/s, "
                f"{r.value_bytes / peer.seconds / 1e6:.2f} MB/s, {peer.seconds:.1f} s "
                f"(rounds {', '.join(f'{s:.1f}' for s in peer.rounds_seconds)}), "
                f"peak RSS {peer.peak_rss_mb:,} MB",
            ),
            (
                "  Cairn / it",
                f"{r.records_per_second / peer.records_per_second:.2f}x (same topic, same sitting)",
            ),
        ]
    print_rows("Cairn archive throughput", rows, r.job)


def print_rows(title: str, rows: list[tuple[str, str]], r: JobRun) -> None:
    """A result block: the benchmark's rows, then where and when it ran, and its notes."""
    rows = [
        *rows,
        ("machine", r.machine),
        ("date", r.date),
        ("commit", r.commit),
        ("load (1 min)", f"{r.load_average[0]:.1f} before, {r.load_average[1]:.1f} after the job"),
        ("reproduce", r.command),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\n== {title} ==")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for note in r.notes:
        print(f"note: {note}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--payloads", type=int, default=10_000, help="distinct events")
    parser.add_argument("--spread-hours", type=int, default=48, help="event-time spread")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="first run Kafka's ConsumerPerformance and the hand-written archiver on the topic",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="archive the topic this many times (each run into a new archive root; with "
        "--connect, on the same server), and run each peer as many times; each reports its "
        "fastest round",
    )
    add_common_options(parser)
    return parser.parse_args()


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every benchmark takes: the topic's shape, the Spark job, Kafka, the output."""
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--driver-memory",
        default="1g",
        help="of the spark-submitted job; a --connect server's is the stack's "
        f"({services.SERVER_JVM['spark.driver.memory']})",
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="run the job as Airflow does on a spark_connect connection: on a private Spark "
        "Connect server, warmed up by one small run first",
    )
    parser.add_argument("--bootstrap-servers", help="use this Kafka instead of a private one")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per Spark job")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run_benchmark(benchmark_fn, print_fn, args: argparse.Namespace, prefix: str) -> int:
    """Run one benchmark in a temporary folder (kept on failure or with --keep) and print it."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result = benchmark_fn(args, work)
    except BenchError as err:
        console.print(
            f"[red]benchmark failed:[/red] {err}\n(kept {work})", highlight=False, soft_wrap=True
        )
        return 1
    except BaseException:
        console.print(f"[red]benchmark failed[/red] (kept {work})")
        raise
    if args.keep:
        console.print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print_fn(result)
        print(f"Spark job command: {result.job.spark_command}")
    return 0


def main() -> int:
    return run_benchmark(benchmark, print_result, parse_args(), "cairn-bench-")


if __name__ == "__main__":
    sys.exit(main())
