"""The Airflow edge: errors a retry would only repeat fail without retries; connections become
the plain values the core takes."""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from airflow.triggers.base import TaskSuccessEvent

import spark_jobs.main
from cairn.config import TopicConfig
from cairn.jobs import ArchiveInput, from_env
from cairn.kafka.cluster import TopicNotFound
from cairn.pipeline.rebuild import NoDates
from cairn.protocol.commit import Conflict, Fenced
from cairn.protocol.manifest import VerificationFailed
from cairn.protocol.plan import Plan, RetentionGap, TopicRecreated
from cairn.protocol.rewind import RewindRefused
from cairn.topics_file import TopicNotConfigured
from cairn_airflow import dag_topics, failures, job_inputs
from cairn_airflow.failures import CAUSE_KEY, fail_fast
from cairn_airflow.hooks.connections import schema_registries
from cairn_airflow.hooks.spark_connect import Connected, session_id
from cairn_airflow.operators import spark as spark_operator
from cairn_airflow.spark_artifact import code_artifact
from cairn_airflow.triggers import shared_archive
from cairn_airflow.triggers.shared_archive import SharedArchiveTrigger
from tests.unit.conftest import claim_next
from tests.unit.test_shared_archive import staged


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
        self.artifacts: list[tuple[str, bool]] = []
        self.interrupted: list[str] = []
        self.release_session_on_close = True
        sessions.append(self)

    def stop(self) -> None:
        self.stopped, self.released = True, self.release_session_on_close

    def addArtifacts(self, *paths: str, pyfile: bool = False) -> None:
        self.artifacts.extend((path, pyfile) for path in paths)

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

    cfg = TopicConfig.model_validate(
        {"topic": "orders", "format": "raw", "archive_root": storage.url}
    )
    monkeypatch.setattr(job_inputs, "find_topic", lambda topic: cfg)
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

    def run(spark, job):
        calls["runs"].append((spark, job, dict(os.environ)))
        if calls.get("raise"):
            raise calls["raise"]
        return "wrote 1 files for 1 records"

    monkeypatch.setattr(spark_jobs.main, "run", run)

    def submit(self, context):
        calls["submitted"].append(
            (self.application, self.application_args, self.env_vars, self.py_files, self.conf)
        )

    monkeypatch.setattr(spark_operator.SparkSubmitOperator, "execute", submit)
    claim = claim_next(storage)
    plan = Plan(topic="orders", ranges={0: (0, 1)}, capped=False)
    payload = {"claim": claim.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}

    def make(conn: dict, payload: dict = payload, archive_root: str | None = None):
        """`archive_root`: another root for the entry, the claim still read from `storage`."""
        if archive_root is not None:
            other = cfg.model_copy(update={"archive_root": archive_root})
            monkeypatch.setattr(job_inputs, "find_topic", lambda topic: other)
            monkeypatch.setattr(job_inputs, "storage", lambda cfg: storage)
            monkeypatch.setattr(job_inputs, "storage_options", lambda cfg, for_spark: {})
        monkeypatch.setenv("AIRFLOW_CONN_CAIRN_SPARK", json.dumps(conn))
        op = spark_operator.CairnSparkOperator(
            task_id="archive", job="archive", cfg=cfg, payload=payload
        )
        return op, calls, claim

    return make


CONNECT = {"conn_type": "spark_connect", "host": "sc://spark.example", "port": 15002}


def start(monkeypatch, payload: dict, try_number: int = 1) -> tuple[list, list]:
    """An archive task of `orders` started in the triggerer (`payload`: its plan task's
    result): its trigger's events, and the runs it queued for a shared job."""
    queued: list = []

    async def archive(self, job):
        queued.append((self, job))
        return staged(job.claim, "cairn-shared-1", 2)

    monkeypatch.setattr(shared_archive.Batcher, "archive", archive)
    monkeypatch.setattr(shared_archive, "_BATCHERS", {})
    trigger = SharedArchiveTrigger("orders", "cairn_spark", "plan")
    pulls = {"plan": payload}  # pulled by one map index: the triggerer serves no other query
    trigger.task_instance = SimpleNamespace(
        dag_id="archive__orders",
        run_id="manual__1",
        task_id="archive",
        try_number=try_number,
        xcom_pull=lambda task_ids, map_indexes: pulls[task_ids],
        get_template_context=lambda: {"dag_run": SimpleNamespace(clear_number=0)},
    )

    async def events():
        return [event async for event in trigger.run()]

    return asyncio.run(events()), queued


