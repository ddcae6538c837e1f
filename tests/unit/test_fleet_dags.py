"""Many topics without a stampede, as the DAGs wire it: every Spark task takes one slot of the
Spark pool and has a timeout, the archive DAG runs when its topic's records wait (or on its spread
schedule), and its Spark task is weighted by the lag its topic's last run left."""

from __future__ import annotations

import runpy
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import structlog
import yaml
from airflow.callbacks.callback_requests import DagCallbackRequest, TaskCallbackRequest
from airflow.dag_processing import processor
from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import DAG
from airflow.timetables.base import TimeRestriction
from airflow.timetables.trigger import CronTriggerTimetable
from airflow.utils.state import TaskInstanceState

from cairn.config import REPO, TopicConfig
from cairn.dag_ids import dag_id
from cairn.schedule import completion_cron, spread
from cairn.waiting import WaitRule
from cairn_airflow import dag_topics, priority
from cairn_airflow.assets import topic_asset
from cairn_airflow.operators.spark import SPARK_POOL
from dags.cairn_archive import archive_dag
from dags.cairn_rebuild import rebuild_dag
from dags.cairn_seal import seal_dag

SCHEMA = "schemas/demo_event.avsc"


def parsing(topic: str, **settings) -> TopicConfig:
    return TopicConfig.model_validate(
        {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "event_time": {"field": "ts", "encoding": "iso8601"},
        }
        | settings
    )


def test_every_spark_task_takes_one_slot_of_the_spark_pool_with_the_topics_timeout():
    cfg = parsing("orders.eu", spark_timeout="45m")
    spark_tasks = [
        archive_dag(cfg).get_task("archive"),
        rebuild_dag(cfg).get_task("rebuild"),
    ]
    for task in spark_tasks:
        assert (task.pool, task.pool_slots) == (SPARK_POOL, 1), task.task_id
        assert task.execution_timeout == timedelta(minutes=45), task.task_id
    assert SPARK_POOL == "cairn_spark"  # the name the stack and docker-compose.yml create


def test_only_spark_tasks_use_the_spark_pool():
    dag = archive_dag(parsing("orders.eu"))
    others = [t for t in dag.tasks if t.task_id != "archive"]
    assert others and all(t.pool != SPARK_POOL for t in others)


def test_the_archive_task_starts_in_the_triggerer_and_comes_to_a_worker_only_to_resume():
    """Started in the triggerer, the task takes no slot of the Spark pool; the pool holds it
    only when a worker resumes it (a retry, an unshared topic, spark-submit, an error)."""
    cfg = parsing("orders.eu", spark_timeout="45m")
    archive = archive_dag(cfg).get_task("archive")
    start = archive.start_trigger_args
    assert archive.start_from_trigger and start is not None
    assert start.trigger_cls == "cairn_airflow.triggers.shared_archive.SharedArchiveTrigger"
    kwargs = {"topic": "orders.eu", "spark_conn_id": "cairn_spark", "plan_task": "plan"}
    assert start.trigger_kwargs == kwargs and start.timeout == timedelta(minutes=45)
    assert callable(getattr(archive, start.next_method))
    assert not rebuild_dag(cfg).get_task("rebuild").start_from_trigger
    # a rebuild's select starts there too: the daily runs the timetable schedules skip there
    assert rebuild_dag(cfg).get_task("select").start_from_trigger
    # and a seal's: most seal runs (a date amended by late records) stop at it
    select = seal_dag(cfg).get_task("select")
    assert select.start_from_trigger and select.start_trigger_args.trigger_kwargs["step"] == (
        "seal_select"
    )
    assert not seal_dag(cfg).get_task("seal").start_from_trigger


