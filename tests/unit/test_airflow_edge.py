"""The Airflow edge: errors a retry would only repeat fail without retries; connections become
the plain values the core takes."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from cairn.config import TopicConfig
from cairn.kafka.cluster import TopicNotFound
from cairn.pipeline.rebuild import NoDates
from cairn.protocol.commit import Conflict, Fenced
from cairn.protocol.manifest import VerificationFailed
from cairn.protocol.plan import Plan, RetentionGap, TopicRecreated
from cairn.protocol.rewind import RewindRefused
from cairn.topics_file import TopicNotConfigured
from cairn_airflow import dag_topics, failures
from cairn_airflow.failures import CAUSE_KEY, fail_fast
from cairn_airflow.hooks.connections import schema_registries
from cairn_airflow.hooks.spark_connect import Connected, shared_session_id
from tests.unit.conftest import claim_next


@pytest.mark.parametrize(
    "error",
    [
        Fenced,
        Conflict,
        RetentionGap,
        VerificationFailed,
        TopicRecreated,
        RewindRefused,
        TopicNotFound,
        NoDates,
    ],
)
def test_permanent_errors_fail_the_task_without_retries_keeping_the_message(error):
    with pytest.raises(AirflowFailException, match="topic 'orders'"), fail_fast():
        raise error("topic 'orders': what went wrong")


def test_a_permanent_errors_cause_is_kept_on_one_line_for_the_overview_page(monkeypatch):
    pushed = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value}))
    monkeypatch.setattr(failures, "get_current_context", lambda: {"ti": ti})
    with pytest.raises(AirflowFailException), fail_fast():
        raise NoDates("topic 'orders': to_date 2024-05-01\n  is before from_date 2024-05-02")
    assert pushed == {
        CAUSE_KEY: "NoDates: topic 'orders': to_date 2024-05-01 is before from_date 2024-05-02"
    }


def test_other_errors_stay_retryable():
    with pytest.raises(ConnectionError), fail_fast():
        raise ConnectionError("broker not reachable")


def test_schema_registry_connections_become_client_configs(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_CAIRN_SCHEMA_REGISTRY",
        '{"conn_type": "http", "host": "https://sr.example.com", "port": 8081,'
        ' "login": "key", "password": "secret", "extra": {"timeout": 5}}',
    )
    cfg = TopicConfig.model_validate(
        {"topic": "t", "format": "avro", "avro": {"registry": "cairn_schema_registry"}}
    )
    assert schema_registries(cfg) == {
        "cairn_schema_registry": {
            "url": "https://sr.example.com:8081",
            "basic.auth.user.info": "key:secret",
            "timeout": 5,
        }
    }
    assert schema_registries(TopicConfig(topic="r", format="raw")) == {}


# --- CairnSparkOperator: the Spark connection's type chooses Spark Connect or spark-submit ----


class FakeSession:
    """What the operator asks of a Spark Connect session, recorded."""

    version = "4.0.0"

    def __init__(self, url: str, sessions: list) -> None:
        self.url, self.stopped, self.released = url, False, False
        self.tags: list[str] = []
        self.interrupted: list[str] = []
        self.release_session_on_close = True
        sessions.append(self)

    def stop(self) -> None:
        self.stopped, self.released = True, self.release_session_on_close

    def addTag(self, tag: str) -> None:
        self.tags.append(tag)

    def interruptTag(self, tag: str) -> list:
        self.interrupted.append(tag)
        return []


class FakeBuilder:
    def __init__(self, sessions: list) -> None:
        self.sessions = sessions

    def remote(self, url: str) -> FakeBuilder:
        self.url = url
        return self

    def create(self) -> FakeSession:
        return FakeSession(self.url, self.sessions)


@pytest.fixture
def spark_op(monkeypatch, storage, tmp_path):
    """A CairnSparkOperator for topic `orders` (archive root: `storage`) with a live claim, a
    Kafka connection, a fake Spark Connect session builder and a recording spark-submit."""
    import pyspark.sql

    from cairn_airflow.operators import spark as spark_operator

    cfg = TopicConfig.model_validate(
        {"topic": "orders", "format": "raw", "archive_root": storage.url}
    )
    monkeypatch.setattr(spark_operator, "find_topic", lambda topic: cfg)
    monkeypatch.setenv(
        "AIRFLOW_CONN_CAIRN_KAFKA",
        '{"conn_type": "kafka", "extra": {"bootstrap.servers": "kafka:9092",'
        ' "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",'
        ' "sasl.username": "u", "sasl.password": "kafka-secret"}}',
    )
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "connector.jar").write_bytes(b"")
    monkeypatch.setattr(spark_operator, "SPARK_JARS_DIR", jars)
    calls: dict = {"sessions": [], "runs": [], "submitted": []}
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", FakeBuilder(calls["sessions"]))

    def run(spark, argv):
        calls["runs"].append((spark, list(argv), dict(os.environ)))
        if calls.get("raise"):
            raise calls["raise"]
        return "wrote 1 files for 1 records"

    monkeypatch.setattr(spark_operator, "spark_job", lambda job: SimpleNamespace(run=run))

    def submit(self, context):
        calls["submitted"].append((self.application, self.application_args, self.env_vars))

    monkeypatch.setattr(spark_operator.SparkSubmitOperator, "execute", submit)
    claim = claim_next(storage)
    plan = Plan(topic="orders", ranges={0: (0, 1)}, capped=False)
    payload = {"claim": claim.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}

    def make(conn: dict, payload: dict = payload):
        monkeypatch.setenv("AIRFLOW_CONN_CAIRN_SPARK", json.dumps(conn))
        op = spark_operator.CairnSparkOperator(
            task_id="archive", job="archive", topic="orders", payload=payload
        )
        return op, calls, claim

    return make


CONNECT = {"conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002}


def test_a_spark_connect_connection_runs_the_job_in_the_task_on_the_servers_shared_session(
    spark_op,
):
    op, calls, claim = spark_op(CONNECT)

    op.execute({})

    assert not calls["submitted"]
    [session] = calls["sessions"]
    assert session.url.startswith("sc://spark.example:15002/;")
    assert session.url.endswith(f";session_id={shared_session_id()}")
    # the run's work is tagged (and cleaned up by its tag); the session stays for the next run
    [tag] = session.tags
    assert session.interrupted == [tag] and session.stopped and not session.released
    [(spark, argv, env)] = calls["runs"]
    assert spark is session
    assert argv == ["--topic", "orders", "--claim", claim.key]  # as spark-submit would pass
    assert "kafka-secret" in env["CAIRN_KAFKA_CONFIG"]  # secrets as environment, not argv
    assert "CAIRN_KAFKA_CONFIG" not in os.environ  # only while the job ran


def test_a_spark_connection_still_spark_submits_the_jobs_file(spark_op):
    op, calls, claim = spark_op({"conn_type": "spark", "host": "spark://master", "port": 7077})

    op.execute({})

    assert not calls["sessions"] and not calls["runs"]
    [(application, argv, env)] = calls["submitted"]
    assert application.endswith("spark_jobs/archive.py")
    assert argv == ["--topic", "orders", "--claim", claim.key]
    assert "kafka-secret" in env["CAIRN_KAFKA_CONFIG"] and "kafka-secret" not in " ".join(argv)


def test_on_connect_a_permanent_error_fails_without_retries_and_releases_the_session(spark_op):
    op, calls, _ = spark_op(CONNECT)
    calls["raise"] = Fenced("topic 'orders': a newer attempt claimed token 1")

    with pytest.raises(AirflowFailException, match="newer attempt"):
        op.execute({})
    [session] = calls["sessions"]
    assert session.stopped and session.interrupted == session.tags


def test_on_connect_other_errors_stay_retryable_and_release_the_session(spark_op):
    op, calls, _ = spark_op(CONNECT)
    calls["raise"] = ConnectionError("Spark Connect server not reachable")

    with pytest.raises(ConnectionError):
        op.execute({})
    [session] = calls["sessions"]
    assert session.stopped and session.interrupted == session.tags


def test_on_connect_a_fenced_out_claim_or_an_empty_plan_starts_no_session(spark_op, storage):
    op, calls, claim = spark_op(CONNECT)
    claim_next(storage)  # a newer attempt claimed the next link: this one is fenced out
    with pytest.raises(AirflowFailException):
        op.execute({})
    empty = Plan(topic="orders", ranges={0: (1, 1)}, capped=False).model_dump(mode="json")
    op, _, _ = spark_op(CONNECT, {"claim": claim.model_dump(mode="json"), "plan": empty})
    op.execute({})
    assert not calls["sessions"] and not calls["runs"] and not calls["submitted"]


def test_killing_the_task_interrupts_its_runs_work_alone_and_touches_no_spark_submit(spark_op):
    op, calls, _ = spark_op(CONNECT)
    op.on_kill()  # before any Spark work: nothing to stop, and no spark-submit hook is made
    assert op._hook is None
    session = FakeSession("sc://spark.example:15002", calls["sessions"])
    op._connected = Connected(session, "cairn-run-1", shared=True)
    op.on_kill()
    assert session.interrupted == ["cairn-run-1"]  # by the run's tag: other runs go on


BROKEN = "topics:\n  - {topic: ok, format: raw}\n  - topic: orders\n    format: raw\n"
BROKEN += "    codec: lz4\n"


@pytest.mark.parametrize(("kind", "task_id"), [("archive", "plan"), ("rebuild", "select")])
def test_a_run_whose_topic_entry_broke_fails_at_once_with_the_mistake(
    monkeypatch, tmp_path, kind, task_id
):
    """A task process parsing a DAG file for a topic whose entry broke after the run started
    gets a stand-in DAG whose task fails without retries naming file, line and field, instead
    of no DAG (up_for_reschedule for minutes, then "Dag not found"). The DAG processor still
    builds no DAG for the topic."""

    topics = tmp_path / "topics.yaml"
    topics.write_text(BROKEN)
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", topics)
    file = str(Path(__file__).resolve().parents[2] / "dags" / f"cairn_{kind}.py")

    def built() -> dict[str, DAG]:
        return {v.dag_id: v for v in runpy.run_path(file).values() if isinstance(v, DAG)}

    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)
    assert f"{kind}__orders" not in built()  # the DAG processor: gone until fixed
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", f"{kind}__orders")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", task_id)
    (stand_in,) = built().values()
    task = stand_in.task_dict[task_id]
    assert stand_in.dag_id == f"{kind}__orders" and task.retries == 0
    with pytest.raises(AirflowFailException) as failed:
        task.execute({})
    assert str(failed.value) == (
        f"TopicNotConfigured: {topics}, line 5: topic 'orders': codec: Input should be "
        "'deflate', 'snappy', 'zstandard' or 'null'; fix the entry"
    )
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", f"{kind}__gone")  # entry removed
    (stand_in,) = built().values()
    with pytest.raises(AirflowFailException, match=f"topic 'gone' is not configured in {topics}"):
        stand_in.task_dict[task_id].execute({})
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "archive__ok")
    assert {d.dag_id for d in built().values()} == ({"archive__ok"} if kind == "archive" else set())


def test_a_spark_task_whose_topic_entry_broke_fails_without_retries(spark_op, monkeypatch):
    from cairn_airflow.operators import spark as spark_operator

    op, calls, _ = spark_op(CONNECT)

    def broken(topic):
        raise TopicNotConfigured(f"topics.yaml, line 6: topic {topic!r}: codec: bad; fix it")

    monkeypatch.setattr(spark_operator, "find_topic", broken)
    with pytest.raises(AirflowFailException, match="line 6: topic 'orders': codec"):
        op.execute({})
    assert not calls["sessions"] and not calls["submitted"]


def test_each_commit_remembers_its_root_and_a_first_run_elsewhere_gets_it(monkeypatch, tmp_path):
    """The Variable is written only when the root changed; an unwritable Variable never fails
    the run that committed."""
    from cairn_airflow import root_memory

    variables: dict[str, str] = {}
    writes = []

    def set_variable(key, value, description=None):
        writes.append(key)
        variables[key] = value

    monkeypatch.setattr(
        root_memory.Variable, "get", lambda key, default=None: variables.get(key, default)
    )
    monkeypatch.setattr(root_memory.Variable, "set", set_variable)
    first = TopicConfig(topic="orders", format="raw", archive_root=f"file://{tmp_path}/a")
    moved = first.model_copy(update={"archive_root": f"file://{tmp_path}/b"})

    assert root_memory.earlier_roots(first) == {}
    root_memory.remember_root(first)
    root_memory.remember_root(first)
    assert writes == ["cairn_archive_root.orders"]
    assert root_memory.earlier_roots(first) == {}  # the same root is no witness
    (root, opened), *more = root_memory.earlier_roots(moved).items()
    assert not more and root == first.archive_root and opened.url == first.root.storage_url

    def broken(*args, **kwargs):
        raise ConnectionError("api-server gone")

    monkeypatch.setattr(root_memory.Variable, "set", broken)
    root_memory.remember_root(moved)  # logged, not raised