def test_a_first_try_on_spark_connect_stages_from_the_triggerer_in_a_shared_job(
    spark_op, monkeypatch
):
    op, calls, claim = spark_op(CONNECT)

    [done], [(batcher, job)] = start(monkeypatch, op.payload)

    assert isinstance(done, TaskSuccessEvent)  # no worker takes the task up
    assert not calls["sessions"] and not calls["runs"] and not calls["submitted"]
    [(url, one)] = shared_archive._BATCHERS.items()  # one Batcher per Spark Connect server
    assert one is batcher and url.startswith("sc://spark.example:15002")
    assert job.claim == claim.key and job.artifact == code_artifact().name
    assert job.kafka["sasl.password"] == "kafka-secret"  # resolved in the triggerer's memory


@pytest.mark.parametrize("why", ["retried", "unshared", "spark-submit"])
def test_a_retry_an_unshared_topic_or_spark_submit_comes_to_a_worker_to_run_alone(
    spark_op, monkeypatch, why
):
    op, calls, _ = spark_op(
        {"conn_type": "spark", "host": "local[2]"} if why == "spark-submit" else CONNECT
    )
    if why == "unshared":
        alone = job_inputs.find_topic("orders").model_copy(update={"share_spark_job": False})
        monkeypatch.setattr(job_inputs, "find_topic", lambda topic: alone)

    inputs: list = []
    resolving = job_inputs.job_input
    monkeypatch.setattr(job_inputs, "job_input", lambda *a: inputs.append(a) or resolving(*a))

    [event], queued = start(monkeypatch, op.payload, try_number=2 if why == "retried" else 1)

    assert not queued and "on_worker" in event.payload, event
    assert not inputs  # the worker resolves the job's input, once
    op.resume({}, event.payload)  # on the worker, in the Spark pool
    assert len(calls["submitted"] if why == "spark-submit" else calls["runs"]) == 1
    assert len(inputs) == 1


def test_in_the_triggerer_a_fenced_claim_fails_for_good_and_an_empty_plan_ends_the_task(
    spark_op, storage, monkeypatch
):
    op, calls, claim = spark_op(CONNECT)
    claim_next(storage)  # a newer attempt claimed the next link: this one is fenced out
    [fenced], queued = start(monkeypatch, op.payload)
    assert fenced.payload["permanent"] and fenced.payload["error"].startswith("Fenced")
    empty = Plan(topic="orders", ranges={0: (1, 1)}, capped=False).model_dump(mode="json")
    [done], more = start(monkeypatch, {"claim": claim.model_dump(mode="json"), "plan": empty})
    assert isinstance(done, TaskSuccessEvent)
    assert not queued and not more and not calls["sessions"] and not calls["runs"]


def test_a_run_the_shared_job_failed_raises_its_error_permanent_or_not(spark_op):
    op, _, _ = spark_op(CONNECT)
    with pytest.raises(AirflowFailException, match=r"orders.*Fenced: gone"):
        op.resume({}, {"error": "Fenced: gone", "permanent": True})
    with pytest.raises(AirflowException, match=r"orders.*SharedJobFailed") as raised:
        op.resume({}, {"error": "SharedJobFailed: x", "permanent": False})
    assert not isinstance(raised.value, AirflowFailException)


def test_a_spark_connect_connection_runs_the_job_in_the_task_on_the_servers_shared_session(
    spark_op,
):
    op, calls, claim = spark_op(CONNECT)

    op.execute({})

    assert not calls["submitted"]
    [session] = calls["sessions"]
    assert session.url.startswith("sc://spark.example:15002/;")
    artifact = code_artifact()
    assert session.url.endswith(f";session_id={session_id(artifact)}")  # this version's
    assert session.artifacts == [(str(artifact.path), True)]  # its code ships with the run
    # the run's work is tagged (and cleaned up by its tag); the session stays for the next run
    [tag] = session.tags
    assert session.interrupted == [tag] and session.stopped and not session.released
    [(spark, job, env)] = calls["runs"]
    assert spark is session
    assert isinstance(job, ArchiveInput) and job.claim == claim.key
    assert job.kafka["sasl.password"] == "kafka-secret"  # handed over in the task's memory
    assert job.artifact == artifact.name and job.topic.topic().topic == "orders"
    assert not [key for key in env if key.startswith("CAIRN_")]  # nothing set around the call


def test_a_spark_connection_spark_submits_the_entry_point_with_the_artifact(spark_op):
    cluster = {"conn_type": "spark", "host": "spark://master", "port": 7077}
    op, calls, claim = spark_op(cluster, archive_root="s3://c@bucket/x")

    op.execute({})

    assert not calls["sessions"] and not calls["runs"]
    [(application, argv, env, py_files, conf)] = calls["submitted"]
    assert application.endswith("spark_jobs/main.py") and py_files == str(code_artifact().path)
    assert not argv  # everything, secrets included, in one variable of the job's environment
    job = from_env(env)
    assert isinstance(job, ArchiveInput) and job.claim == claim.key
    assert job.kafka["sasl.password"] == "kafka-secret"
    # No interpreter path of this machine reaches the cluster's executors: theirs is the
    # cluster's (its `python3`, or the connection's extra); only the local driver runs this one.
    assert env["PYSPARK_PYTHON"] == "python3" and "spark.pyspark.python" not in conf
    assert conf["spark.pyspark.driver.python"] == sys.executable


