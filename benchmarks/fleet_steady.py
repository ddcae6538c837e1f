"""A mixed fleet under steady load through the real stack: each group's produce → archived delay.

Issue #30's measure: 1,000 topics for 30 minutes, 10 busy ones (about 500 records/s each,
`max_delay: 15s`), 90 warm ones (about 5 records/s, `max_delay: 60s`) and 900 cold ones (a record
every few minutes, Cairn's default settings). `--scale` keeps that fraction of each group's
topics (0.1: 1, 9 and 90) where the machine cannot hold them all; `--run-on schedule` runs every
topic on a cron instead (`--schedule`), today's design before `run_on: records`, for the
comparison in the same sitting.

Needs the running local stack (`make up` first). The fleet's topics are archived to the stack's S3
server (SeaweedFS), whose own counters give the object-storage requests. Steps: create the topics
and their entries (as `fleet.py`), wait for the DAG processor to parse their DAGs and for the runs
Airflow starts for new DAGs to end, then produce at each group's rate for `--minutes`, then wait
until every topic's token covers what was produced (`--drain-timeout`).

Freshness: one record a second per topic is sampled as delivered (its Kafka timestamp, partition
and offset); its delay is the commit time of the first token covering it minus that timestamp.
Reports per group p50/p95/max and samples not archived; over the production window, per hour and
per archived record: task instances (and those a worker ran), archive runs, Spark jobs, S3
requests; the stack's CPU per service, peak memory, and the DAG processor's time to parse the
fleet. At the end it restores the topics file and deletes what it created (as `fleet.py`).

    .venv/bin/python benchmarks/fleet_steady.py [--scale 0.1] [--minutes 30]
        [--run-on records|schedule] [--schedule '*/10 * * * *']
"""

from __future__ import annotations

import argparse
import contextlib
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer
from fleet import (
    PREFIX,
    Sampler,
    add_topics,
    cpu_snapshot,
    drop_archive,
    end_offsets,
    fleet_configs,
    fleet_task_instances,
    open_storage,
    pct,
    restore,
    run,
    run_settings,
    say,
    spark_jobs,
    stack_processes,
    wait_caught_up,
    wait_for_fleet_dags,
    wait_settled,
)
from requests_per_run import s3_requests

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn.protocol import tokens
from cairn_stack.airflow_api import AirflowAPI
from cairn_stack.demo import create_topic, sample_events
from cairn_stack.settings import StackSettings


@dataclass(frozen=True)
class Group:
    name: str
    topics: int
    rate: float
    """Records a second per topic."""
    max_delay: float | None
    """None: Cairn's default (not the topics file's `defaults`)."""


GROUPS = (
    Group("busy", 10, 500.0, 15.0),
    Group("warm", 90, 5.0, 60.0),
    Group("cold", 900, 1 / 180, None),
)


def fleet(scale: float) -> dict[str, Group]:
    """Each topic's group: `scale` of each group's topics, at least one."""
    found, n = {}, 0
    for g in GROUPS:
        for _ in range(max(1, round(g.topics * scale))):
            found[f"{PREFIX}{g.name}.t{n:04d}"] = g
            n += 1
    return found


@dataclass
class Load:
    """Produces each topic's records at its group's rate (cold topics: at random moments, on
    average `1 / rate` apart), sampling one delivered record a second per topic."""

    bootstrap: str
    rates: dict[str, float]
    samples: defaultdict[str, list[tuple[int, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    delivered: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _last: dict[str, float] = field(default_factory=dict)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        topic, now = msg.topic(), time.monotonic()
        self.delivered[topic] += 1
        if now - self._last.get(topic, float("-inf")) >= 1.0:
            self._last[topic] = now
            self.samples[topic].append((msg.partition(), msg.offset(), msg.timestamp()[1]))

    def run(self, seconds: float, stop: threading.Event) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 50,
                "compression.type": "lz4",
                "enable.idempotence": True,
            }
        )
        values = list(sample_events(5000, datetime.now(UTC)))
        rng = random.Random(7)
        due = {t: rng.expovariate(r) for t, r in self.rates.items() if r < 1}
        owed = dict.fromkeys(self.rates, 0.0)
        started = last = time.monotonic()
        i = 0
        while not stop.is_set() and (now := time.monotonic()) - started < seconds:
            elapsed, last = now - last, now
            for topic, rate in self.rates.items():
                if topic in due:
                    n = 0
                    while due[topic] <= now - started:
                        n, due[topic] = n + 1, due[topic] + rng.expovariate(rate)
                else:
                    owed[topic] += rate * elapsed
                    n = int(owed[topic])
                    owed[topic] -= n
                for _ in range(n):
                    i += 1
                    while True:
                        try:
                            producer.produce(
                                topic, value=values[i % len(values)], on_delivery=self._on_delivery
                            )
                            break
                        except BufferError:
                            producer.poll(0.05)
            producer.poll(0)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - now)))
        if producer.flush(120):
            self.errors.append("records still unsent after 120 s")


