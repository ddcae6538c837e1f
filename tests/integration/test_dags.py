"""Every DAG file imports into Airflow, and a bad topic entry or a topics file that is not YAML is
an import error that names file, line, topic and field without stopping the other topics' DAGs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cairn.config import INCLUDE_DIR, REPO

PARSE = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
dags = {
    dag_id: {"tasks": sorted(t.task_id for t in dag.tasks), "max_active_runs": dag.max_active_runs,
             "catchup": dag.catchup, "tags": sorted(dag.tags)}
    for dag_id, dag in bag.dags.items()
}
print("RESULT" + json.dumps({"errors": bag.import_errors, "dags": dags}))
"""


def parse_dags(tmp_path: Path, topics_file: Path, code: str = "", **extra_env: str) -> dict:
    """Parse dags/ with Airflow's own DagBag, in a fresh interpreter with its own AIRFLOW_HOME
    (or run `code`, which prints its result the same way)."""
    env = {
        **extra_env,
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
        "CAIRN_TOPICS_FILE": str(topics_file),
    }
    done = subprocess.run(
        [sys.executable, "-c", code or PARSE % str(REPO / "dags")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


def test_every_dag_file_imports_without_errors(tmp_path: Path) -> None:
    parsed = parse_dags(tmp_path, INCLUDE_DIR / "topics.yaml")

    assert parsed["errors"] == {}
    archive = parsed["dags"]["archive__cairn.demo.events"]
    assert archive["tasks"] == sorted(
        [
            "plan",
            "clean",
            "archive",
            "verify",
            "commit",
            "more_waiting",
            "drain_backlog",
            "check_health",
            "complete",
            "announce",
        ]
    )
    assert archive["max_active_runs"] == 1
    assert archive["catchup"] is False
    assert "cairn_discover_topics" in parsed["dags"]
    assert parsed["dags"]["cairn_config_watch"]["tasks"] == ["check"]
    rebuild = parsed["dags"]["rebuild__cairn.demo.events"]
    assert rebuild["tasks"] == ["announce", "commit", "complete", "rebuild", "select"]
    assert rebuild["max_active_runs"] == 1 and rebuild["catchup"] is False
    seal = parsed["dags"]["seal__cairn.demo.events"]
    assert seal["tasks"] == ["commit", "seal", "select"]


def test_bad_topic_entry_is_an_import_error_and_good_ones_still_load(tmp_path: Path) -> None:
    topics = tmp_path / "topics.yaml"
    schema = INCLUDE_DIR / "schemas" / "demo_event.avsc"
    topics.write_text(
        textwrap.dedent(
            f"""
            topics:
              - topic: good.orders
                format: raw
              - topic: broken.payments
                format: json
                schema: {schema}
                event_time: {{field: ts, encoding: epoch_weeks}}
            """
        )
    )
    parsed = parse_dags(tmp_path, topics)

    assert "archive__good.orders" in parsed["dags"]
    assert "rebuild__good.orders" not in parsed["dags"]  # raw: nothing to re-derive
    assert not any("broken" in dag_id for dag_id in parsed["dags"])
    (message,) = [m for f, m in parsed["errors"].items() if f.endswith("cairn_config_check.py")]
    assert f"{topics}, line 8: topic 'broken.payments': event_time.encoding: Input" in message
    assert [Path(f).name for f in parsed["errors"]] == ["cairn_config_check.py"]


def test_a_topics_file_that_is_not_yaml_stops_only_its_own_topics(tmp_path: Path) -> None:
    folder = tmp_path / "topics.d"
    folder.mkdir()
    (folder / "orders.yaml").write_text("topics:\n  - topic: good.orders\n    format: raw\n")
    (folder / "payments.yaml").write_text(
        "topics:\n  - topic: broken.payments\n    format: raw\n   seal: false\n"
    )
    (folder / "clicks.yaml").write_text(
        "topics:\n  - topic: good.orders\n    format: raw\n  - topic: clicks\n    format: raw\n"
    )
    parsed = parse_dags(tmp_path, folder)

    archives = sorted(d for d in parsed["dags"] if d.startswith("archive__"))
    assert archives == ["archive__clicks"]  # good.orders is in two files: in neither
    assert [Path(f).name for f in parsed["errors"]] == ["cairn_config_check.py"]
    (message,) = parsed["errors"].values()
    assert f"{folder / 'payments.yaml'}, line 4: not valid YAML at column 4" in message
    assert f"{folder / 'clicks.yaml'}, line 2: topic 'good.orders': also defined at" in message


def test_a_missing_topics_file_is_one_import_error_that_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-topics.d"
    parsed = parse_dags(tmp_path, missing)

    assert not any(d.startswith(("archive__", "rebuild__", "seal__")) for d in parsed["dags"])
    assert [Path(f).name for f in parsed["errors"]] == ["cairn_config_check.py"]
    (message,) = parsed["errors"].values()
    assert f"{missing}: no such file or folder; create it, or point CAIRN_TOPICS_FILE" in message


def test_pattern_entries_use_the_cached_topic_list(tmp_path: Path) -> None:
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - pattern: 'orders\\..+'\n    format: raw\n")
    known = '["orders.eu", "orders.us", "payments", "__consumer_offsets"]'

    parsed = parse_dags(tmp_path, topics, AIRFLOW_VAR_CAIRN_KAFKA_TOPICS=known)

    assert parsed["errors"] == {}
    archives = sorted(d for d in parsed["dags"] if d.startswith("archive__"))
    assert archives == ["archive__orders.eu", "archive__orders.us"]


def test_a_topic_two_patterns_match_is_an_import_error_naming_both(tmp_path: Path) -> None:
    folder = tmp_path / "topics.d"
    folder.mkdir()
    (folder / "orders.yaml").write_text("topics:\n  - pattern: 'orders[.].+'\n    format: raw\n")
    (folder / "us.yaml").write_text("topics:\n  - pattern: '.+[.]us'\n    format: raw\n")
    known = '["orders.eu", "orders.us", "payments.us"]'

    parsed = parse_dags(tmp_path, folder, AIRFLOW_VAR_CAIRN_KAFKA_TOPICS=known)

    archives = sorted(d for d in parsed["dags"] if d.startswith("archive__"))
    assert archives == ["archive__orders.eu", "archive__payments.us"]
    (message,) = [m for f, m in parsed["errors"].items() if f.endswith("cairn_config_check.py")]
    assert (
        f"{folder / 'orders.yaml'}, line 2: topic 'orders.us': pattern: matched by pattern "
        f"'orders[.].+' ({folder / 'orders.yaml'}, line 2) and pattern '.+[.]us' "
        f"({folder / 'us.yaml'}, line 2); archived by neither"
    ) in message


RUN_TASK = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
task = bag.dags[%r].task_dict[%r]
try:
    task.execute({})
    failure = None
except Exception as err:
    failure = [type(err).__name__, str(err)]
print("RESULT" + json.dumps({"errors": bag.import_errors, "retries": task.retries,
                             "failure": failure}))
"""


def test_a_task_whose_topic_entry_broke_after_its_run_started_fails_at_once(
    tmp_path: Path,
) -> None:
    """As a task process parses its DAG file (Airflow's parsing context names its DAG and
    task): the topic's entry is broken, so instead of no DAG (up_for_reschedule for minutes,
    then "Dag not found") it finds one whose task fails without retries naming the mistake."""
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - topic: orders\n    format: raw\n    codec: lz4\n")
    code = RUN_TASK % (str(REPO / "dags" / "cairn_archive.py"), "archive__orders", "clean")

    ran = parse_dags(
        tmp_path,
        topics,
        code,
        _AIRFLOW_PARSING_CONTEXT_DAG_ID="archive__orders",
        _AIRFLOW_PARSING_CONTEXT_TASK_ID="clean",
    )

    assert ran["errors"] == {} and ran["retries"] == 0
    assert ran["failure"] == [
        "AirflowFailException",
        f"TopicNotConfigured: {topics}, line 4: topic 'orders': codec: Input should be "
        "'deflate', 'snappy', 'zstandard' or 'null'; fix the entry",
    ]


WEIGH = """
import json
from airflow.dag_processing.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance
from airflow.models.variable import Variable
from airflow.serialization.serialized_objects import DagSerialization
from airflow.utils.session import create_session

bag = DagBag(dag_folder=%r)
dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[%r]))  # as the scheduler has it
with create_session() as session:
    session.add(Variable(key=%r, val="7200.5"))  # two hours of lag, as a run records it
