"""Alerts and metrics through the real Airflow 3: a topic Cairn falls behind on fails its
check_health task (in the triggerer) and the configured notifier really runs (the stack's writes
a file), as it does from a Deadline Alert for runs past max_run_duration; a quiet topic whose
records are all archived raises nothing however old they are; and every commit's metrics leave
through Airflow's own StatsD client."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cairn.dag_ids import dag_id
from cairn_stack.demo import create_topic, produce
from tests.conftest import E2E_LAGGING, E2E_QUIET
from tests.integration.test_archive import NOW, event

LAGGING_DAG = dag_id("archive", E2E_LAGGING)
QUIET_DAG = dag_id("archive", E2E_QUIET)


@pytest.fixture
def statsd(airflow) -> Iterator[list[str]]:
    """Every StatsD line Airflow sends while the test runs."""
    lines: list[str] = []
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind((airflow.settings.host, airflow.settings.statsd_port))
    listener.settimeout(0.5)
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                data = listener.recv(65535)
            except TimeoutError:
                continue
            lines.extend(data.decode(errors="replace").splitlines())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    yield lines
    stop.set()
    thread.join()
    listener.close()


def alerts(airflow) -> list[dict]:
    path = airflow.settings.alerts_file
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stat(lines: list[str], name: str) -> list[float]:
    """Values sent for `name` (plain StatsD: `<prefix>.<name>:<value>|<type>`)."""
    pattern = re.compile(rf"(?:^|\.){re.escape(name)}:([-0-9.e]+)\|")
    return [float(m[1]) for line in lines if (m := pattern.search(line))]


def test_a_topic_falling_behind_calls_the_notifier_and_a_quiet_caught_up_one_does_not(
    airflow, kafka, statsd
) -> None:
    create_topic(kafka, E2E_LAGGING, partitions=1)
    create_topic(kafka, E2E_QUIET, partitions=1)
    produce(kafka, E2E_LAGGING, [event(i, NOW) for i in range(12)], partition=0)
    produce(kafka, E2E_QUIET, [event(i, NOW) for i in range(3)], partition=0)
    airflow.wait_for_dag(LAGGING_DAG)
    airflow.wait_for_dag(QUIET_DAG)
    time.sleep(2)  # every record is now older than both topics' max_time_lag (1s)

    airflow.trigger(LAGGING_DAG)
    airflow.trigger(QUIET_DAG)
    lagging = airflow.wait_for_runs(LAGGING_DAG, timeout=900)
    airflow.wait_for_runs(QUIET_DAG, timeout=600)
    time.sleep(2)
    airflow.trigger(QUIET_DAG)  # nothing new: the run ends at plan, quietly
    quiet = airflow.wait_for_runs(QUIET_DAG, timeout=600)

    # 12 records at 5 a run: two runs leave records older than 1s behind, the third catches up
    # (unpausing may add a scheduled run; runs that found nothing new skip the check)
    tis = [airflow.task_instances(LAGGING_DAG, r["dag_run_id"]) for r in lagging]
    checks = [t["check_health"] for t in tis if t["check_health"]["state"] != "skipped"]
    assert [c["state"] for c in checks] == ["failed", "failed", "success"], tis
    # the triggerer failed the breached checks itself: no worker took them up (no hostname),
    # and the DAG processor ran their failure callback with the cause the ending event kept
    assert not any(c["hostname"] for c in checks), checks
    assert len(quiet) >= 2 and all(r["state"] == "success" for r in quiet), quiet
    raised = alerts(airflow)
    checked = [a for a in raised if a["dag_id"] == LAGGING_DAG and a["task_id"] == "check_health"]
    assert len(checked) == 2
    assert all("time lag (seconds)" in a["reason"] and "limit 1" in a["reason"] for a in checked)
    # runs longer than the lagging topic's max_run_duration (5s): the Deadline Alert reported them
    overdue = [a for a in raised if a["dag_id"] == LAGGING_DAG and a["task_id"] is None]
    assert overdue, raised
    assert all("not finished 0:00:05 after it was queued" in a["reason"] for a in overdue)
    assert {a["run_id"] for a in overdue} <= {r["dag_run_id"] for r in lagging}
    assert not [a for a in raised if a["dag_id"] == QUIET_DAG]

    # the commits' metrics, through Airflow's StatsD client (plain StatsD: labels in the name)
    time.sleep(1)
    lag = "e2e__lagging.0"  # topic e2e.lagging, partition 0
    assert stat(statsd, f"cairn.offset_lag.{lag}") == [7, 2, 0]
    assert stat(statsd, f"cairn.records_archived.{lag}") == [5, 5, 2]
    assert stat(statsd, f"cairn.time_lag_seconds.{lag}")[-1] == 0
    assert min(stat(statsd, f"cairn.time_lag_seconds.{lag}")[:2]) > 1
    assert len(stat(statsd, "cairn.run_duration_seconds.e2e__lagging")) == 3
    assert stat(statsd, "cairn.bytes_archived.e2e__quiet.0")[0] > 0
    (committed,) = stat(statsd, "cairn.last_commit_timestamp_seconds.e2e__quiet")
    assert abs(committed - time.time()) < 600
