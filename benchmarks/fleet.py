"""A fleet of trickle topics through the real Airflow scheduler: how long until all are archived.

Issue #8's target: "100 topics on this machine: all caught up within 2 schedule intervals of a
burst, with no out-of-memory and no more concurrent Spark work than the pool allows". One archive
run of one topic is `airflow_run.py`; this measures many at once, where the costs that matter are
Airflow's (a process per task, the scheduler, the DAG processor parsing one DAG per topic) and the
Spark pool's queue.

Needs the running local stack (`make up` first, as `airflow_run.py`). Steps:

1. Creates `--topics` (100) Kafka topics `cairn.fleet.t000…` (`--partitions` 1) and adds one
   JSON entry per topic (the demo topic's schema, `--schedule` `*/10 * * * *`, spread by topic as
   Cairn does by default) to the topics file the stack's Airflow reads (`CAIRN_TOPICS_FILE`,
   `include/topics.yaml` by default); waits for the DAG processor to parse the DAGs, unpauses
   them and waits until the runs Airflow starts for new DAGs have finished ("settle").
2. The burst: produces `--records` (20) sample events to every topic, then (`--fire trigger`,
   the default) triggers every topic's archive DAG through the REST API at once, as if every
   schedule fired in the same second (the worst case spreading exists to avoid; the scheduler
   and LocalExecutor then run them as usual), or (`--fire schedule`) waits for the spread
   schedules to fire by themselves, or (`--fire records`) configures the topics `run_on: records`
   with `max_delay: --max-delay` (15 s) and waits for the triggerer to start their runs. With
   `--idle-minutes`, the stack's CPU and the fleet's runs are first measured while no record
   arrives (what idle topics cost).
3. A topic is caught up when its newest token (Cairn's commit, read from the archive) covers
   every offset the burst produced; the time is the token's `created_at` minus the burst's start.

Meanwhile it samples every 2 seconds the `cairn_spark` pool's running slots and the machine's
memory, and every 6 the stack's processes (`/proc` through psutil, each service's process tree
from its pid file). Reports:
burst → all caught up (seconds and schedule intervals), the archive task's duration (median,
p90, max), its wait for a pool slot, the most Spark tasks running at once (from task start/end
times in the pool, and sampled) against the pool's slots, CPU seconds of the scheduler, the task
processes (LocalExecutor workers and what they run), the DAG processor, the api-server, the
Spark Connect server and the rest, peak memory (PSS, and the machine's memory in use), the
kernel's OOM kills, failed or retried tasks and the ERROR lines the Airflow services logged.

At the end it restores the topics file byte for byte and (unless `--keep`) deletes the fleet's
Kafka topics, its archive folders, its DAGs' metadata and lag Variables, also when interrupted.

    .venv/bin/python benchmarks/fleet.py [--topics 100] [--records 20]
        [--fire trigger|schedule|records] [--max-delay 15] [--idle-minutes 0]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from croniter import croniter

from cairn.config import INCLUDE_DIR, TopicConfig
from cairn.dag_ids import dag_id
from cairn.pipeline import run_record
from cairn.protocol import commit
from cairn.storage.layout import head_key
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from cairn_airflow.dag_parse import parse_again
from cairn_stack import services
from cairn_stack.airflow_api import AirflowAPI
from cairn_stack.demo import create_topic, produce, sample_events
from cairn_stack.settings import StackSettings

PREFIX = "cairn.fleet."
SCHEMA = INCLUDE_DIR / "schemas" / "demo_event.avsc"
DAGS = INCLUDE_DIR.parent / "dags"
"""The DAG files the stack parses: the fleet's topics file changes are marked on them at once."""
ARCHIVE_KINDS = ("backup", "partitioned", "quarantine")
STATE_DIRS = ("_tokens", "_publishing", "_claims", "_attempts", "_manifests", "_status")
AIRFLOW_LOGS = ("airflow-scheduler", "airflow-dag-processor", "airflow-api-server")


def say(message: str) -> None:
    """Progress, on stderr (stdout is the result)."""
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def topic_names(count: int) -> list[str]:
    return [f"{PREFIX}t{i:03d}" for i in range(count)]


def archive_id(topic: str) -> str:
    return dag_id("archive", topic)


def interval_seconds(schedule: str) -> float:
    """The time between two firings of a cron (the topics' schedule interval)."""
    it = croniter(schedule, datetime(2025, 1, 1, tzinfo=UTC))
    first = it.get_next(datetime)
    return (it.get_next(datetime) - first).total_seconds()


