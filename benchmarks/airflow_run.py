"""End-to-end latency of one small archive run through Airflow on the running local stack.

Needs `make up` (or `.venv/bin/python -m cairn_stack up`) first. Produces `--records` (1) sample
events to the demo topic (`cairn.demo.events`, created if missing), triggers its archive DAG
through Airflow's REST API and times the run from trigger to finished (all of plan → clean →
archive → verify → commit and the tasks after it, Airflow's scheduling included). `--warmup`
runs (1) go first and are not counted: the first run after a start pays for parsing and imports.
Prints each run's seconds (trigger → finished, and queued → its commit task done: the records
are archived), the medians, and each task's duration in the last run. The Spark work goes where
the stack's `cairn_spark` connection points: the Spark Connect server by default, spark-submit
with `CAIRN_SPARK_CONN_TYPE=spark` (set when starting the stack); the archive task's log says
which ran.

    .venv/bin/python benchmarks/airflow_run.py [--runs 3] [--warmup 1] [--records 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from datetime import UTC, datetime

from cairn import dag_ids
from cairn_stack.airflow_api import FINISHED, AirflowAPI
from cairn_stack.demo import DEMO_TOPIC, create_topic, produce, sample_events
from cairn_stack.settings import StackSettings


def one_run(api: AirflowAPI, settings: StackSettings, dag_id: str, records: int) -> dict:
    """Produce, trigger, wait; the run's wall time from trigger to its final state. A run whose
    archive task did not run (a scheduled run of the DAG took the records first) is run again."""
    while (result := _one_run(api, settings, dag_id, records))["archive"] == "skipped":
        print(f"  {result['run_id']}: nothing left to archive (a scheduled run?); again")
    return result


def _one_run(api: AirflowAPI, settings: StackSettings, dag_id: str, records: int) -> dict:
    events = sample_events(records, datetime.now(UTC), seed=time.time_ns())
    produce(settings.bootstrap_servers, DEMO_TOPIC, events)
    started = time.monotonic()
    run_id = api.trigger(dag_id)
    path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}"
    while (run := api.call("GET", path))["state"] not in FINISHED:
        time.sleep(0.25)
    seconds = time.monotonic() - started
    tasks = {t["task_id"]: t for t in api.call("GET", f"{path}/taskInstances")["task_instances"]}
    queued = datetime.fromisoformat(run["queued_at"])
    committed = tasks.get("commit", {}).get("end_date")
    archive = tasks.get("archive", {}).get("state")
    log = api.task_log(dag_id, run_id, "archive") if archive in ("success", "failed") else ""
    return {
        "archive": archive,
        "run_id": run_id,
        "state": run["state"],
        "seconds": round(seconds, 2),
        "committed_seconds": (
            round((datetime.fromisoformat(committed) - queued).total_seconds(), 2)
            if committed
            else None
        ),
        "spark": "spark_connect" if "on the Spark Connect server" in log else "spark-submit",
        "tasks": {k: t["duration"] for k, t in tasks.items() if t["duration"] is not None},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="measured runs")
    parser.add_argument("--warmup", type=int, default=1, help="runs before measuring")
    parser.add_argument("--records", type=int, default=1, help="records produced per run")
    parser.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    args = parser.parse_args()
    settings = StackSettings()
    api = AirflowAPI(settings)
    dag_id = dag_ids.dag_id("archive", DEMO_TOPIC)
    create_topic(settings.bootstrap_servers, DEMO_TOPIC, partitions=3)
    api.wait_for_dag(dag_id)
    for _ in range(args.warmup):
        one_run(api, settings, dag_id, args.records)
    results = [one_run(api, settings, dag_id, args.records) for _ in range(args.runs)]
    failed = [r["run_id"] for r in results if r["state"] != "success"]
    seconds = [r["seconds"] for r in results]
    committed = [r["committed_seconds"] for r in results if r["committed_seconds"] is not None]
    summary = {
        "dag_id": dag_id,
        "spark": sorted({r["spark"] for r in results}),
        "records_per_run": args.records,
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "committed_seconds": committed,
        "median_committed_seconds": statistics.median(committed) if committed else None,
        "load_average": os.getloadavg(),
        "last_run_task_seconds": results[-1]["tasks"],
        "failed_runs": failed,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{dag_id}: {args.runs} runs of {args.records} record(s), Spark: {summary['spark']}")
    print(
        f"  trigger → finished: {', '.join(f'{s:.1f}' for s in seconds)} s "
        f"(median {summary['median_seconds']:.1f} s)"
    )
    print(
        f"  queued → committed: {', '.join(f'{s:.1f}' for s in committed)} s "
        f"(median {summary['median_committed_seconds']:.1f} s)"
    )
    print(
        f"  1-minute load average {summary['load_average'][0]:.1f} (2 cores: above ~2, others ran)"
    )
    for task, took in summary["last_run_task_seconds"].items():
        print(f"  {task:<12} {took:6.2f} s")
    if failed:
        raise SystemExit(f"runs failed: {failed}")


if __name__ == "__main__":
    main()
