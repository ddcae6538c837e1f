"""Freshness (`cairn.pipeline.freshness`): each run's span of waits from the Kafka timestamps of
its first and last records, an hour of spans carried in the run records, its p50/p95 on the
metrics, and the alert past `max_freshness`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord
from cairn.pipeline import archive_run, freshness, run_record
from cairn.pipeline.freshness import Span
from cairn.pipeline.run_record import RunRecord, TopicStatus
from cairn.protocol import manifest
from cairn.protocol.tokens import Counts
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from cairn.views import alerts, metrics
from tests.unit.conftest import archive_records

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def test_a_runs_span_runs_from_its_newest_to_its_oldest_record():
    committed, planned = T0, T0 - timedelta(seconds=4)
    span = freshness.run_span(
        committed,
        planned,
        read={0: 10, 1: 5, 2: 0},
        first={0: ms(T0 - timedelta(seconds=30)), 1: ms(T0 - timedelta(seconds=12))},
        last={0: ms(T0 - timedelta(seconds=6))},  # partition 1 ends in transaction markers
    )
    assert span == Span(committed_at=committed, records=15, low=4.0, high=30.0)
    assert freshness.run_span(committed, planned, {0: 3}, {}, {}) is None  # Kafka said nothing


def test_a_runs_span_comes_from_what_its_spark_job_read_without_asking_kafka(tmp_path):
    """The writers note the first and last record's Kafka timestamp per partition; the manifest
    and verify's report carry them to the commit, which then needs no Kafka consumer for them."""
    topics = tmp_path / "topics.yaml"
    topics.write_text(
        f"topics:\n  - topic: orders\n    format: raw\n    archive_root: file://{tmp_path}/a\n"
    )
    cfg = load_topics(topics).topics[0]
    storage = Storage(cfg.root.storage_url)
    seconds_ago = {0: [30, 50, 10], 1: [12, 6]}  # Kafka timestamps need not grow with offsets
    records = [
        KafkaRecord("orders", p, o, ms(T0 - timedelta(seconds=s)), 0, None, b"v")
        for p, ages in seconds_ago.items()
        for o, s in enumerate(ages)
    ]
    token = archive_records(storage, cfg, T0, records)
    timestamps = manifest.load(storage, token.manifest).timestamps
    assert timestamps == {
        0: (ms(T0 - timedelta(seconds=30)), ms(T0 - timedelta(seconds=10))),
        1: (ms(T0 - timedelta(seconds=12)), ms(T0 - timedelta(seconds=6))),
    }

    report = manifest.VerifyReport(
        counts=Counts(read=5),
        partitions={0: Counts(read=3), 1: Counts(read=2)},
        timestamps=timestamps,
    )
    planned = SimpleNamespace(
        topic="orders",
        replaces=None,
        plan=SimpleNamespace(to_read={0: (0, 3), 1: (0, 2)}),
        planned_at=T0 - timedelta(seconds=4),
    )
    committed = SimpleNamespace(created_at=T0)
    # No Kafka at all (None): the span is the Spark job's.
    assert archive_run._freshness(planned, committed, report, None) == Span(
        committed_at=T0, records=5, low=6.0, high=30.0
    )
    # A manifest written before they were noted: Kafka is asked (here it cannot answer).
    older = report.model_copy(update={"timestamps": {}})
    assert archive_run._freshness(planned, committed, older, None) is None


def test_quantiles_weigh_each_span_by_its_records_spread_evenly():
    spans = [
        Span(committed_at=T0, records=90, low=0.0, high=10.0),
        Span(committed_at=T0, records=10, low=100.0, high=100.0),
    ]
    assert freshness.quantile(spans, 0.5) == pytest.approx(50 / 9, abs=1e-6)
    assert freshness.quantile(spans, 0.95) == pytest.approx(100.0, abs=1e-6)
    assert freshness.quantile([], 0.5) is None


def test_only_the_last_hours_spans_count_and_an_idle_hour_has_no_freshness():
    old = Span(committed_at=T0 - timedelta(minutes=61), records=100, low=500.0, high=900.0)
    new = Span(committed_at=T0 - timedelta(minutes=5), records=1, low=2.0, high=2.0)
    assert freshness.hour_quantiles([old, new], T0) == pytest.approx((2.0, 2.0))
    assert freshness.hour_quantiles([old, new], T0 + timedelta(hours=2)) is None


def record(seq: int, at: datetime, span: Span | None) -> RunRecord:
    return RunRecord(
        topic="orders",
        seq=seq,
        run_id=f"r{seq}",
        planned_at=at - timedelta(seconds=5),
        committed_at=at,
        duration_seconds=5.0,
        counts=Counts(read=1, backup=1),
        offset_lag={0: 0},
        time_lag_seconds=0.0,
        lag_error=None,
        next_offsets={0: seq},
        freshness=[span] if span else [],
    )


def test_each_run_record_carries_the_hour_of_spans_before_it():
    storage = Storage("memory://fresh")
    spans = [
        Span(committed_at=T0 + timedelta(minutes=20 * i), records=1, low=i, high=i)
        for i in range(5)
    ]
    for i, span in enumerate(spans):
        assert run_record.save(storage, record(i + 1, span.committed_at, span))
    newest = run_record.load(storage, "orders", 5)
    assert newest is not None
    assert newest.freshness == spans[1:]  # 80 minutes: the first fell out of the hour
    assert run_record.save(storage, record(6, T0 + timedelta(minutes=81), None))
    assert run_record.load(storage, "orders", 6).freshness == spans[2:]


def test_metrics_and_alerts_read_freshness_from_the_newest_record():
    cfg = TopicConfig(topic="orders", format="raw", max_delay="10m")
    slow = record(1, T0, Span(committed_at=T0, records=100, low=200.0, high=4000.0))
    status = TopicStatus(topic="orders", last=slow, quarantine_ratio=None, recent=[slow])

    served = {s.name: s.value for s in metrics.samples(status, now=T0)}
    assert served[metrics.FRESHNESS_P50] == pytest.approx(2100.0)
    assert served[metrics.FRESHNESS_P95] == pytest.approx(3810.0)
    assert metrics.FRESHNESS_P95 not in {
        s.name for s in metrics.samples(status, now=T0 + timedelta(hours=2))
    }

    assert cfg.freshness_limit == timedelta(minutes=30)  # 3 x max_delay, at least 15 minutes
    assert TopicConfig(topic="o", format="raw", max_delay="15s").freshness_limit == timedelta(
        minutes=15
    )
    (breach,) = alerts.breaches(cfg, status, now=T0)
    assert breach.setting == "max_freshness" and breach.value == pytest.approx(3810.0)
    assert (
        alerts.breaches(
            cfg.model_copy(update={"max_freshness": timedelta(minutes=70)}), status, now=T0
        )
        == []
    )
    assert alerts.breaches(cfg, status, now=T0 + timedelta(hours=2)) == []  # idle: no evidence
    scheduled = TopicConfig(topic="orders", format="raw", schedule="@hourly")
    assert scheduled.freshness_limit is None and alerts.breaches(scheduled, status, now=T0) == []