def test_the_steps_around_the_spark_job_start_in_the_triggerer_on_their_upstream_results():
    """Every step of a run starts in the triggerer (no worker process, no DAG file parsed); only
    drain_backlog, which starts the next run at the cap, runs on a worker."""
    dag = archive_dag(parsing("orders.eu"))
    upstream = {
        "plan": {},
        "clean": {"planned": "plan"},
        "verify": {"planned": "plan"},
        "commit": {"planned": "plan", "report": "verify"},
        "complete": {},
        "check_health": {},  # after commit, reading the topic's status: nothing to pull
        "announce": {"done": "complete"},
        "more_waiting": {"summary": "commit"},
    }
    for step, inputs in upstream.items():
        task = dag.get_task(step)
        start = task.start_trigger_args
        assert task.start_from_trigger and start is not None, step
        assert start.trigger_cls == "cairn_airflow.triggers.step.StepTrigger"
        assert start.trigger_kwargs == {"step": step, "topic": "orders.eu", "upstream": inputs}
        assert callable(getattr(task, start.next_method))
        assert set(inputs.values()) <= task.upstream_task_ids, step
    assert {t.task_id for t in dag.tasks if not t.start_from_trigger} == {"drain_backlog"}
    assert dag.get_task("complete").trigger_rule == "none_failed"  # idle runs complete dates
    # clean runs beside the Spark job, not before it: one step less on a run's critical path
    assert dag.get_task("clean").downstream_task_ids == {"verify"}
    assert dag.get_task("check_health").upstream_task_ids == {"commit"}
    assert dag.get_task("archive").upstream_task_ids == {"plan"}
    assert dag.get_task("verify").upstream_task_ids == {"plan", "clean", "archive"}
    # a plan that finds nothing skips itself: every task that needs it, by its trigger rule
    needs_plan = {"clean", "archive", "verify", "commit", "check_health", "more_waiting"}
    assert needs_plan == dag.get_task("plan").get_flat_relative_ids(upstream=False) - {
        "complete",
        "announce",
        "drain_backlog",
    }
    assert all(dag.get_task(t).trigger_rule == "all_success" for t in needs_plan)
    assert dag.get_task("announce").outlets == [topic_asset("orders.eu")]  # from a worker


def test_the_archive_dag_runs_on_the_topics_spread_schedule():
    spread_on = archive_dag(parsing("orders.eu", run_on="schedule"))
    assert spread_on.timetable.expression == spread("*/10 * * * *", "orders.eu")
    assert spread_on.timetable.expression != "*/10 * * * *"
    spread_off = archive_dag(parsing("orders.eu", run_on="schedule", spread_schedule=False))
    assert spread_off.timetable.expression == "*/10 * * * *"


def test_the_archive_spark_task_is_weighted_by_lag_the_rebuild_task_is_not():
    archive = archive_dag(parsing("orders.eu")).get_task("archive")
    assert archive.weight_rule == priority.LAG_FIRST == "cairn_airflow.priority.TimeLagFirst"
    rebuild = rebuild_dag(parsing("orders.eu")).get_task("rebuild")
    assert rebuild.weight_rule != priority.LAG_FIRST


def test_the_rule_is_registered_by_the_plugin_the_plugins_folder_holds():
    """Airflow finds plugins by loading each file of its plugins folder: the one there must
    bring the rule, or a DAG naming it fails to import."""
    found = runpy.run_path(str(REPO / "plugins" / "cairn_plugin.py"))
    plugins = [p for p in found.values() if isinstance(p, type) and issubclass(p, AirflowPlugin)]
    assert [p.name for p in plugins] == ["cairn"]
    assert priority.TimeLagFirst in plugins[0].priority_weight_strategies


@pytest.mark.parametrize(
    "topic", ["orders.eu", "a.b.c", "plain", "with-dash_and_underscore", "a__b", "archive__x"]
)
def test_the_rule_finds_the_topic_of_an_archive_dag(topic):
    assert priority.dag_topic(dag_id("archive", topic)) == topic
    assert dag_id("archive", topic) == f"archive__{topic}"
    assert priority.dag_topic(dag_id("rebuild", topic)) is None


def task_instance(dag_id: str, priority_weight: int = 1) -> SimpleNamespace:
    """What the rule reads of a task instance: its DAG id and its task's own weight."""
    return SimpleNamespace(dag_id=dag_id, task=SimpleNamespace(priority_weight=priority_weight))


def test_weight_is_the_tasks_weight_plus_minutes_of_the_recorded_lag(monkeypatch):
    recorded = {"orders.eu": 3600.0, "quiet": 0.0}
    monkeypatch.setattr(priority, "stored_lag", recorded.get)
    rule = priority.TimeLagFirst()
    assert rule.get_weight(task_instance("archive__orders.eu")) == 61
    assert rule.get_weight(task_instance("archive__quiet", priority_weight=5)) == 5
    assert rule.get_weight(task_instance("archive__never.ran")) == 1  # nothing recorded


