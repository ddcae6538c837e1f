"""Run status records, the metrics named from them, and the alerts decided from them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from cairn.config import TopicConfig
from cairn.pipeline import run_record
from cairn.protocol.tokens import Counts
from cairn.views import alerts, metrics

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def record(
    seq: int, topic="orders", read=10, quarantined=0, time_lag=0.0, **fields
) -> run_record.RunRecord:
    values = dict(
        topic=topic,
        seq=seq,
        run_id=f"run{seq}",
        planned_at=T0 + timedelta(minutes=seq),
        committed_at=T0 + timedelta(minutes=seq, seconds=30),
        duration_seconds=30.0,
        counts=Counts(
            read=read,
            backup=read,
            partitioned=read - quarantined,
            quarantined=quarantined,
            bytes=100 * read,
        ),
        offset_lag={0: 5, 1: 0},
        time_lag_seconds=time_lag,
        lag_error=None,
        next_offsets={0: 10 * seq, 1: 10 * seq},
        partition_time_lag_seconds={} if time_lag is None else {0: time_lag, 1: 0.0},
        partition_counts={
            0: Counts(read=read, backup=read, quarantined=quarantined, bytes=100 * read),
        },
    )
    return run_record.RunRecord(**(values | fields))


def test_recent_is_newest_first_and_bounded_by_limit(storage) -> None:
    for seq in range(1, 6):
        assert run_record.save(storage, record(seq))
    assert [r.seq for r in run_record.recent(storage, "orders", limit=3)] == [5, 4, 3]
    assert [r.seq for r in run_record.recent(storage, "orders")] == [5, 4, 3, 2, 1]
    assert run_record.recent(storage, "other") == []
    assert storage.exists("_status/orders/000000000005.json")


def test_each_record_carries_running_totals_per_partition(storage) -> None:
    run_record.save(storage, record(1, read=10, quarantined=1))
    run_record.save(storage, record(2, read=4, quarantined=2))
    newest = run_record.recent(storage, "orders", limit=1)[0]
    assert newest.partition_totals[0].read == 14
    assert newest.partition_totals[0].quarantined == 3
    assert newest.partition_totals[0].bytes == 1400


def test_a_save_that_fails_is_logged_and_never_raises(storage, monkeypatch, caplog) -> None:
    def broken(key, data):
        raise OSError("disk full")

    monkeypatch.setattr(storage, "write", broken)
    assert run_record.save(storage, record(1)) is False
    assert "not saved (the token is committed)" in caplog.text


def test_old_records_are_pruned_so_listing_stays_one_page(storage, monkeypatch) -> None:
    monkeypatch.setattr(run_record, "KEEP", 3)
    for seq in range(1, 7):
        run_record.save(storage, record(seq))
    assert [r.seq for r in run_record.recent(storage, "orders")] == [6, 5, 4]


def test_an_unreadable_record_is_skipped(storage) -> None:
    run_record.save(storage, record(1))
    storage.write(run_record.key("orders", 2), b"{not json")
    assert [r.seq for r in run_record.recent(storage, "orders")] == [1]


def test_topic_status_has_the_last_run_and_the_quarantine_ratio(storage) -> None:
    run_record.save(storage, record(1, read=100, quarantined=1))
    run_record.save(storage, record(2, read=100, quarantined=3))
    topic = run_record.topic_status(storage, "orders")
    assert topic.last is not None and topic.last.seq == 2
    assert topic.quarantine_ratio == pytest.approx(0.02)
    assert run_record.topic_status(storage, "never").quarantine_ratio is None


def test_prometheus_samples_use_totals_and_run_samples_use_the_run(storage) -> None:
    run_record.save(storage, record(1, read=10))
    run_record.save(storage, record(2, read=4, time_lag=7.5))
    topic = run_record.topic_status(storage, "orders")
    served = {(s.name, tuple(s.labels.items())): s for s in metrics.samples(topic)}
    run = {(s.name, tuple(s.labels.items())): s for s in metrics.run_samples(topic.last)}
    p0 = (("topic", "orders"), ("partition", "0"))
    p1 = (("topic", "orders"), ("partition", "1"))
    assert served[(metrics.RECORDS_ARCHIVED, p0)].value == 14
    assert served[(metrics.RECORDS_ARCHIVED, p0)].kind == "counter"
    assert run[(metrics.RECORDS_ARCHIVED, p0)].value == 4
    assert run[(metrics.RECORDS_ARCHIVED, p1)].value == 0
    assert served[(metrics.OFFSET_LAG, p0)].value == 5
    assert served[(metrics.TIME_LAG, p0)].value == 7.5
    assert served[(metrics.TIME_LAG, p1)].value == 0
    topic_only = (("topic", "orders"),)
    assert served[(metrics.RUN_DURATION, topic_only)].value == 30
    last = served[(metrics.LAST_COMMIT, topic_only)].value
    assert last == (T0 + timedelta(minutes=2, seconds=30)).timestamp()
    assert served[(metrics.QUARANTINE_RATIO, topic_only)].value == 0
    assert all(s.help and s.kind in ("gauge", "counter") for s in served.values())
    assert metrics.samples(run_record.topic_status(storage, "never")) == []


def test_an_unknown_time_lag_sends_no_time_lag_sample() -> None:
    unknown = record(1, time_lag=None, lag_error="KafkaException: down", offset_lag={})
    assert not [s for s in metrics.run_samples(unknown) if s.name == metrics.TIME_LAG]


def cfg(**fields) -> TopicConfig:
    return TopicConfig.model_validate({"topic": "orders", "format": "raw", **fields})


def test_alert_limits_default_and_accept_durations() -> None:
    assert cfg().max_time_lag == timedelta(hours=1)
    assert cfg().max_quarantine_ratio == 0.01
    assert cfg().group_id == "cairn.orders" and cfg().commit_consumer_group
    assert cfg(max_time_lag="30m").max_time_lag == timedelta(minutes=30)
    assert cfg(max_time_lag="2h").max_time_lag == timedelta(hours=2)
    assert cfg(max_time_lag=90).max_time_lag == timedelta(seconds=90)
    assert cfg(max_run_duration="1.5h").max_run_duration == timedelta(minutes=90)
    dumped = cfg(max_time_lag="30m").model_dump(mode="json")
    assert TopicConfig.model_validate(dumped).max_time_lag == timedelta(minutes=30)
    with pytest.raises(ValidationError, match="not a duration"):
        cfg(max_time_lag="soon")
    with pytest.raises(ValidationError):
        cfg(max_quarantine_ratio=2)


def test_a_caught_up_topic_breaches_nothing_however_old_its_records() -> None:
    quiet = run_record.TopicStatus(
        topic="orders", last=record(1, time_lag=0.0), quarantine_ratio=0.0
    )
    assert alerts.breaches(cfg(max_time_lag="1s"), quiet) == []
    never = run_record.TopicStatus(topic="orders", last=None, quarantine_ratio=None)
    assert alerts.breaches(cfg(max_time_lag="1s"), never) == []


def test_time_lag_and_quarantine_ratio_over_their_limits_are_breaches() -> None:
    runs = [record(2, time_lag=7200.0, read=100, quarantined=5)]
    behind = run_record.TopicStatus(
        topic="orders", last=runs[0], quarantine_ratio=0.05, recent=runs
    )
    found = alerts.breaches(cfg(), behind)
    assert [b.setting for b in found] == ["max_time_lag", "max_quarantine_ratio"]
    assert str(found[0]) == (
        "topic 'orders': time lag (seconds) is 7200, over its limit 3600 (max_time_lag in "
        "topics.yaml)"
    )
    unknown = run_record.TopicStatus(
        topic="orders", last=record(2, time_lag=None), quarantine_ratio=None
    )
    assert alerts.breaches(cfg(), unknown) == []


def test_a_record_saved_before_counts_were_one_field_still_loads(storage) -> None:
    """Records written by earlier versions held the counts as four fields of their own."""
    old = record(1).model_dump(mode="json", exclude={"counts", "ranges", "more_waiting", "gaps"})
    old |= {"records_read": 9, "records_partitioned": 7, "records_quarantined": 2}
    old["bytes_written"] = 900
    storage.write(run_record.key("orders", 1), json.dumps(old).encode())
    (loaded,) = run_record.recent(storage, "orders")
    assert loaded.counts == Counts(read=9, backup=9, partitioned=7, quarantined=2, bytes=900)
    assert run_record.quarantine_ratio([loaded]) == 2 / 9
