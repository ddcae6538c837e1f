"""The local stack's notifier: each alert as one JSON line in `<state_dir>/airflow/alerts.jsonl`.

Airflow calls it (through `CAIRN_NOTIFIER`) when an archive task fails, a topic breaches one
of its limits (`check_health`), or a run passes its deadline; production deployments
name their own notifier (Slack, PagerDuty, SMTP) instead. The tests read the file to prove the
real Airflow called it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

ALERTS_FILE_ENV = "CAIRN_ALERTS_FILE"


def record(context: Any) -> None:
    """Append the alert: when, which DAG, run and task, and why."""
    context = context or {}
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    if isinstance(dag_run, dict):  # a Deadline Alert's context carries the run as a dict
        run = {"dag_id": dag_run.get("dag_id"), "run_id": dag_run.get("dag_run_id")}
    else:
        run = {
            "dag_id": getattr(dag_run, "dag_id", None),
            "run_id": getattr(dag_run, "run_id", None),
        }
    alert = {
        "at": datetime.now(UTC).isoformat(),
        "dag_id": getattr(ti, "dag_id", None) or run["dag_id"],
        "run_id": getattr(ti, "run_id", None) or run["run_id"],
        "task_id": getattr(ti, "task_id", None),
        "reason": str(context.get("exception") or context.get("reason") or context),
    }
    path = os.environ.get(ALERTS_FILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(alert) + "\n")