def test_the_connections_extra_names_the_clusters_python_and_spark_properties(spark_op):
    extra = {"cairn": {"python": "/opt/py/bin/python3", "conf": {"spark.cores.max": "2"}}}
    extra["deploy-mode"] = "cluster"
    op, calls, _ = spark_op(
        {"conn_type": "spark", "host": "yarn", "extra": extra}, archive_root="s3://c@bucket/x"
    )

    op.execute({})

    [(_, _, _, _, conf)] = calls["submitted"]
    assert conf["spark.pyspark.python"] == "/opt/py/bin/python3"
    assert conf["spark.cores.max"] == "2"
    assert "spark.pyspark.driver.python" not in conf  # the driver runs on the cluster too


def test_a_topics_spark_connection_chooses_where_its_jobs_run(spark_op, monkeypatch):
    op, _, _ = spark_op(CONNECT)
    assert op._conn_id == "cairn_spark" and op.execution_timeout == timedelta(minutes=30)
    cfg = TopicConfig.model_validate(
        {"topic": "big", "format": "raw", "spark_connection": "emr", "spark_timeout": "2h"}
    )
    op = spark_operator.CairnSparkOperator(task_id="a", job="archive", cfg=cfg, payload={})
    assert op._conn_id == "emr" and op.execution_timeout == timedelta(hours=2)


def test_a_local_master_runs_the_executors_on_this_python(spark_op):
    op, calls, _ = spark_op({"conn_type": "spark", "host": "local[2]"})

    op.execute({})

    [(_, _, _, _, conf)] = calls["submitted"]
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"] == sys.executable


def test_a_local_archive_root_with_a_cluster_master_is_refused_before_any_spark_work(spark_op):
    op, calls, _ = spark_op({"conn_type": "spark", "host": "spark://master", "port": 7077})

    with pytest.raises(AirflowFailException) as refused:
        op.execute({})

    assert not calls["submitted"]
    assert str(refused.value).startswith("LocalStorageOnCluster: archive root file://")
    assert "spark://master:7077" in str(refused.value) and "s3://" in str(refused.value)


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

    op, calls, _ = spark_op(CONNECT)

    def broken(topic):
        raise TopicNotConfigured(f"topics.yaml, line 6: topic {topic!r}: codec: bad; fix it")

    monkeypatch.setattr(job_inputs, "find_topic", broken)
    with pytest.raises(AirflowFailException, match="line 6: topic 'orders': codec"):
        op.execute({})
    assert not calls["sessions"] and not calls["submitted"]


def test_a_commit_remembers_its_root_where_it_witnesses_and_a_first_run_elsewhere_gets_it(
    monkeypatch, tmp_path
):
    """A topic's first token at a root writes the Variable, and so does every commit of a topic
    without a consumer group (its only witness); a write reads nothing (one request to Airflow
    from the triggerer, not a read, its mask and a write); an unwritable Variable never fails
    the run that committed."""
    from cairn_airflow import root_memory

    variables: dict[str, str] = {}
    requests = []

    def get_variable(key, default=None):
        requests.append(("get", key))
        return variables.get(key, default)

    def set_variable(key, value, description=None):
        requests.append(("set", key))
        variables[key] = value

    monkeypatch.setattr(root_memory.Variable, "get", get_variable)
    monkeypatch.setattr(root_memory.Variable, "set", set_variable)
    first = TopicConfig(topic="orders", format="raw", archive_root=f"file://{tmp_path}/a")
    moved = first.model_copy(update={"archive_root": f"file://{tmp_path}/b"})

    assert root_memory.earlier_roots(first) == {}
    requests.clear()
    root_memory.remember_root(first, first=True)  # its first token at the root
    root_memory.remember_root(first, first=False)  # its consumer group is the witness now
    assert requests == [("set", "cairn_archive_root.orders")]
    no_group = first.model_copy(update={"commit_consumer_group": False})
    root_memory.remember_root(no_group, first=False)  # the root is its only witness
    assert requests == [("set", "cairn_archive_root.orders")] * 2
    assert root_memory.earlier_roots(first) == {}  # the same root is no witness
    (root, opened), *more = root_memory.earlier_roots(moved).items()
    assert not more and root == first.archive_root and opened.url == first.root.storage_url

    def broken(*args, **kwargs):
        raise ConnectionError("api-server gone")

    monkeypatch.setattr(root_memory.Variable, "set", broken)
    root_memory.remember_root(moved, first=True)  # logged, not raised
