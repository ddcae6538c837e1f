"""The overview page's data (cairn.views.overview) from a local archive committed the way the
pipeline commits it, and the Prometheus text format (cairn.views.prometheus)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

from cairn.config import TopicConfig
from cairn.datafiles.writer import KafkaRecord
from cairn.pipeline import completeness, run_record
from cairn.topics_file import load_topics
from cairn.views import overview, prometheus
from cairn.views.metrics import Sample
from tests.unit.conftest import archive_records
from tests.unit.test_run_record import record

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "string"}, {"name": "ts", "type": "string"}],
}


def config(tmp_path) -> TopicConfig:
    entry = {
        "topic": "orders",
        "format": "json",
        "schema": "order.avsc",
        "event_time": {"field": "ts", "encoding": "iso8601"},
        "archive_root": f"file://{tmp_path}/archive",
    }
    (tmp_path / "order.avsc").write_text(json.dumps(SCHEMA))
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": [entry]}))
    return load_topics(tmp_path / "topics.yaml").topics[0]


def rec(partition: int, offset: int, value: bytes) -> KafkaRecord:
    return KafkaRecord("orders", partition, offset, 0, 0, None, value)


def order(i: int, ts: str) -> bytes:
    return json.dumps({"id": f"o{i}", "ts": ts}).encode()


def test_files_per_date_and_quarantine_reasons(storage, tmp_path) -> None:
    cfg = config(tmp_path)
    records = [
        rec(0, 0, order(0, "2024-06-01T10:00:00Z")),
        rec(0, 1, order(1, "2024-06-02T10:00:00Z")),
        rec(0, 2, b"{not json"),
        rec(1, 0, order(2, "2024-06-02T11:00:00Z")),
        rec(1, 1, b"{not json"),
        rec(1, 2, json.dumps({"id": "o3"}).encode()),
    ]
    archive_records(storage, cfg, datetime(2024, 6, 3, 9, tzinfo=UTC), records)

    dates = overview.files_per_date(storage, cfg)
    assert [(d.day, d.partitioned, d.quarantine) for d in dates] == [
        (date(2024, 6, 3), 0, 2),  # quarantine by processing date: one file per partition
        (date(2024, 6, 2), 2, 0),
        (date(2024, 6, 1), 1, 0),
    ]
    reasons, files = overview.quarantine_reasons(storage, "orders")
    assert files == 2
    assert sum(n for _, n in reasons) == 3
    assert reasons[0][1] == 2  # the two unparseable values share their reason
    assert overview.quarantine_reasons(storage, "orders", max_files=1)[1] == 1


def test_overview_reads_position_lag_trend_and_quarantine(storage, tmp_path) -> None:
    cfg = config(tmp_path)
    archive_records(storage, cfg, datetime(2024, 6, 3, 9, tzinfo=UTC), [rec(0, 0, b"x")])
    for seq, lag in ((1, 50), (2, 20), (3, 0)):
        run = record(seq, read=10, quarantined=1, time_lag=float(lag), offset_lag={0: lag, 1: 0})
        run_record.save(storage, run)

    completeness.save_state(storage, completeness.State(topic="orders", through=date(2024, 6, 2)))

    view = overview.topic_overview(storage, cfg)

    assert view.last_complete == date(2024, 6, 2)
    assert view.position == {0: 1}  # the newest token, not the run records
    assert view.offset_lag == 0 and view.time_lag_seconds == 0.0
    assert view.offset_lag_trend == [50, 20, 0]  # oldest first
    assert view.time_lag_trend == [50.0, 20.0, 0.0]
    assert view.records_archived == 30 and view.quarantined == 3
    assert view.quarantine_ratio == 0.1
    assert view.last is not None and view.last.seq == 3
    detail = overview.topic_detail(storage, cfg, runs=2)
    assert [r.seq for r in detail.runs] == [3, 2]


def test_overview_of_a_topic_never_run(storage, tmp_path) -> None:
    view = overview.topic_overview(storage, config(tmp_path))
    assert view.position == {} and view.last is None and view.records_archived is None
    assert view.offset_lag_trend == [] and view.quarantine_ratio is None
    assert view.last_complete is None


def test_prometheus_text_groups_families_and_escapes() -> None:
    samples = [
        Sample("cairn.offset_lag", "gauge", 5, {"topic": "a", "partition": "0"}, "Lag.\nMore"),
        Sample("cairn.records_archived", "counter", 7, {"topic": 'we"ird\\t\n'}, "Rec."),
        Sample("cairn.offset_lag", "gauge", 1.5, {"topic": "b", "partition": "1"}, "Lag.\nMore"),
        Sample("cairn.time_lag_seconds", "gauge", float("nan"), {}, "back\\slash"),
    ]
    assert prometheus.exposition(samples).splitlines() == [
        "# HELP cairn_offset_lag Lag.\\nMore",
        "# TYPE cairn_offset_lag gauge",
        'cairn_offset_lag{partition="0",topic="a"} 5.0',
        'cairn_offset_lag{partition="1",topic="b"} 1.5',
        "# HELP cairn_records_archived_total Rec.",
        "# TYPE cairn_records_archived_total counter",
        'cairn_records_archived_total{topic="we\\"ird\\\\t\\n"} 7.0',
        "# HELP cairn_time_lag_seconds back\\\\slash",
        "# TYPE cairn_time_lag_seconds gauge",
        "cairn_time_lag_seconds NaN",
    ]
    assert prometheus.exposition([]) == ""
