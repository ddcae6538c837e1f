"""The Airflow edge of metrics and alerts: samples reach Airflow's stats (tagged, or in the name
for plain StatsD), the configured notifier is what failures and deadlines call, and a breach
fails the check task naming topic, value and limit."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowFailException

from cairn.config import TopicConfig
from cairn.pipeline import run_record
from cairn.views import metrics
from cairn_airflow import dag_topics, failures
from cairn_airflow import stats as airflow_stats
from cairn_airflow.notifications import notifier
from tests.unit.test_run_record import record


class Recorder:
    """Stands in for Airflow's `Stats`: remembers every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def gauge(self, name, value, tags=None):
        self.calls.append(("gauge", name, value, tags))

    def incr(self, name, count=1, tags=None):
        self.calls.append(("incr", name, count, tags))

    def timing(self, name, dt, tags=None):
        self.calls.append(("timing", name, dt, tags))


@pytest.fixture
def stats(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(airflow_stats, "Stats", recorder)
    return recorder


def test_samples_go_out_tagged_where_the_backend_keeps_tags(stats, monkeypatch) -> None:
    monkeypatch.setattr(airflow_stats, "_stats_take_tags", lambda: True)
    airflow_stats.emit(metrics.run_samples(record(3, read=4, time_lag=2.0)))
    p0 = {"topic": "orders", "partition": "0"}
    assert ("gauge", metrics.OFFSET_LAG, 5.0, p0) in stats.calls
    assert ("gauge", metrics.TIME_LAG, 2.0, p0) in stats.calls
    assert ("incr", metrics.RECORDS_ARCHIVED, 4, p0) in stats.calls
    assert ("incr", metrics.BYTES_ARCHIVED, 400, p0) in stats.calls
    assert ("timing", metrics.RUN_DURATION, timedelta(seconds=30), {"topic": "orders"}) in (
        stats.calls
    )


def test_plain_statsd_gets_the_labels_in_the_name(stats, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    assert airflow_stats._stats_take_tags() is False
    airflow_stats.emit(metrics.run_samples(record(3, topic="shop.orders", read=4)))
    assert ("gauge", "cairn.offset_lag.shop__orders.0", 5.0, None) in stats.calls
    assert ("incr", "cairn.records_archived.shop__orders.0", 4, None) in stats.calls


def test_report_run_sends_the_saved_record(stats, storage, monkeypatch) -> None:
    monkeypatch.setattr(airflow_stats, "storage", lambda cfg: storage)
    monkeypatch.setattr(airflow_stats, "_stats_take_tags", lambda: True)
    cfg = TopicConfig(topic="orders", format="raw")
    assert airflow_stats.report_run(cfg, 1) is None and stats.calls == []
    run_record.save(storage, record(1))
    assert airflow_stats.report_run(cfg, 1).seq == 1
    assert any(call[1] == metrics.LAST_COMMIT for call in stats.calls)


def test_the_notifier_is_the_configured_callable(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(notifier.NOTIFIER_ENV, raising=False)
    assert notifier.notifier() == []
    monkeypatch.setenv(notifier.NOTIFIER_ENV, "cairn_stack.notify.record")
    monkeypatch.setenv("CAIRN_ALERTS_FILE", str(tmp_path / "alerts.jsonl"))
    (callback,) = notifier.notifier()
    context = {"dag_run": {"dag_id": "archive__orders", "dag_run_id": "manual__1"}}
    notifier.run_overdue(context, topic="orders", limit="1:00:00")
    (alert,) = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert (alert["dag_id"], alert["run_id"], alert["task_id"]) == (
        "archive__orders",
        "manual__1",
        None,
    )
    assert alert["reason"] == (
        "topic 'orders': archive run manual__1 is not finished 1:00:00 after it was queued "
        "(max_run_duration in topics.yaml)"
    )
    assert callback.__name__ == "record"


class EndedTI:
    """The task instance in a failure callback's context: one the triggerer ended as failed
    (its cause in an XCom) or one whose cause is unknown."""

    task_id, map_index = "check_health", -1

    def __init__(self, cause: str | None) -> None:
        self.cause, self.pulls = cause, []

    def xcom_pull(self, task_ids, key, map_indexes):
        self.pulls.append((task_ids, key, map_indexes))
        if isinstance(self.cause, Exception):
            raise self.cause
        return self.cause


TOLD: list = []


def tell(context) -> None:
    """A configured notifier (`CAIRN_NOTIFIER`): remembers each context it is called with."""
    TOLD.append(context)


def test_the_notifier_is_told_the_cause_of_a_failure_the_triggerer_ended(monkeypatch):
    TOLD.clear()
    monkeypatch.setenv(notifier.NOTIFIER_ENV, f"{__name__}.tell")
    (alert,) = notifier.notifier()
    assert alert.__name__ == "tell"

    # run by the DAG processor: no exception in the context, the cause in the task's XCom
    ended = EndedTI("topic 'orders': time lag (seconds) is 90, over its limit 60")
    alert({"ti": ended})
    assert ended.pulls == [("check_health", failures.CAUSE_KEY, -1)]
    assert TOLD[-1]["reason"] == ended.cause
    assert isinstance(TOLD[-1]["exception"], AirflowFailException)
    assert str(TOLD[-1]["exception"]) == ended.cause

    # on a worker the exception is there, and a deadline or config alert gives its reason:
    # passed on as they are, nothing pulled
    on_worker = EndedTI("unused")
    alert({"ti": on_worker, "exception": ValueError("boom")})
    assert str(TOLD[-1]["exception"]) == "boom" and "reason" not in TOLD[-1]
    alert({"ti": on_worker, "reason": "overdue"})
    assert TOLD[-1]["reason"] == "overdue" and on_worker.pulls == []
    # nothing kept, or the XCom unreadable: the notifier still hears of the failure
    for unknown in (EndedTI(None), EndedTI(ConnectionError("supervisor gone"))):
        alert({"ti": unknown})
        assert unknown.pulls and "exception" not in TOLD[-1]
    assert len(TOLD) == 5


def test_a_breach_fails_the_check_naming_topic_value_and_limit(storage, monkeypatch) -> None:
    monkeypatch.setattr(notifier, "storage", lambda cfg: storage)
    cfg = TopicConfig(topic="orders", format="raw", max_time_lag="1m")
    run_record.save(storage, record(1, time_lag=0.0))
    assert "within max_time_lag" in notifier.check_health(cfg)[0]
    run_record.save(storage, record(2, time_lag=90.0))
    with pytest.raises(AirflowFailException, match=r"'orders': time lag .* 90, over its limit 60"):
        notifier.check_health(cfg)


def test_archive_dags_wire_the_notifier_the_deadline_and_the_check(monkeypatch) -> None:
    monkeypatch.setenv(notifier.NOTIFIER_ENV, "cairn_stack.notify.record")
    from dags.cairn_archive import archive_dag

    dag = archive_dag(TopicConfig(topic="orders", format="raw", max_run_duration="2h"))
    check = dag.get_task("check_health")
    assert check.upstream_task_ids == {"commit"} and check.retries == 0
    assert [f.__name__ for f in check.on_failure_callback] == ["record"]
    (deadline,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert deadline.interval == timedelta(hours=2)
    assert deadline.callback.path == "cairn_airflow.notifications.notifier.run_overdue"


def test_config_mistakes_fail_the_check_and_alert_once_until_they_change(
    monkeypatch, tmp_path
) -> None:
    variables: dict[str, str] = {}
    monkeypatch.setattr(
        notifier.Variable, "get", lambda key, default=None: variables.get(key, default)
    )
    monkeypatch.setattr(notifier.Variable, "set", variables.__setitem__)
    monkeypatch.setenv(notifier.NOTIFIER_ENV, "cairn_stack.notify.record")
    alerts = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("CAIRN_ALERTS_FILE", str(alerts))
    folder = tmp_path / "topics.d"
    folder.mkdir()
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", folder)
    (folder / "a.yaml").write_text("topics:\n  - {topic: a, format: raw}\n")
    broken = folder / "b.yaml"

    def reasons() -> list[str]:
        lines = alerts.read_text().splitlines() if alerts.exists() else []
        return [json.loads(line)["reason"] for line in lines]

    assert notifier.check_config({}) == ["the topics files have no mistakes"]
    broken.write_text("topics:\n  - {topic: b, format: raw, codec: lz4}\n")
    for _ in range(2):  # a mistake left in place is one alert, however often it is checked
        with pytest.raises(AirflowFailException, match=rf"{broken}, line 2: topic 'b': codec"):
            notifier.check_config({})
    assert reasons() == [
        f"topics files: 1 mistake(s), not archived until fixed: {broken}, line 2: topic 'b': "
        "codec: Input should be 'deflate', 'snappy', 'zstandard' or 'null'"
    ]
    broken.write_text("topics:\n  - {topic: b, format: raw}\n")
    assert notifier.check_config({}) == ["the topics files have no mistakes"]
    broken.write_text("topics: [")
    with pytest.raises(AirflowFailException, match="not valid YAML"):
        notifier.check_config({})
    assert len(reasons()) == 2 and "not valid YAML" in reasons()[1]