def delays(
    storage_of: dict[str, Any], samples: dict[str, list[tuple[int, int, int]]]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per topic, each sampled record's seconds from its Kafka timestamp to the commit of the
    first token covering it; and how many sampled records no token covers."""
    found: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    for topic, sampled in samples.items():
        chain = tokens.list_tokens(storage_of[topic], topic)
        found[topic], missing[topic] = [], 0
        for partition, offset, ts_ms in sampled:
            first = next((t for t in chain if t.next_offsets.get(partition, 0) > offset), None)
            if first is None:
                missing[topic] += 1
            else:
                found[topic].append(first.created_at.timestamp() - ts_ms / 1000)
    return found, missing


def measure(args: argparse.Namespace, settings: StackSettings, api: AirflowAPI) -> dict:
    groups = fleet(args.scale)
    names = sorted(groups)
    path = settings.topics_file
    root = f"s3://{settings.s3_conn_id}@{settings.bucket}/fleet"

    def entry(g: Group) -> dict[str, Any]:
        if args.run_on == "schedule":
            how = run_settings(args.schedule, None)
        else:
            default = TopicConfig.model_fields["max_delay"].default.total_seconds()
            how = run_settings("", g.max_delay or default)
        return {"archive_root": root, **how}

    original = add_topics(path, {n: entry(groups[n]) for n in names})
    cfgs = fleet_configs(path)
    result: dict[str, Any] = {
        "scale": args.scale,
        "run_on": args.run_on,
        "schedule": args.schedule if args.run_on == "schedule" else None,
        "minutes": args.minutes,
        "groups": {
            g.name: {
                "topics": sum(1 for n in names if groups[n] is g),
                "records_per_second": g.rate,
                "max_delay_seconds": next(
                    cfgs[n].max_delay.total_seconds() for n in names if groups[n] is g
                ),
            }
            for g in GROUPS
        },
    }
    storage_of = {t: open_storage(cfgs[t]) for t in names}
    try:
        drop_archive(cfgs)  # what an interrupted sitting may have left
        for topic in names:
            create_topic(settings.bootstrap_servers, topic, partitions=1)
        say(f"{len(names)} topics created and configured in {path}; waiting for the DAGs")
        result["parse_seconds"] = round(wait_for_fleet_dags(api, names, args.parse_timeout), 1)
        say(f"DAGs parsed in {result['parse_seconds']} s; waiting for their first runs to end")
        with contextlib.suppress(TimeoutError):  # new DAGs' first runs are not the load's
            result["settle_seconds"] = round(wait_settled(api, 900, min_wait=30)[0], 1)
        say(f"producing for {args.minutes} min")
        result |= steady(args, settings, api, groups, cfgs)
        found, missing = delays(storage_of, result.pop("samples"))
        result["freshness_seconds"] = {
            g.name: {
                "samples": len(
                    each := [d for t in names if groups[t] is g for d in found.get(t, [])]
                ),
                "p50": pct(each, 0.5),
                "p95": pct(each, 0.95),
                "max": max(each) if each else None,
                "not_archived": sum(missing.get(t, 0) for t in names if groups[t] is g),
            }
            for g in GROUPS
        }
        return result
    finally:
        result["cleanup_notes"] = restore(path, original, api, settings, names, cfgs, args.keep)


def run_timeline(tis: list[dict], topics: set[str]) -> dict[str, dict[str, float | None]]:
    """Where the archive runs of `topics` spend their time: per task, the median seconds from
    the run's first task being scheduled to the task's start and to its end (a gap between one
    task's end and the next one's start is Airflow handing the run on)."""
    archive_dags = {dag_id("archive", t) for t in topics}
    runs: defaultdict[tuple[str, str], list[dict]] = defaultdict(list)
    for ti in tis:
        if ti["dag_id"] in archive_dags:
            runs[(ti["dag_id"], ti["dag_run_id"])].append(ti)
    offsets: defaultdict[str, dict[str, list[float]]] = defaultdict(
        lambda: {"start": [], "end": []}
    )
    for each in runs.values():
        begun = [_at(t["scheduled_when"] or t["start_date"]) for t in each if t["start_date"]]
        if not begun:
            continue
        first = min(begun)
        for t in each:
            for key, field_name in (("start", "start_date"), ("end", "end_date")):
                if t[field_name]:
                    offsets[t["task_id"]][key].append(_at(t[field_name]) - first)
    return {
        task: {key: pct(values, 0.5) for key, values in found.items()}
        for task, found in sorted(offsets.items(), key=lambda kv: pct(kv[1]["start"], 0.5) or 0)
    }


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def steady(
    args: argparse.Namespace,
    settings: StackSettings,
    api: AirflowAPI,
    groups: dict[str, Group],
    cfgs: dict[str, TopicConfig],
) -> dict[str, Any]:
    """Production for `--minutes` and what the stack spent meanwhile; then the drain."""
    names = sorted(groups)
    metrics = f"http://{settings.host}:{settings.seaweed_metrics_port}/metrics"
    roots = stack_processes(settings)
    sampler = Sampler(settings, roots)
    load = Load(settings.bootstrap_servers, {t: groups[t].rate for t in names})
    stop = threading.Event()
    cpu_before, s3_before = cpu_snapshot(roots), s3_requests(metrics)
    start = datetime.now(UTC)
    sampler.start()
    began = time.monotonic()
    try:
        load.run(args.minutes * 60, stop)
    except KeyboardInterrupt:
        say("interrupted: measuring what was produced so far")
    window = time.monotonic() - began
    end = datetime.now(UTC)
    cpu_after, s3_after = cpu_snapshot(roots), s3_requests(metrics)
    sampler.stop()
    say(f"produced {sum(load.delivered.values())} records; waiting for the archive to catch up")
    committed: dict[str, datetime] = {}
    ends = end_offsets(settings.bootstrap_servers, names)
    # a cold topic may get no record at all (one in fifteen, at a record every 3 min for 8):
    # it has nothing to archive, so no token to wait for
    idle = {t for t, end in ends.items() if not any(end.values())}
    try:
        wait_caught_up(
            cfgs, {t: ends[t] for t in ends if t not in idle}, args.drain_timeout, committed
        )
    except KeyboardInterrupt:
        say("interrupted while draining")
    tis = [
        ti
        for ti in fleet_task_instances(api, start)
        if PREFIX in ti["dag_id"] and ti["start_date"] and ti["start_date"] < end.isoformat()
    ]
    archived = sum(load.delivered.values())
    hours = window / 3600
    jobs = spark_jobs(cfgs, names, start, limit=100_000)
    requests = sum(s3_after.values()) - sum(s3_before.values())
    per = {
        "task_instances": len(tis),
        "task_instances_on_workers": len([ti for ti in tis if ti["hostname"]]),
        "archive_runs": len(
            {(ti["dag_id"], ti["dag_run_id"]) for ti in tis if ti["task_id"] == "plan"}
        ),
        "spark_jobs": jobs["spark_jobs"],
        "s3_requests": requests,
    }
    return {
        "run_timeline": {
            g.name: run_timeline(tis, {t for t in names if groups[t] is g})
            for g in GROUPS
            if g.max_delay is not None  # the busy and warm groups, whose freshness has goals
        },
        "task_instances_by_dag_kind": dict(Counter(ti["dag_id"].split("__")[0] for ti in tis)),
        "archive_task_instances_by_task": dict(
            Counter(ti["task_id"] for ti in tis if ti["dag_id"].startswith("archive__"))
        ),
        "samples": load.samples,
        "window_seconds": round(window, 1),
        "records": archived,
        "produce_errors": load.errors[:5],
        "caught_up_after_drain": len(committed),
        "produced_nothing": len(idle),
        "not_caught_up": sorted(set(names) - set(committed) - idle)[:10],
        "totals": per,
        "per_hour": {k: round(v / hours) for k, v in per.items()},
        "per_record": {k: v / max(archived, 1) for k, v in per.items()},
        "s3_requests_by_type": {
            k: s3_after[k] - s3_before.get(k, 0) for k in s3_after if s3_after[k] > s3_before[k]
        },
        "cpu_cores": {
            k: round((cpu_after.get(k, 0) - v) / window, 3) for k, v in cpu_before.items()
        },
        "peak_total_memory_mb": round(sampler.peak_total_memory),
        "peak_memory_used_mb": round(sampler.peak_used),
    }


def show(r: dict) -> None:
    how = f"cron {r['schedule']}" if r["run_on"] == "schedule" else "run_on: records"
    print(f"Steady fleet at scale {r['scale']} for {r['window_seconds']} s, {how}:")
    for name, g in r["groups"].items():
        f = r["freshness_seconds"][name]
        delay = "-"
        if f["p50"] is not None:
            delay = f"p50 {f['p50']:.1f}  p95 {f['p95']:.1f}  max {f['max']:.1f} s"
        # a cron runs its topics whatever waits: their max_delay plays no part
        limit = f", max_delay {g['max_delay_seconds']:g} s" if r["run_on"] == "records" else ""
        print(
            f"  {name:<5} {g['topics']:>4} topics × {g['records_per_second']:g} rec/s{limit}: "
            f"produce → committed {delay} "
            f"({f['samples']} samples, {f['not_archived']} not archived)"
        )
    print(f"  records: {r['records']}; parse of the fleet's DAGs: {r['parse_seconds']} s")
    print(f"  task instances by DAG kind: {r['task_instances_by_dag_kind']}")
    print(f"  archive task instances by task: {r['archive_task_instances_by_task']}")
    for name, tasks in r["run_timeline"].items():
        steps = ", ".join(
            f"{task} {t['start']:.1f}→{t['end']:.1f}"
            for task, t in tasks.items()
            if t["start"] is not None and t["end"] is not None
        )
        print(f"  {name} run, median s after it was scheduled: {steps}")
    for key, total in r["totals"].items():
        print(
            f"  {key:<26} {total:>8}  {r['per_hour'][key]:>9} /h  "
            f"{r['per_record'][key]:.5f} per record"
        )
    ordered = sorted(r["cpu_cores"].items(), key=lambda kv: -kv[1])
    cores = ", ".join(f"{k} {v:.2f}" for k, v in ordered)
    print(f"  CPU cores {sum(r['cpu_cores'].values()):.2f} ({cores})")
    print(
        f"  peak memory: stack {r['peak_total_memory_mb']} MB, "
        f"machine {r['peak_memory_used_mb']} MB"
    )
    print(
        f"  caught up after the drain: {r['caught_up_after_drain']}; not: {r['not_caught_up']} "
        f"({r['produced_nothing']} topics got no record)"
    )
    for note in [*r["produce_errors"], *r["cleanup_notes"]]:
        print(f"  note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each group's topics")
    parser.add_argument("--minutes", type=float, default=30, help="minutes of production")
    parser.add_argument("--run-on", choices=["records", "schedule"], default="records")
    parser.add_argument("--schedule", default="*/10 * * * *", help="--run-on schedule: the cron")
    parser.add_argument("--drain-timeout", type=float, default=900, help="seconds to catch up")
    parser.add_argument("--parse-timeout", type=float, default=1800, help="seconds to parse DAGs")
    run(parser, measure, show)


if __name__ == "__main__":
    main()