def query(api: AirflowAPI, path: str, key: str, **params: Any) -> list[dict]:
    """Every row of a paged list endpoint (`limit`/`offset`). A page the API server fails to
    serve (under load it has answered 500, "Database error") is asked for again, up to 3 times,
    so that a sitting's report is not lost to one failed page."""
    rows: list[dict] = []
    while True:
        qs = urllib.parse.urlencode({**params, "limit": 100, "offset": len(rows)}, doseq=True)
        for attempt in range(3):
            try:
                page = api.call("GET", f"{path}?{qs}")
                break
            except (RuntimeError, OSError):
                if attempt == 2:
                    raise
                time.sleep(10)
        rows += page[key]
        if not page[key] or len(rows) >= page["total_entries"]:
            return rows


def fleet_task_instances(api: AirflowAPI, since: datetime, **params: Any) -> list[dict]:
    return query(
        api,
        "/api/v2/dags/~/dagRuns/~/taskInstances",
        "task_instances",
        start_date_gte=since.isoformat(),
        **params,
    )


def unfinished_fleet_runs(api: AirflowAPI) -> list[dict]:
    runs = query(api, "/api/v2/dags/~/dagRuns", "dag_runs", state=["queued", "running"])
    return [r for r in runs if PREFIX in r["dag_id"]]


# --- the topics file ------------------------------------------------------------------------


