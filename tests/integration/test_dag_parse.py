"""A changed topics file is parsed when it changes, not at the DAG processor's interval, through
the real Airflow 3: `cairn_config_watch`, run on a Celery worker, marks the topic DAG files
newer than their last parse, and the DAG processor parses them at once."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from cairn.config import REPO
from cairn.dag_ids import dag_id
from cairn_airflow.dag_parse import TOPIC_DAG_FILES, parse_again
from tests.conftest import E2E_LAGGING

DAG_ID = dag_id("archive", E2E_LAGGING)
DAGS = REPO / "dags"


def parsed_at(airflow) -> datetime:
    return datetime.fromisoformat(airflow.call("GET", f"/api/v2/dags/{DAG_ID}")["last_parsed_time"])


def parsed_after(airflow, earlier: datetime, timeout: float = 120) -> datetime:
    """When the DAG processor next parsed the archive DAG file after `earlier`."""
    deadline = time.monotonic() + timeout
    while (found := parsed_at(airflow)) <= earlier:
        assert time.monotonic() < deadline, f"{DAG_ID} not parsed again since {earlier}"
        time.sleep(1)
    return found


def test_a_changed_topics_file_is_parsed_at_once_not_at_the_interval(airflow) -> None:
    airflow.wait_for_dag(DAG_ID)
    airflow.wait_for_dag("cairn_config_watch")
    edited = airflow.settings.topics_file / "e2e.yaml"
    os.utime(edited)  # an edit, as far as file times tell

    airflow.trigger("cairn_config_watch")
    airflow.wait_for_runs("cairn_config_watch", timeout=300)

    # the watch's task (on a worker) marked every topic DAG file newer than the edit
    marked = min((DAGS / name).stat().st_mtime for name in TOPIC_DAG_FILES)
    assert marked >= edited.stat().st_mtime
    first = parsed_after(airflow, datetime.fromtimestamp(marked, UTC))

    # and a DAG file marked again is parsed again at once: two parses this close together are
    # not the interval's doing
    assert parse_again(DAGS, "a second change")
    second = parsed_after(airflow, first)
    assert (second - first).total_seconds() < airflow.settings.dag_file_interval - 5, (
        first,
        second,
    )


def test_the_dag_processor_runs_with_its_callback_parse_times_kept(airflow) -> None:
    """`cairn_airflow.dag_processor_fix` is installed in the real DAG processor as Cairn's
    plugin loads there (its effect on Airflow's own class: tests/unit/test_dag_processor_fix.py)."""
    log = airflow.settings.state_dir / "logs" / "airflow-dag-processor.log"
    assert "a callback-only run keeps its file's last parse time" in log.read_text()