def test_a_lag_that_cannot_be_read_gives_the_plain_weight(monkeypatch):
    def broken(topic):
        raise RuntimeError("database gone")

    monkeypatch.setattr(priority, "stored_lag", broken)
    assert priority.TimeLagFirst().get_weight(task_instance("archive__orders", 3)) == 3


def test_recording_the_lag_never_fails_a_run(monkeypatch):
    """Outside a task (no Airflow to talk to) Variable.set fails: logged, not raised."""
    priority.remember_lag("orders.eu", 12.5)
    written = []
    monkeypatch.setattr(
        priority.Variable, "set", lambda key, value, **kw: written.append((key, value))
    )
    priority.remember_lag("orders.eu", 12.5)
    priority.remember_lag("orders.eu", None)  # unknown: the last figure stays
    assert written == [("cairn_time_lag.orders.eu", "12.5")]


@pytest.mark.parametrize(
    ("path", "kind"), [("dags/cairn_archive.py", "archive"), ("dags/cairn_rebuild.py", "rebuild")]
)
def test_a_task_process_builds_only_its_own_dag(monkeypatch, path, kind):
    """The DAG processor builds every topic's DAG; a task process (Airflow's parsing context
    names its DAG) builds only its own, so a task's start does not grow with the fleet."""
    fleet = [parsing(f"fleet.t{i:03d}") for i in range(30)]
    monkeypatch.setattr(dag_topics, "configured_topics", lambda: fleet)
    file = str(Path(__file__).resolve().parents[2] / path)

    def built() -> set[str]:
        return {v.dag_id for v in runpy.run_path(file).values() if isinstance(v, DAG)}

    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    assert built() == {dag_id(kind, cfg.topic) for cfg in fleet}
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", dag_id(kind, "fleet.t007"))
    assert built() == {dag_id(kind, "fleet.t007")}
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "some_other_dag")
    assert built() == set()


