"""The jobs on the long-lived Spark Connect server, as the Airflow task runs them when its Spark
connection is a `spark_connect` one: the same `archive` and `rebuild` as under spark-submit, on
the server's shared Cairn session (its Python workers, which import `cairn`, stay warm between
runs), each run's work tagged so that killing one run stops nothing else, a session of its own
when the shared one is closed, and no secret on the server's command line or in its
environment."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cairn.kafka.connection import KafkaAccessDenied, KafkaConf
from cairn.protocol import commit
from cairn_airflow.hooks import spark_connect as connect_hook
from cairn_airflow.hooks.spark_connect import (
    CONNECT_MODE,
    Connected,
    connect_mark_kept,
    connect_session,
    with_session_id,
)
from cairn_airflow.spark_artifact import code_artifact
from cairn_stack import services
from cairn_stack.demo import create_topic, produce
from spark_jobs.archive import ARROW_CONF
from tests.integration.conftest import Archiver, process_tree, read_archive
from tests.integration.test_archive import all_offsets, assert_exactly_once
from tests.integration.test_rebuild import DAY, NOON, folders_of, sent_late
from tests.integration.test_secured_kafka import LABEL, WRONG_PASSWORD, changed, create_and_fill

ARROW_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"


def test_archive_and_rebuild_run_on_the_servers_shared_session(
    kafka, s3, connected, spark_connect, make_cfg, topic_name, stack_settings
) -> None:
    create_topic(kafka, topic_name, partitions=2)
    times = {f"e{i}": NOON + timedelta(minutes=37 * i) for i in range(20)}  # 12:00 to 23:43
    for p in range(2):
        values = [sent_late(i, times[f"e{i}"]) for i in range(p, 20, 2)]
        produce(kafka, topic_name, values, partition=p)
    root = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/connect-{topic_name}"
    buggy = make_cfg(topic_name, "event_time: {field: sent_at, encoding: iso8601}\n", root)
    archiver = Archiver(connected, kafka, s3)

    summary = archiver.run(buggy)

    assert summary.counts.read == summary.counts.backup == 20
    storage = archiver.storage(buggy)
    assert_exactly_once(read_archive(storage, topic_name), all_offsets({0: 10, 1: 10}))
    assert connected.conf.get(ARROW_RECORDS) == ARROW_CONF[ARROW_RECORDS]  # set by the job

    fixed = make_cfg(topic_name, root=root)  # event_time: ts
    for day in (DAY, DAY + timedelta(days=1)):  # each date's backup files, one task each
        assert len(archiver.rebuild(fixed, day).sources) == 2

    contents = read_archive(storage, topic_name)
    assert_exactly_once(contents, all_offsets({0: 10, 1: 10}))
    assert folders_of(contents) == {e: ts.strftime("dt=%Y-%m-%d/hr=%H") for e, ts in times.items()}

    # The next run joins the same session (it sees the job's settings) and its Python workers:
    # the server starts no daemon for it, and keeps the session's when the run lets go.
    daemons = python_daemons(stack_settings)
    assert daemons, "the runs' Python functions ran in no daemon of the server"
    with connect_session(spark_connect, code_artifact()) as again:
        assert again.shared and again.session.conf.get(ARROW_RECORDS) == ARROW_CONF[ARROW_RECORDS]
        ran = again.session.range(0, 2, 1, 2).mapInArrow(lambda batches: batches, "id long")
        assert ran.count() == 2
        assert python_daemons(stack_settings) == daemons
    assert python_daemons(stack_settings) == daemons


@pytest.fixture
def connect_mode_kept():
    """PySpark's process-wide Connect mark as it was, after a test that starts sessions outside
    `connect_session` or two at once (later tests here run classic Spark)."""
    with connect_mark_kept():
        yield


def test_killing_a_run_interrupts_its_work_and_no_other_runs(
    spark_connect, tmp_path, connect_mode_kept
) -> None:
    """Two runs at once on the shared session; `interrupt` (the operator's `on_kill`) of one
    cancels its query while the other's, running beside it, finishes."""
    held: dict[str, Connected] = {}
    outcome: dict[str, object] = {}

    def run(name: str, seconds: float) -> None:
        marker = tmp_path / name

        def sleep(batches):
            import time

            marker.touch()  # the task is running
            time.sleep(seconds)
            yield from batches

        with connect_session(
            spark_connect, code_artifact()
        ) as connected:  # tags the work of this thread
            held[name] = connected
            try:
                query = connected.session.range(0, 1, 1, 1).mapInArrow(sleep, "id long")
                outcome[name] = query.count()
            except Exception as err:
                outcome[name] = err

    threads = [
        threading.Thread(target=run, args=("killed", 120)),
        threading.Thread(target=run, args=("other", 8)),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all((tmp_path / n).exists() for n in ("killed", "other")):
        assert time.monotonic() < deadline, "the two runs' tasks did not both start"
        time.sleep(0.2)
    held["killed"].interrupt()
    for t in threads:
        t.join(90)

    assert held["killed"].shared and held["other"].shared
    assert isinstance(outcome["killed"], Exception), outcome["killed"]
    assert "OPERATION_CANCELED" in str(outcome["killed"]) or "cancel" in str(outcome["killed"])
    assert outcome["other"] == 1


def test_a_short_job_starts_beside_a_long_one_not_after_it(
    spark_connect, tmp_path, connect_mode_kept
) -> None:
    """The server schedules jobs FAIR (`services.SCHEDULER`): an archive run's job submitted
    while a long seal job still has tasks to start gets the next free task slot. First in,
    first out, it would start only once every task of the long job had started."""

    def started_and_slept(name: str, seconds: float):
        def run(batches):
            import time

            (tmp_path / f"{name}-{uuid.uuid4().hex}").write_text(repr(time.time()))
            time.sleep(seconds)
            yield from batches

        return run

    def starts(prefix: str) -> list[float]:
        return [float(p.read_text()) for p in tmp_path.glob(f"{prefix}-*")]

    with connect_session(spark_connect, code_artifact()) as probe:
        master = probe.session.conf.get("spark.master")
    slots = re.fullmatch(r"local\[(\d+)\]", master or "")
    assert slots, f"the test server's master is {master!r}, not local[N]"
    waves = 6
    tasks = waves * int(slots.group(1))

    def long_job() -> None:
        with connect_session(spark_connect, code_artifact()) as connected:
            query = connected.session.range(0, tasks, 1, tasks)
            assert query.mapInArrow(started_and_slept("long", 1.0), "id long").count() == tasks

    long = threading.Thread(target=long_job)
    long.start()
    deadline = time.monotonic() + 60
    while not starts("long"):
        assert time.monotonic() < deadline, "the long job's tasks did not start"
        time.sleep(0.1)
    with connect_session(spark_connect, code_artifact()) as connected:
        short = connected.session.range(0, 1, 1, 1)
        assert short.mapInArrow(started_and_slept("short", 0), "id long").count() == 1
    long.join(120)

    assert not long.is_alive() and len(starts("long")) == tasks
    (short_start,) = starts("short")
    later = [t for t in starts("long") if t > short_start]
    assert later, "the short job's task started only after every task of the long one"


def test_when_the_shared_session_is_closed_a_run_has_its_own_and_stops_its_workers(
    spark_connect, stack_settings, monkeypatch, connect_mode_kept
) -> None:
    session_id = str(uuid.uuid4())
    monkeypatch.setattr(connect_hook, "session_id", lambda artifact: session_id)
    closed = SparkSession.builder.remote(with_session_id(spark_connect, session_id)).create()
    assert closed.range(2).count() == 2
    closed.stop()  # released: the server refuses this id from now on, as after an idle timeout
    before = python_daemons(stack_settings)

    with connect_session(spark_connect, code_artifact()) as own:
        assert not own.shared
        ran = own.session.range(0, 2, 1, 2).mapInArrow(lambda batches: batches, "id long")
        assert ran.count() == 2
        ours = python_daemons(stack_settings) - before
        assert ours, "the session's Python functions ran in no daemon of its own"

    # Spark 4.0 never stops a session's daemon (SPARK-54055); the run asks it to go.
    deadline = time.monotonic() + 30
    while python_daemons(stack_settings) & ours and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not python_daemons(stack_settings) & ours


def test_a_refused_login_fails_with_kafka_access_denied_and_no_secret_reaches_the_server(
    kafka_secured, connected, s3, make_cfg, topic_name, stack_settings
) -> None:
    create_and_fill(kafka_secured, topic_name, per_partition=5)
    root = f"s3://{stack_settings.s3_conn_id}@{stack_settings.bucket}/connect-{topic_name}"
    cfg = make_cfg(topic_name, root=root)
    good = Archiver(connected, KafkaConf(kafka_secured, LABEL), s3)
    planned = good.plan(cfg)
    bad = KafkaConf(changed(kafka_secured, WRONG_PASSWORD), LABEL)

    with pytest.raises(KafkaAccessDenied) as refused:
        Archiver(connected, bad, s3).write(cfg, planned)

    message = str(refused.value)
    assert message.startswith(f"{LABEL} (bootstrap servers") and "Sasl" in message
    assert commit.newest(good.storage(cfg), topic_name) is None
    # The run with the right settings goes through; the server's processes (the JVM and its
    # Python workers) never had the password or the S3 secret in their argv or environment.
    good.write(cfg, planned)
    assert good.finish(cfg, planned).counts.backup == 10
    secrets = [kafka_secured["sasl.password"], stack_settings.s3_secret_key]
    seen = server_processes(stack_settings)
    assert seen, "no Spark Connect server process found"
    for pid, text in seen.items():
        assert not [s for s in secrets if s in text], f"a secret in process {pid}'s argv/env"


def server_processes(settings) -> dict[int, str]:
    """argv and environment of the Spark Connect server and all its descendants (its Python
    daemons make process groups of their own)."""
    found = {}
    for pid in process_tree(services.spark_connect(settings).pid()):
        try:
            found[pid] = " ".join(
                (Path(f"/proc/{pid}") / name).read_bytes().decode(errors="replace")
                for name in ("cmdline", "environ")
            )
        except OSError:
            continue
    return found


def python_daemons(settings) -> set[int]:
    """The server's Python worker daemons and their workers (forks: the same command line)."""
    module = services.PYTHON_DAEMON["spark.python.daemon.module"]
    return {pid for pid, text in server_processes(settings).items() if f"-m\0{module}\0" in text}


def test_after_a_connect_session_the_process_still_runs_classic_spark(spark_connect, spark):
    """PySpark marks a process as Spark Connect for good once it starts a remote session; the
    mark goes with the session, so a later classic session (or a spark-submit this process
    starts) is not sent to Connect."""
    with connect_session(spark_connect, code_artifact()) as connected:
        assert connected.session.range(3).count() == 3
    assert CONNECT_MODE not in os.environ
    rows = spark.range(4).mapInArrow(lambda batches: batches, "id long").collect()
    assert sorted(r.id for r in rows) == [0, 1, 2, 3]
