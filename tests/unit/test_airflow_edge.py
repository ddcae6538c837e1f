"""The Airflow edge: errors a retry would only repeat fail without retries; connections become
the plain values the core takes."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

import cairn_failures
from cairn.config import TopicConfig
from cairn.kafka.cluster import TopicNotFound
from cairn.pipeline.plan import Plan, RetentionGap, TopicRecreated
from cairn.pipeline.rebuild import NoDates
from cairn.protocol.commit import Conflict, Fenced
from cairn.protocol.manifest import VerificationFailed
from cairn.protocol.rewind import RewindRefused
from cairn_connect import Connected, shared_session_id
from cairn_connections import schema_registries
from cairn_failures import CAUSE_KEY, fail_fast
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
    monkeypatch.setattr(cairn_failures, "get_current_context", lambda: {"ti": ti})
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

    import cairn_spark_operator

    cfg = TopicConfig.model_validate(
        {"topic": "orders", "format": "raw", "archive_root": storage.url}
    )
    monkeypatch.setattr(cairn_spark_operator, "find_topic", lambda topic: cfg)
    monkeypatch.setenv(
        "AIRFLOW_CONN_CAIRN_KAFKA",
        '{"conn_type": "kafka", "extra": {"bootstrap.servers": "kafka:9092",'
        ' "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",'
        ' "sasl.username": "u", "sasl.password": "kafka-secret"}}',
    )
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "connector.jar").write_bytes(b"")
    monkeypatch.setattr(cairn_spark_operator, "SPARK_JARS_DIR", jars)
    calls: dict = {"sessions": [], "runs": [], "submitted": []}
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", FakeBuilder(calls["sessions"]))

    def run(spark, argv):
        calls["runs"].append((spark, list(argv), dict(os.environ)))
        if calls.get("raise"):
            raise calls["raise"]
        return "wrote 1 files for 1 records"

    monkeypatch.setattr(cairn_spark_operator, "spark_job", lambda job: SimpleNamespace(run=run))

    def submit(self, context):
        calls["submitted"].append((self.application, self.application_args, self.env_vars))

    monkeypatch.setattr(cairn_spark_operator.SparkSubmitOperator, "execute", submit)
    claim = claim_next(storage)
    plan = Plan(topic="orders", ranges={0: (0, 1)}, capped=False)
    payload = {"claim": claim.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}

    def make(conn: dict, payload: dict = payload):
        monkeypatch.setenv("AIRFLOW_CONN_CAIRN_SPARK", json.dumps(conn))
        op = cairn_spark_operator.CairnSparkOperator(
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
