"""A small client of Airflow 3's REST API (`/api/v2`), for the demo and the end-to-end tests."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

from cairn_stack.settings import StackSettings

FINISHED = {"success", "failed"}
POLL_SECONDS = 1.0
"""Between two looks while waiting: each wait ends on average half of this after what it waits
for happened, and the end-to-end tests wait about a hundred times."""


class AirflowAPI:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.base = settings.airflow_url
        self.user, self.password = settings.airflow_user, settings.airflow_password
        self._token: str | None = None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        if self._token is None and not path.startswith("/auth"):
            self._token = self.call(
                "POST", "/auth/token", {"username": self.user, "password": self.password}
            )["access_token"]
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}
            | ({"Authorization": f"Bearer {self._token}"} if self._token else {}),
        )
        try:
            with urllib.request.urlopen(request, timeout=90) as reply:
                text = reply.read()
                return json.loads(text) if text else None  # DELETE answers 204, no body
        except urllib.error.HTTPError as err:
            raise RuntimeError(
                f"Airflow API {method} {path}: {err.code} {err.read().decode()[:500]}"
            ) from None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Wait until the dag-processor has parsed `dag_id`, then make sure it is unpaused."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                dag = self.call("GET", f"/api/v2/dags/{dag_id}")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    errors = self.call("GET", "/api/v2/importErrors")
                    raise TimeoutError(f"DAG {dag_id} not parsed in {timeout}s; {errors}") from None
                time.sleep(POLL_SECONDS)
        if dag["is_paused"]:
            self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        """A run with no logical date (no data interval), as docs/operating.md's REST examples
        make."""
        body = {"logical_date": None} | ({"conf": conf} if conf else {})
        return self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    def backfill(self, dag_id: str, first: str, last: str) -> dict:
        """Runs for every interval whose start is within [first, last] (ISO dates)."""
        body = {
            "dag_id": dag_id,
            "from_date": f"{first}T00:00:00Z",
            "to_date": f"{last}T00:00:00Z",
            "reprocess_behavior": "completed",
            "max_active_runs": 1,
        }
        return self.call("POST", "/api/v2/backfills", body)

    def wait_for_backfills(self, dag_id: str, timeout: float) -> None:
        """Wait until the scheduler marked every backfill of `dag_id` complete (it does so a
        moment after their runs finished; until then Airflow refuses a new backfill of the DAG)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.call("GET", f"/api/v2/backfills?dag_id={dag_id}")["backfills"]
            if all(b["completed_at"] for b in found):
                return
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"backfills of {dag_id} still running after {timeout}s")

    def clear(self, dag_id: str, run_id: str) -> None:
        """Clear every task of a run so it runs again, as the UI's Clear does."""
        body = {"dry_run": False, "only_failed": False, "dag_run_id": run_id}
        self.call("POST", f"/api/v2/dags/{dag_id}/clearTaskInstances", body)

    def runs(self, dag_id: str) -> list[dict]:
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=start_date")["dag_runs"]

    def wait_for_runs(self, dag_id: str, timeout: float) -> list[dict]:
        """Wait until every run of `dag_id` (including ones runs trigger meanwhile) finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.runs(dag_id)
            if runs and all(r["state"] in FINISHED for r in runs):
                return runs
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"runs of {dag_id} still unfinished after {timeout}s: {runs}")

    def wait_for_partitions(
        self, dag_id: str, keys: list[str], since: datetime, timeout: float
    ) -> list[dict]:
        """Wait until `dag_id` has a finished run for each partition key queued after `since`
        (asset events queue them a moment after the run that announced them); those runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [
                r
                for r in self.runs(dag_id)
                if r.get("partition_key") in keys
                and datetime.fromisoformat(r["queued_at"]) >= since
            ]
            if {r["partition_key"] for r in runs} == set(keys) and all(
                r["state"] in FINISHED for r in runs
            ):
                return runs
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"runs of {dag_id} for {keys} unfinished after {timeout}s: {runs}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        """A run's task instances by task id."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}/taskInstances"
        return {ti["task_id"]: ti for ti in self.call("GET", path)["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task attempt's log as the UI shows it."""
        path = (
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}"
            f"/taskInstances/{task_id}/logs/{try_number}"
        )
        return json.dumps(self.call("GET", path)["content"])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom, decoded as Airflow's `XComModel.deserialize_value` decodes it: a step
        the triggerer ended has its result stored JSON-encoded (`cairn_airflow.step_result`)."""
        path = (
            f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id)}"
            f"/taskInstances/{task_id}/xcomEntries/{key}"
        )
        value = self.call("GET", path)["value"]
        try:
            return json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return value  # a task's own string, stored as it is