weights = {}
for task_id in ("archive", "verify"):
    ti = TaskInstance(task=dag.get_task(task_id), run_id="r", dag_version_id=None)
    weights[task_id] = ti.priority_weight
print("RESULT" + json.dumps({"weights": weights, "pool": dag.get_task("archive").pool}))
"""


def test_airflow_weighs_the_archive_task_by_the_lag_its_topic_recorded(tmp_path: Path) -> None:
    """Airflow's own task-instance creation, on a real (SQLite) metadata database, calls the
    plugin-registered rule of the serialized DAG, which reads the recorded lag from there."""
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics:\n  - topic: fleet.orders\n    format: raw\n")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "PYTHONPATH": f"{REPO / 'include'}{os.pathsep}{REPO / 'plugins'}",
        "CAIRN_TOPICS_FILE": str(topics),
    }
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run(
        [airflow, "db", "migrate"], env=env, capture_output=True, timeout=300, check=True
    )
    code = WEIGH % (
        str(REPO / "dags"),
        "archive__fleet.orders",
        "cairn_time_lag.fleet.orders",
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, done.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT"))
    assert result["weights"]["archive"] == 1 + 120  # its own weight plus minutes of lag
    assert result["weights"]["verify"] < 10  # other tasks keep Airflow's usual rule
    assert result["pool"] == "cairn_spark"