def add_topics(path: Path, settings: dict[str, dict[str, Any]]) -> bytes:
    """Append an entry per topic to the topics file, with its own `settings` (how it runs:
    `run_settings`); returns the file's original bytes to restore."""
    original = path.read_bytes()
    data = yaml.safe_load(original) or {}
    entries = data.setdefault("topics", [])
    leftover = [e.get("topic") for e in entries if str(e.get("topic", "")).startswith(PREFIX)]
    if leftover:
        raise SystemExit(f"{path} already has fleet entries ({leftover[:3]}…); remove them first")
    entries += [
        {
            "topic": name,
            "format": "json",
            "schema": str(SCHEMA),
            "event_time": {"field": "ts", "encoding": "iso8601"},
            **more,
        }
        for name, more in settings.items()
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_topics(path)
    if loaded.errors:
        path.write_bytes(original)
        raise SystemExit(f"the fleet's entries do not load: {loaded.errors[:3]}")
    parse_again(DAGS, "the fleet's topics were added")  # as cairn_config_watch would, at once
    return original


def run_settings(schedule: str, max_delay: float | None) -> dict[str, Any]:
    """An entry's keys to run on `schedule`, or when records wait `max_delay` seconds (not None)."""
    if max_delay is None:
        return {"run_on": "schedule", "schedule": schedule}
    return {"run_on": "records", "max_delay": f"{max_delay:g}s"}


def fleet_configs(path: Path) -> dict[str, TopicConfig]:
    return {c.topic: c for c in load_topics(path).topics if c.topic and c.topic.startswith(PREFIX)}


# --- Kafka ----------------------------------------------------------------------------------


def end_offsets(bootstrap: str, names: list[str]) -> dict[str, dict[int, int]]:
    """Each topic's high watermark per partition."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cairn-fleet-benchmark"})
    try:
        return {
            t: {
                p: consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
                for p in meta[t].partitions
            }
            for t in names
        }
    finally:
        consumer.close()


def open_storage(cfg: TopicConfig) -> Storage:
    """The topic's archive root: a folder, or the stack's S3 server (SeaweedFS)."""
    return _root(cfg.root.storage_url, cfg.root.scheme == "s3")


@functools.cache
def _root(url: str, s3: bool) -> Storage:
    return Storage(url, **(services.s3_options(StackSettings()) if s3 else {}))


def drop_archive(cfgs: dict[str, TopicConfig]) -> None:
    for topic, cfg in cfgs.items():
        storage = open_storage(cfg)
        for folder in (*ARCHIVE_KINDS, *STATE_DIRS):
            storage.delete_prefix(f"{folder}/{topic}")
        storage.delete(f"_complete/{topic}.json")
        storage.delete(head_key(topic))


# --- sampling the stack's processes -----------------------------------------------------------


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _cpu(proc: psutil.Process, children: bool = True) -> float:
    """CPU seconds of a process, with (by default) those of its children it has reaped: summed
    over a process tree that is every process the tree ever ran, even short-lived ones."""
    t = proc.cpu_times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


def _memory(proc: psutil.Process, forked: bool) -> float:
    """Bytes of memory: PSS (shared pages split between their sharers) for the scheduler's
    forked processes, whose RSS would count the 32 LocalExecutor workers' shared pages 32 times
    over; RSS for the rest (PSS costs a walk of the process's page tables)."""
    return proc.memory_full_info().pss if forked else proc.memory_info().rss


def stack_processes(settings: StackSettings) -> dict[str, int]:
    """Each running service's pid (its process group leader). Once: building the services
    rewrites their configuration files."""
    found = {}
    for service in services.all_services(settings):
        pid = service.pid()
        if pid is not None:
            found[service.name] = pid
    return found


def group(name: str) -> str:
    return name.removeprefix("airflow-")


def cpu_snapshot(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far per group: the scheduler's own process apart from the processes it
    forks (LocalExecutor workers, which supervise and run the tasks)."""
    out: dict[str, float] = {}
    for name, pid in roots.items():
        procs = []
        with contextlib.suppress(psutil.Error):
            procs = _tree(pid)
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += _cpu(proc)
        if name == "airflow-scheduler" and procs:
            own = 0.0
            with contextlib.suppress(psutil.Error):
                own = _cpu(procs[0], children=False)
            out["scheduler"], out["tasks"] = own, total - own
        else:
            out[group(name)] = total
    return out


@dataclass
class Sampler:
    """Every `interval` seconds the pool's occupancy and the machine's memory in use; every
    `process_every` samples the memory of each group of the stack's processes and in all."""

    settings: StackSettings
    roots: dict[str, int]
    interval: float = 2.0
    process_every: int = 3
    """Walk the process trees every this many samples (it costs ~0.3 s of CPU)."""
    peak_memory: dict[str, float] = field(default_factory=dict)
    peak_total_memory: float = 0.0
    min_available: float = float("inf")
    peak_used: float = 0.0
    pool_running_max: int = 0
    pool_waiting_max: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        api = AirflowAPI(self.settings)
        pool_path = f"/api/v2/pools/{self.settings.spark_pool}"
        for tick in itertools.count():
            if self._stop.wait(self.interval):
                return
            self._pool(api, pool_path)
            memory = psutil.virtual_memory()
            self.min_available = min(self.min_available, memory.available / 2**20)
            self.peak_used = max(self.peak_used, (memory.total - memory.available) / 2**20)
            if tick % self.process_every == 0:
                self._processes()
            self.samples += 1

    def _pool(self, api: AirflowAPI, path: str) -> None:
        with contextlib.suppress(Exception):
            pool = api.call("GET", path)
            self.pool_running_max = max(self.pool_running_max, pool["running_slots"])
            waiting = pool["queued_slots"] + pool["scheduled_slots"]
            self.pool_waiting_max = max(self.pool_waiting_max, waiting)

    def _processes(self) -> None:
        total = 0.0
        for name, pid in self.roots.items():
            used: dict[str, float] = {}
            with contextlib.suppress(psutil.Error):
                for i, proc in enumerate(_tree(pid)):
                    key = "tasks" if name == "airflow-scheduler" and i else group(name)
                    with contextlib.suppress(psutil.Error):
                        mb = _memory(proc, name == "airflow-scheduler") / 2**20
                        used[key] = used.get(key, 0.0) + mb
            for key, mb in used.items():
                self.peak_memory[key] = max(self.peak_memory.get(key, 0.0), mb)
                total += mb
        self.peak_total_memory = max(self.peak_total_memory, total)


def own_cpu() -> float:
    """CPU seconds of this benchmark (sampling and polling included)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def task_log_events(settings: StackSettings, since: datetime) -> dict[str, Any]:
    """From the fleet's task logs after `since`: how long each task took to parse the DAG file
    before running (Airflow's `dag_file_parse_ms`; every task parses the whole file, all the
    topics' DAGs), and how many task starts failed on a DAG file import timeout or were put
    back to `up_for_reschedule` because their DAG was not found."""
    logs = settings.state_dir / "airflow" / "logs"
    parse_ms: list[float] = []
    timeouts = rescheduled = 0
    stamp = since.strftime("%Y-%m-%dT%H:%M:%S")
    for path in logs.glob(f"dag_id=*{PREFIX}*/**/*.log"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("timestamp", "") < stamp:
                    continue
                text = str(event.get("event", ""))
                if text == "Worker startup parse complete":
                    parse_ms.append(event["dag_file_parse_ms"])
                timeouts += "DagBag import timeout" in text
                rescheduled += text.startswith("Rescheduling task during startup")
    return {
        "task_dag_parse_seconds": spread([ms / 1000 for ms in parse_ms]),
        "task_dag_import_timeouts": timeouts,
        "task_starts_rescheduled": rescheduled,
    }


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def log_offsets(settings: StackSettings) -> dict[str, int]:
    logs = settings.state_dir / "logs"
    return {
        n: (logs / f"{n}.log").stat().st_size for n in AIRFLOW_LOGS if (logs / f"{n}.log").exists()
    }


def new_errors(settings: StackSettings, since: dict[str, int]) -> dict[str, list[str]]:
    """ERROR lines each Airflow service logged after `since` (byte offsets)."""
    found = {}
    for name, offset in since.items():
        with open(settings.state_dir / "logs" / f"{name}.log", "rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        found[name] = [ln for ln in lines if "ERROR" in ln or ln.startswith("Traceback")]
    return found


# --- the measurement ------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float]) -> dict[str, float | None]:
    return {
        "n": len(values),
        "median": pct(values, 0.5),
        "p90": pct(values, 0.9),
        "max": max(values) if values else None,
    }


def gap(ti: dict, first: str, then: str) -> float | None:
    """Seconds between two of a task instance's timestamps, None if one is missing."""
    if not ti[first] or not ti[then]:
        return None
    return (datetime.fromisoformat(ti[then]) - datetime.fromisoformat(ti[first])).total_seconds()


def ti_label(ti: dict) -> str:
    return (
        f"{ti['dag_id']} {ti['dag_run_id']} {ti['task_id']} try {ti['try_number']}: {ti['state']}"
    )


def max_overlap(tis: list[dict]) -> int:
    """The most task instances running at the same moment (start/end times)."""
    events = []
    for ti in tis:
        if ti["start_date"] is None:
            continue
        start = datetime.fromisoformat(ti["start_date"])
        end = datetime.fromisoformat(ti["end_date"]) if ti["end_date"] else datetime.now(UTC)
        events += [(start, 1), (end, -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start
        running += step
        peak = max(peak, running)
    return peak


def wait_for_fleet_dags(api: AirflowAPI, names: list[str], timeout: float) -> float:
    """Wait until the DAG processor has parsed every archive and rebuild DAG (a new rebuild DAG
    gets a scheduled run at once: `wait_settled` waits for those); unpause them. Seconds taken."""
    started = time.monotonic()
    wanted = {dag_id(kind, t) for t in names for kind in ("archive", "rebuild")}
    while True:
        try:
            dags = query(api, "/api/v2/dags", "dags", dag_id_pattern=PREFIX)
        except OSError:  # an overloaded api-server times out (30 s): ask again
            continue
        parsed = {d["dag_id"] for d in dags} & wanted
        if parsed == wanted:
            break
        if time.monotonic() - started > timeout:
            errors = api.call("GET", "/api/v2/importErrors")
            raise TimeoutError(f"{len(parsed)}/{len(wanted)} DAGs parsed in {timeout}s; {errors}")
        time.sleep(3)
    for dag in dags:
        if dag["dag_id"] in wanted and dag["is_paused"]:
            api.call("PATCH", f"/api/v2/dags/{dag['dag_id']}", {"is_paused": False})
    return time.monotonic() - started


def wait_settled(api: AirflowAPI, timeout: float, min_wait: float = 0) -> tuple[float, int]:
    """Wait until no run of a fleet DAG is queued or running (a new DAG's first runs), and at
    least `min_wait` seconds (the scheduler creates those runs a little after parsing).
    Returns the seconds taken and how many runs were seen unfinished."""
    started, seen = time.monotonic(), set()
    while time.monotonic() - started < timeout:
        time.sleep(5)
        try:
            runs = unfinished_fleet_runs(api)
        except OSError:  # an overloaded api-server times out (30 s): ask again
            continue
        seen |= {(r["dag_id"], r["dag_run_id"]) for r in runs}
        if not runs and time.monotonic() - started > min_wait:
            return time.monotonic() - started, len(seen)
    raise TimeoutError(f"fleet runs still unfinished after {timeout}s")


def wait_caught_up(
    cfgs: dict[str, TopicConfig],
    ends: dict[str, dict[int, int]],
    timeout: float,
    done: dict[str, datetime],
) -> None:
    """Poll the archive until each topic's newest token covers its end offsets, filling `done`
    with the tokens' commit times. Topics not caught up within `timeout` are left out."""
    deadline = time.monotonic() + timeout
    while len(done) < len(ends) and time.monotonic() < deadline:
        for topic in sorted(set(ends) - set(done)):
            token = commit.newest(open_storage(cfgs[topic]), topic)
            if token is not None and all(
                token.next_offsets.get(p, 0) >= end for p, end in ends[topic].items()
            ):
                done[topic] = token.created_at.astimezone(UTC)
        time.sleep(5)  # the time is the token's, so polling more often gains nothing


def spark_jobs(
    cfgs: dict[str, TopicConfig], topics: list[str], since: datetime, limit: int = 50
) -> dict[str, int]:
    """The Spark jobs that staged the fleet's runs committed since `since` (from each run
    record's `spark_job`: runs of one shared job have one tag; a run without one, its own),
    among each topic's newest `limit` runs."""
    tags: list[str] = []
    for topic in topics:
        for record in run_record.recent(open_storage(cfgs[topic]), topic, limit):
            if record.committed_at >= since and record.counts.read:
                tags.append(record.spark_job.tag if record.spark_job else record.run_id)
    return {"runs_with_records": len(tags), "spark_jobs": len(set(tags))}


def restore(
    path: Path,
    original: bytes,
    api: AirflowAPI,
    settings: StackSettings,
    names: list[str],
    cfgs: dict[str, TopicConfig],
    keep: bool,
) -> list[str]:
    """Restore the topics file byte for byte, then (unless `keep`) delete the fleet's topics,
    archive, DAG metadata and Variables. Best effort, never raising (a failed cleanup must not
    hide the measurement); returns what could not be done."""
    path.write_bytes(original)
    parse_again(DAGS, "the fleet's topics were removed")
    say(f"{path} restored; cleaning up")
    if keep:
        return []
    try:
        return _remove(api, settings, names, cfgs)
    except Exception as err:
        return [f"cleanup failed: {type(err).__name__}: {err}"]


def _remove(
    api: AirflowAPI, settings: StackSettings, names: list[str], cfgs: dict[str, TopicConfig]
) -> list[str]:
    notes: list[str] = []
    ids = [dag_id(kind, t) for t in names for kind in ("archive", "rebuild")]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # the DAG processor must drop them first
        with contextlib.suppress(RuntimeError):
            if all(api.call("GET", f"/api/v2/dags/{i}")["is_stale"] for i in (ids[0], ids[-1])):
                break
        time.sleep(5)
    for each in ids:
        try:
            api.call("DELETE", f"/api/v2/dags/{each}")
        except RuntimeError as err:
            if ": 404 " not in str(err):
                notes.append(f"DAG {each} not deleted: {err}")
    for topic in names:
        with contextlib.suppress(RuntimeError):
            api.call("DELETE", f"/api/v2/variables/cairn_time_lag.{topic}")
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    existing = set(admin.list_topics(timeout=30).topics)
    doomed = [t for t in names if t in existing]
    for topic, future in (admin.delete_topics(doomed) if doomed else {}).items():
        try:
            future.result(timeout=60)
        except Exception as err:
            notes.append(f"Kafka topic {topic} not deleted: {err}")
    drop_archive(cfgs)
    return notes


def idle_cost(api: AirflowAPI, roots: dict[str, int], seconds: float) -> dict[str, Any]:
    """CPU of the stack's processes and the fleet's runs started while no record arrives."""
    say(f"idle for {seconds:.0f} s: measuring what the fleet costs with nothing to archive")
    since = datetime.now(UTC)
    before = cpu_snapshot(roots)
    time.sleep(seconds)
    after = cpu_snapshot(roots)
    runs = query(api, "/api/v2/dags/~/dagRuns", "dag_runs", run_after_gte=since.isoformat())
    return {
        "idle_seconds": round(seconds),
        "idle_cpu_cores": {k: round((after.get(k, 0) - v) / seconds, 3) for k, v in before.items()},
        "idle_fleet_runs": len([r for r in runs if PREFIX in r["dag_id"]]),
    }


def measure(args: argparse.Namespace, settings: StackSettings, api: AirflowAPI) -> dict:
    names = topic_names(args.topics)
    path = settings.topics_file
    interval = interval_seconds(args.schedule)
    result: dict[str, Any] = {
        "topics": args.topics,
        "partitions": args.partitions,
        "records_per_topic": args.records,
        "schedule": args.schedule,
        "interval_seconds": interval,
        "fire": args.fire,
        "topics_file": str(path),
        "spark_conn_type": settings.spark_conn_type,
    }
    existing = set(
        AdminClient({"bootstrap.servers": settings.bootstrap_servers})
        .list_topics(timeout=30)
        .topics
    )
    result["max_delay"] = max_delay = args.max_delay if args.fire == "records" else None
    original = add_topics(path, {n: run_settings(args.schedule, max_delay) for n in names})
    cfgs = fleet_configs(path)
    try:
        drop_archive({t: c for t, c in cfgs.items() if t not in existing})  # a fresh topic's
        for topic in names:
            create_topic(settings.bootstrap_servers, topic, partitions=args.partitions)
        say(f"{len(names)} topics created and configured in {path}; waiting for the DAGs")
        result["parse_seconds"] = round(wait_for_fleet_dags(api, names, args.parse_timeout), 1)
        say(f"DAGs parsed in {result['parse_seconds']} s; waiting for their first runs to end")
        try:
            settle, first_runs = wait_settled(api, args.settle_timeout, min_wait=30)
            result["settle_seconds"], result["runs_on_creation"] = round(settle, 1), first_runs
        except TimeoutError:
            result["settle_seconds"] = None
            result["runs_on_creation"] = len(unfinished_fleet_runs(api))
            say(f"not settled in {args.settle_timeout} s; the burst goes on regardless")

        roots = stack_processes(settings)
        if args.idle_minutes:
            result |= idle_cost(api, roots, args.idle_minutes * 60)
        sampler = Sampler(settings, roots)
        cpu_before, ooms_before, own_before = cpu_snapshot(roots), oom_kills(), own_cpu()
        logs_before = log_offsets(settings)
        memory = psutil.virtual_memory()
        used_before = (memory.total - memory.available) / 2**20
        sampler.start()
        say("burst")
        burst = datetime.now(UTC)
        started = time.monotonic()
        seed = time.time_ns()
        with ThreadPoolExecutor(16) as pool:  # a producer per topic; together, not in turn
            list(
                pool.map(
                    lambda i: produce(
                        settings.bootstrap_servers,
                        names[i],
                        sample_events(args.records, burst, seed=seed + i),
                    ),
                    range(len(names)),
                )
            )
        result["produce_seconds"] = round(time.monotonic() - started, 1)
        ends = end_offsets(settings.bootstrap_servers, names)
        if args.fire == "trigger":
            for topic in names:
                api.trigger(archive_id(topic))
            result["trigger_seconds"] = round(time.monotonic() - started, 1)
        say("waiting until every topic's token covers the burst")
        committed: dict[str, datetime] = {}
        try:
            wait_caught_up(cfgs, ends, args.timeout, committed)
            say(f"{len(committed)}/{len(names)} caught up; waiting for the runs to finish")
            # The runs may still be finishing their last tasks (complete, announce, health).
            with contextlib.suppress(TimeoutError):
                wait_settled(api, 600)
        except KeyboardInterrupt:  # Ctrl-C or `kill`: report what was measured so far
            result["interrupted"] = True
            say("interrupted: reporting what was measured so far")
        caught_seconds = [(at - burst).total_seconds() for at in committed.values()]
        sampler.stop()
        cpu_after = cpu_snapshot(roots)
        window = time.monotonic() - started

        tis = fleet_task_instances(api, burst)
        fleet_tis = [ti for ti in tis if ti["dag_id"].startswith(archive_id(PREFIX))]
        archive = [ti for ti in fleet_tis if ti["task_id"] == "archive" and ti["duration"]]
        # a task a worker ran names it; an archive task that started and ended in the
        # triggerer names none and never took a slot of the pool
        pool_tis = [
            ti
            for ti in fleet_task_instances(api, burst, pool=settings.spark_pool)
            if ti["hostname"]
        ]

        # scheduled → queued: waiting for a pool slot; queued → start: the executor's start.
        waits = [w for ti in archive if (w := gap(ti, "scheduled_when", "queued_when")) is not None]
        starts = [w for ti in archive if (w := gap(ti, "queued_when", "start_date")) is not None]
        runs = {(ti["dag_id"], ti["dag_run_id"]) for ti in fleet_tis}
        ran = [ti for ti in fleet_tis if ti["duration"] and ti["state"] != "skipped"]
        bad = [
            ti_label(ti)
            for ti in fleet_tis
            if ti["state"] not in ("success", "skipped") or ti["try_number"] > 1
        ]
        pool = api.call("GET", f"/api/v2/pools/{settings.spark_pool}")
        errors = new_errors(settings, logs_before)
        result |= task_log_events(settings, burst)
        result |= spark_jobs(cfgs, sorted(committed), burst)
        result |= {
            "burst_start": burst.isoformat(),
            "caught_up": len(committed),
            "not_caught_up": sorted(set(names) - set(committed)),
            "all_caught_up_seconds": round(max(caught_seconds), 1)
            if len(committed) == len(names)
            else None,
            "caught_up_seconds": spread(caught_seconds),
            "all_caught_up_intervals": round(max(caught_seconds) / interval, 2)
            if len(committed) == len(names)
            else None,
            "runs": len(runs),
            "tasks_run": len(ran),
            "tasks_on_workers": len([ti for ti in ran if ti["hostname"]]),
            "task_seconds_per_run": round(sum(ti["duration"] for ti in ran) / max(len(runs), 1), 1),
            "archive_task_seconds": spread([ti["duration"] for ti in archive]),
            "archive_wait_for_slot_seconds": spread(waits),
            "archive_queued_to_start_seconds": spread(starts),
            "pool_slots": pool["slots"],
            "max_concurrent_spark_tasks": max_overlap(pool_tis),
            "max_running_slots_sampled": sampler.pool_running_max,
            "max_waiting_for_pool_sampled": sampler.pool_waiting_max,
            "window_seconds": round(window, 1),
            "cpu_seconds": {k: round(cpu_after.get(k, 0.0) - v, 1) for k, v in cpu_before.items()},
            "benchmark_cpu_seconds": round(own_cpu() - own_before, 1),
            "peak_memory_mb": {k: round(v) for k, v in sorted(sampler.peak_memory.items())},
            "peak_total_memory_mb": round(sampler.peak_total_memory),
            "memory_used_before_mb": round(used_before),
            "peak_memory_used_mb": round(sampler.peak_used),
            "min_available_mb": round(sampler.min_available),
            "oom_kills": oom_kills() - ooms_before,
            "failed_or_retried_tasks": bad,
            "log_errors": {k: len(v) for k, v in errors.items()},
            "log_error_examples": {k: v[:3] for k, v in errors.items() if v},
            "load_average": os.getloadavg(),
        }
        return result
    finally:
        result["cleanup_notes"] = restore(path, original, api, settings, names, cfgs, args.keep)


def show(r: dict) -> None:
    def s(d: dict) -> str:
        if not d["n"]:
            return "-"
        return f"median {d['median']:.1f}  p90 {d['p90']:.1f}  max {d['max']:.1f} s (n={d['n']})"

    memory = r["peak_memory_mb"]
    target = r["all_caught_up_intervals"] is not None and r["all_caught_up_intervals"] <= 2
    within_pool = r["max_concurrent_spark_tasks"] <= r["pool_slots"]
    print(
        f"Fleet: {r['topics']} topics × {r['partitions']} partition(s), {r['records_per_topic']} "
        f"records each, schedule {r['schedule']} (interval {r['interval_seconds']:.0f} s), "
        f"fired by {r['fire']}"
        + (f" (max_delay {r['max_delay']:g} s)" if r.get("max_delay") else "")
        + f", Spark: {r['spark_conn_type']}"
    )
    if r["settle_seconds"] is None:
        settled = f"{r['runs_on_creation']} of their first runs still unfinished at the burst"
    else:
        settled = f"their {r['runs_on_creation']} first runs ended {r['settle_seconds']} s later"
    print(f"  DAGs parsed in {r['parse_seconds']} s; {settled}")
    if r.get("interrupted"):
        print("  INTERRUPTED while waiting: the figures cover the burst until then")
    fired = (
        f", all triggered {r['trigger_seconds']} s after its start"
        if r["fire"] == "trigger"
        else ""
    )
    if "idle_seconds" in r:
        cores = ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(r["idle_cpu_cores"].items(), key=lambda kv: -kv[1])
        )
        print(
            f"  idle {r['idle_seconds']} s: {r['idle_fleet_runs']} fleet runs started; "
            f"cores {sum(r['idle_cpu_cores'].values()):.3f} ({cores})"
        )
    print(f"  burst: produced in {r['produce_seconds']} s{fired}")
    rows = [
        (
            "burst → all caught up",
            f"{r['all_caught_up_seconds']} s = {r['all_caught_up_intervals']} intervals "
            f"({'meets' if target else 'misses'} ≤ 2)"
            if r["all_caught_up_seconds"] is not None
            else f"{r['caught_up']}/{r['topics']} caught up; not: {r['not_caught_up'][:5]}",
        ),
        ("burst → topic caught up", s(r["caught_up_seconds"])),
        (
            "archive runs / tasks run",
            f"{r['runs']} / {r['tasks_run']} ({r['task_seconds_per_run']} task-seconds per run; "
            f"{r['tasks_on_workers']} on workers, the rest in the triggerer)",
        ),
        (
            "Spark jobs / runs with records",
            f"{r['spark_jobs']} / {r['runs_with_records']} (runs of one shared job count once)",
        ),
        ("archive task (Spark work)", s(r["archive_task_seconds"])),
        ("archive task waiting for a slot", s(r["archive_wait_for_slot_seconds"])),
        ("archive task queued → started", s(r["archive_queued_to_start_seconds"])),
        ("DAG file parse at each task start", s(r["task_dag_parse_seconds"])),
        (
            "task starts lost",
            f"{r['task_dag_import_timeouts']} DAG file import timeouts (30 s), "
            f"{r['task_starts_rescheduled']} put back to up_for_reschedule",
        ),
        (
            "most Spark tasks at once",
            f"{r['max_concurrent_spark_tasks']} (sampled {r['max_running_slots_sampled']}) of "
            f"{r['pool_slots']} pool slots ({'within' if within_pool else 'EXCEEDS'} the pool); "
            f"up to {r['max_waiting_for_pool_sampled']} waiting",
        ),
        ("measured window", f"{r['window_seconds']} s"),
        *[
            (f"CPU {k}", f"{v:8.1f} s  ({v / r['window_seconds']:.2f} cores)")
            for k, v in sorted(r["cpu_seconds"].items(), key=lambda kv: -kv[1])
        ],
        ("CPU all of the stack", f"{sum(r['cpu_seconds'].values()):8.1f} s"),
        ("CPU this benchmark", f"{r['benchmark_cpu_seconds']:8.1f} s (sampling, polling)"),
        (
            "peak memory of the stack (PSS/RSS)",
            f"{r['peak_total_memory_mb']} MB; "
            + ", ".join(f"{k} {v}" for k, v in sorted(memory.items(), key=lambda kv: -kv[1])),
        ),
        (
            "machine memory in use",
            f"{r['memory_used_before_mb']} MB before the burst, peak {r['peak_memory_used_mb']} MB "
            f"(all processes); least available {r['min_available_mb']} MB; "
            f"OOM kills: {r['oom_kills']}",
        ),
        ("failed or retried tasks", str(len(r["failed_or_retried_tasks"]))),
        ("ERROR lines in Airflow logs", ", ".join(f"{k} {v}" for k, v in r["log_errors"].items())),
        ("1-minute load average", f"{r['load_average'][0]:.1f} (2 cores)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    for line in r["failed_or_retried_tasks"][:20]:
        print(f"    {line}")
    for name, lines in r["log_error_examples"].items():
        for line in lines:
            print(f"    {name}: {line[:300]}")
    for note in r["cleanup_notes"]:
        print(f"  cleanup: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100, help="topics in the fleet")
    parser.add_argument("--partitions", type=int, default=1, help="partitions per topic")
    parser.add_argument("--records", type=int, default=20, help="records per topic in the burst")
    parser.add_argument("--schedule", default="*/10 * * * *", help="each topic's schedule")
    parser.add_argument(
        "--fire",
        choices=["trigger", "schedule", "records"],
        default="trigger",
        help="trigger every archive DAG at once after the burst, wait for the schedules, or "
        "run the topics when records wait (run_on: records, --max-delay)",
    )
    parser.add_argument(
        "--max-delay", type=float, default=15, help="--fire records: each topic's max_delay (s)"
    )
    parser.add_argument(
        "--idle-minutes",
        type=float,
        default=0,
        help="before the burst, measure the stack's CPU and the fleet's runs while idle",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to catch up")
    parser.add_argument("--parse-timeout", type=float, default=600, help="seconds to parse DAGs")
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=900,
        help="seconds to wait for the new DAGs' first runs before the burst",
    )
    run(parser, measure, show)


def run(
    parser: argparse.ArgumentParser,
    measured: Callable[[argparse.Namespace, StackSettings, AirflowAPI], dict],
    shown: Callable[[dict], None],
) -> None:
    """Measure on the running stack with the arguments of `parser` (and `--keep`, `--json`),
    then print the result."""
    parser.add_argument(
        "--keep", action="store_true", help="keep the topics, archive and DAG metadata"
    )
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    args = parser.parse_args()
    # A plain `kill` acts as Ctrl-C: while waiting for the fleet to catch up it stops waiting and
    # reports; at any time the topics file is restored and the fleet cleaned up.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    settings = StackSettings()
    result = measured(args, settings, AirflowAPI(settings))
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        shown(result)


if __name__ == "__main__":
    main()