@pytest.mark.parametrize("path", ["dags/cairn_archive.py", "dags/cairn_seal.py"])
def test_parsing_a_dag_file_leaves_the_pipeline_unimported(path):
    """A DAG file is parsed at every task start and at every batch of the DAG processor's
    callbacks: Cairn's pipeline, the Spark jobs and what they bring (pyspark, pyarrow and
    numpy, a few tenths of a second) load only where a step or a job runs."""
    pipeline = ["cairn.pipeline.completeness", "cairn.pipeline.archive_run", "spark_jobs.main"]
    heavy = [*pipeline, "pyspark", "pyarrow", "numpy"]
    probe = (
        f"import runpy, sys; runpy.run_path({path!r}); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def task_callback(topic: str, state: TaskInstanceState) -> TaskCallbackRequest:
    """The request Airflow sends the DAG processor for a task of `topic`'s archive DAG that
    ended in `state`."""
    ti = {"dag_id": dag_id("archive", topic), "task_id": "commit", "run_id": "r"}
    ti |= {"id": uuid.uuid4(), "try_number": 1, "map_index": -1, "dag_version_id": uuid.uuid4()}
    return TaskCallbackRequest(
        filepath="cairn_archive.py",
        bundle_name="dags-folder",
        bundle_version=None,
        ti=ti,
        task_callback_type=state,
    )


def test_a_callback_parse_builds_only_the_dags_with_callbacks(monkeypatch):
    """Airflow's DAG processor parses the file again for each batch of callbacks, one sent for
    every task a trigger ends as succeeded: such a parse builds only their DAGs, a full parse
    (or any other caller) every topic's."""
    fleet = [parsing(f"fleet.t{i:03d}") for i in range(30)]
    monkeypatch.setattr(dag_topics, "configured_topics", lambda: fleet)
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    dags_folder = Path(__file__).resolve().parents[2] / "dags"
    bags = []
    monkeypatch.setattr(processor, "_execute_callbacks", lambda bag, *_: bags.append(bag))
    monkeypatch.setattr(processor, "_serialize_dags", lambda bag, _: (bags.append(bag) or [], {}))

    def parse(*callback_dag_ids: str) -> set[str]:
        requests = [
            DagCallbackRequest(
                filepath="cairn_archive.py",
                bundle_name="dags-folder",
                bundle_version=None,
                dag_id=d,
                run_id="r",
            )
            for d in callback_dag_ids
        ]
        return parse_requests(requests)

    def parse_requests(requests: list) -> set[str]:
        request = processor.DagFileParseRequest(
            file=str(dags_folder / "cairn_archive.py"),
            bundle_path=dags_folder,
            bundle_name="dags-folder",
            callback_requests=requests,
        )
        processor._parse_file(request, structlog.get_logger())
        return set(bags.pop().dag_ids)

    wanted = {dag_id("archive", "fleet.t003"), dag_id("archive", "fleet.t017")}
    assert parse(*wanted) == wanted
    assert parse() == {dag_id("archive", cfg.topic) for cfg in fleet}
    assert dag_topics.callback_dag_ids() is None

    # a task's success callback (one for every step the triggerer ends) needs no DAG: Airflow
    # ignores it before looking for one; a failure's or a retry's needs its DAG
    successes = [task_callback(f"fleet.t{i:03d}", TaskInstanceState.SUCCESS) for i in (1, 2)]
    failure = task_callback("fleet.t009", TaskInstanceState.FAILED)
    retry = task_callback("fleet.t011", TaskInstanceState.UP_FOR_RETRY)
    reads = []
    monkeypatch.setattr(dag_topics, "configured_topics", lambda: reads.append(1) or fleet)
    assert (parse_requests(successes), reads) == (set(), [])  # not even the topics file read
    assert parse_requests([*successes, failure, retry]) == {
        dag_id("archive", "fleet.t009"),
        dag_id("archive", "fleet.t011"),
    }


def test_a_topic_run_when_records_wait_is_watched_and_its_first_run_waits_for_them():
    dag = archive_dag(parsing("orders.eu", max_delay="20s", lateness="2h"))
    assert dag.start_date is None  # else Airflow runs the cron's latest past time at once
    (watcher,) = dag.timetable.asset_condition.watchers
    assert watcher.trigger.topic == "orders.eu"
    assert watcher.trigger.rule == WaitRule(min_records=100_000, max_delay=20.0)
    assert dag.timetable.timetable.expression == completion_cron("orders.eu", 120)
    # What the scheduler makes of it, for any time of day: the next completion time, never the
    # latest past one (which, for a thousand new topics, would be a thousand runs at once).
    daily = dag.timetable.timetable
    scheduled = CronTriggerTimetable(
        daily.expression, timezone=daily.timezone, run_immediately=daily.run_immediately
    )
    restriction = TimeRestriction(earliest=dag.start_date, latest=None, catchup=dag.catchup)
    for now in (datetime(2026, 11, 28, h, m, tzinfo=UTC) for h in range(24) for m in (0, 30)):
        with mock.patch("airflow.timetables.trigger.utcnow", return_value=now):
            first = scheduled.next_dagrun_info(
                last_automated_data_interval=None, restriction=restriction
            )
        assert first.run_after > now


def test_a_dags_doc_shows_the_topics_effective_configuration_as_topics_yaml_reads_it():
    """The YAML in every DAG's doc is the topic's whole configuration, defaults merged in:
    loading it back gives the same topic (libyaml or PyYAML writes it)."""
    cfg = parsing("orders.eu", max_delay="90s", spark_timeout="45m")
    doc = archive_dag(cfg).doc_md
    written = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert written == dag_topics.topic_yaml(cfg)
    assert TopicConfig.model_validate(yaml.safe_load(written)) == cfg


def test_airflow_runs_nothing_for_a_success_callback_and_looks_for_no_dag():
    """What `callback_dag_ids` relies on to build no DAG for success callbacks: Airflow returns
    from one before it looks its DAG up, so an empty DAG bag is no error. A failure callback
    does look its DAG up (and would fail to find it)."""
    empty = SimpleNamespace(dags={})
    log = structlog.get_logger()
    success = task_callback("orders", TaskInstanceState.SUCCESS)
    processor._execute_task_callbacks(empty, success, log)
    failure = task_callback("orders", TaskInstanceState.FAILED)
    with pytest.raises(ValueError, match=r"archive__orders.* not found in DagBag"):
        processor._execute_task_callbacks(empty, failure, log)
