"""Completeness: the rule on a fake Kafka log, then marking dates of a real local archive."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cairn.datafiles.writer import KafkaRecord
from cairn.pipeline import completeness
from cairn.pipeline.completeness import LogView, complete_through, cutoff, passed
from cairn.protocol import commit, rewind
from cairn.storage.layout import parse_data_key, success_key
from cairn.storage.objects import Storage
from tests.unit.conftest import archive_records
from tests.unit.test_rebuild import TOPIC, config, rebuild

UTC_ = ZoneInfo("UTC")
HOUR = timedelta(hours=1)
D1, D2, D3 = date(2024, 6, 1), date(2024, 6, 2), date(2024, 6, 3)


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC)


def ms(iso: str) -> int:
    return int(at(iso).timestamp() * 1000)


class FakeLog:
    """Kafka timestamps (ISO, UTC) of each partition's records, offset by offset."""

    def __init__(self, **partitions: list[str]) -> None:
        self.times = {int(p[1:]): [ms(t) for t in ts] for p, ts in partitions.items()}

    def view(self, checked_at: str) -> LogView:
        def first_after(parts: list[int], millis: int) -> dict[int, int | None]:
            return {
                p: next((o for o, t in enumerate(self.times[p]) if t > millis), None) for p in parts
            }

        high = {p: len(ts) for p, ts in self.times.items()}
        return LogView(at(checked_at), high, first_after)


def test_cutoff_is_the_end_of_the_day_in_the_topics_timezone_plus_lateness():
    assert cutoff(D1, UTC_, HOUR) == at("2024-06-02T01:00")
    assert cutoff(D1, ZoneInfo("America/New_York"), timedelta(0)) == at("2024-06-02T04:00")
    # Berlin's 2024-03-30 ends at 23:00 UTC; the next day (DST starts) has 23 hours
    berlin = ZoneInfo("Europe/Berlin")
    assert cutoff(date(2024, 3, 30), berlin, timedelta(0)) == at("2024-03-30T23:00")
    assert cutoff(date(2024, 3, 31), berlin, timedelta(0)) == at("2024-03-31T22:00")


def test_a_date_completes_exactly_when_the_last_partition_passes_its_cutoff():
    log = FakeLog(
        p0=["2024-06-01T10:00", "2024-06-02T01:30"],  # offset 1 is after D1's cutoff
        p1=["2024-06-01T12:00", "2024-06-02T00:40", "2024-06-02T02:00"],
    )
    view = log.view("2024-06-02T03:00")
    assert complete_through({0: 1, 1: 1}, view, UTC_, HOUR, D1 - timedelta(days=5)) == date(
        2024, 5, 31
    )
    # p1's offset 1 (00:40) is within the allowance: not archived, so D1 is not complete
    assert not passed({0: 2, 1: 1}, view, cutoff(D1, UTC_, HOUR))
    # archived up to the first record after the cutoff: complete, with neither caught up
    assert complete_through({0: 1, 1: 2}, view, UTC_, HOUR, D1 - timedelta(days=5)) == D1


def test_an_idle_partition_does_not_hold_a_date_back_once_the_cutoff_has_passed():
    log = FakeLog(p0=["2024-06-01T10:00", "2024-06-02T05:00"], p1=["2024-06-01T08:00"])
    position = {0: 1, 1: 1}  # p1 caught up and idle ever since
    assert complete_through(position, log.view("2024-06-02T00:59"), UTC_, HOUR, D1) is None
    assert (
        complete_through(position, log.view("2024-06-02T00:59"), UTC_, HOUR, D1 - HOUR * 24) is None
    )
    day_before = D1 - timedelta(days=1)
    assert complete_through(position, log.view("2024-06-02T01:01"), UTC_, HOUR, day_before) == D1
    # caught up everywhere, days later: every date up to the cutoff's is complete
    assert complete_through({0: 2, 1: 1}, log.view("2024-06-05T00:30"), UTC_, HOUR, D1) == D3


def test_lateness_moves_the_cutoff():
    log = FakeLog(p0=["2024-06-01T23:00", "2024-06-02T00:30", "2024-06-02T03:00"])
    view = log.view("2024-06-02T04:00")
    day_before = D1 - timedelta(days=1)
    assert complete_through({0: 1}, view, UTC_, timedelta(0), day_before) == D1
    assert complete_through({0: 1}, view, UTC_, HOUR, day_before) is None  # 00:30 may still come
    assert complete_through({0: 2}, view, UTC_, HOUR, day_before) == D1
    assert complete_through({0: 2}, view, UTC_, 3 * HOUR, day_before) is None


def test_timezone_day_edges():
    new_york = ZoneInfo("America/New_York")  # D1 ends at 2024-06-02T04:00Z
    log = FakeLog(p0=["2024-06-02T02:00", "2024-06-02T04:30"])
    view = log.view("2024-06-02T05:00")
    day_before = D1 - timedelta(days=2)
    assert complete_through({0: 0}, view, new_york, timedelta(0), day_before) == D1 - timedelta(
        days=1
    )
    assert complete_through({0: 1}, view, new_york, timedelta(0), day_before) == D1
    assert complete_through({0: 1}, view, UTC_, timedelta(0), day_before) == D1  # UTC: earlier


def test_no_date_completes_before_its_cutoff_whatever_producers_clocks_say():
    log = FakeLog(p0=["2024-06-01T10:00", "2024-06-09T00:00"])  # a create time in the future
    before = D1 - timedelta(days=1)
    assert complete_through({0: 2}, log.view("2024-06-02T00:30"), UTC_, HOUR, before) is None
    assert complete_through({0: 2}, log.view("2024-06-02T01:30"), UTC_, HOUR, before) == D1


def test_a_partition_the_archive_has_not_reached_holds_every_date_back():
    log = FakeLog(p0=["2024-06-01T10:00"], p1=[])
    assert complete_through({0: 1}, log.view("2024-06-05T00:00"), UTC_, HOUR, D1) is None
    assert complete_through({0: 1, 1: 0}, log.view("2024-06-05T00:00"), UTC_, HOUR, D1) == D3


def test_years_of_waiting_dates_are_bisected_with_few_kafka_requests():
    log = FakeLog(p0=["2020-01-01T00:00", "2024-06-01T12:00", "2024-06-03T00:00"])
    view = log.view("2024-06-10T00:00")
    asked = []

    def counting(parts: list[int], millis: int) -> dict[int, int | None]:
        asked.append(millis)
        return view.first_after(parts, millis)

    counted = LogView(view.checked_at, view.high, counting)
    assert complete_through({0: 2}, counted, UTC_, HOUR, date(2019, 12, 31)) == D1
    assert len(asked) < 15


# --- marking dates of a real archive -------------------------------------------------------


def event(partition: int, offset: int, kafka_time: str, event_time: str | None) -> KafkaRecord:
    value = b"{bad" if event_time is None else json.dumps({"id": "x", "ts": event_time}).encode()
    return KafkaRecord(TOPIC, partition, offset, ms(kafka_time), 1, b"k", value)


class Topic:
    """An archive of TOPIC plus the Kafka log it was read from; `check` runs the complete step
    with Kafka seen at a given time."""

    def __init__(self, storage: Storage, cfg) -> None:
        self.storage, self.cfg = storage, cfg
        self.log: dict[int, list[KafkaRecord]] = {0: [], 1: []}

    def produce(self, *records: KafkaRecord) -> None:
        for r in records:
            assert r.offset == len(self.log[r.partition])
            self.log[r.partition].append(r)

    def archive(self, processing_time: str) -> None:
        newest = commit.newest(self.storage, TOPIC)
        position = newest.next_offsets if newest else {}
        todo = [r for p, rs in self.log.items() for r in rs[position.get(p, 0) :]]
        archive_records(self.storage, self.cfg, at(processing_time), todo)

    def check(self, monkeypatch, now: str, run_id: str = "run") -> completeness.Completion:
        fake = FakeLog()
        fake.times = {p: [r.timestamp for r in rs] for p, rs in self.log.items()}
        monkeypatch.setattr(completeness, "_log_view", lambda kafka, topic: fake.view(now))
        return completeness.complete_run(self.cfg, self.storage, None, run_id)

    def marker(self, day: date) -> completeness.Marker | None:
        return completeness.read_marker(self.storage, TOPIC, f"dt={day}")


@pytest.fixture
def topic(storage, tmp_path) -> Topic:
    made = Topic(storage, config(tmp_path, lateness="1h"))
    made.produce(
        event(0, 0, "2024-06-01T10:00", "2024-06-01T10:00"),
        event(0, 1, "2024-06-01T22:00", "2024-06-01T22:00"),
        event(1, 0, "2024-06-01T12:00", "2024-06-01T12:00"),
        event(1, 1, "2024-06-01T23:00", None),  # quarantined on its processing date
    )
    made.archive("2024-06-01T23:30")
    return made


def test_dates_are_marked_when_the_last_partition_passes(topic, monkeypatch):
    assert topic.check(monkeypatch, "2024-06-01T23:40").partition_keys == []
    topic.produce(
        event(0, 2, "2024-06-02T00:30", "2024-06-01T23:50"),  # within the allowance
        event(1, 2, "2024-06-02T00:50", "2024-06-01T23:55"),
    )
    topic.archive("2024-06-02T00:55")
    topic.produce(
        event(0, 3, "2024-06-02T01:30", "2024-06-02T01:20"),  # p0 is past D1's cutoff
        event(1, 3, "2024-06-02T00:58", "2024-06-01T23:58"),  # p1 is not
    )
    assert topic.check(monkeypatch, "2024-06-02T01:40").partition_keys == []
    assert topic.marker(D1) is None

    topic.archive("2024-06-02T01:45")  # p1's last record of D1 arrives
    done = topic.check(monkeypatch, "2024-06-02T01:50")
    assert done.completed == [D1] and done.through == D1 and done.partition_keys == ["2024-06-01"]
    marker = topic.marker(D1)
    assert marker.records == 6 and marker.quarantined == 1 and marker.files == 7
    assert marker.folders == {
        "dt=2024-06-01/hr=10": 1,
        "dt=2024-06-01/hr=12": 1,
        "dt=2024-06-01/hr=22": 1,
        "dt=2024-06-01/hr=23": 3,
    }
    assert marker.change == "complete" and marker.amendments == 0 and marker.token_seq == 3
    assert marker.cutoff == at("2024-06-02T01:00")
    # nothing that lists data files takes the marker for one
    assert parse_data_key(success_key(TOPIC, "dt=2024-06-01")) is None


def test_a_retried_step_announces_again_and_idle_days_complete(topic, monkeypatch):
    topic.produce(event(0, 2, "2024-06-02T03:00", "2024-06-02T03:00"))
    topic.archive("2024-06-02T03:05")
    assert topic.check(monkeypatch, "2024-06-02T03:10", "r1").partition_keys == ["2024-06-01"]
    assert topic.check(monkeypatch, "2024-06-02T03:11", "r1").partition_keys == ["2024-06-01"]
    assert topic.check(monkeypatch, "2024-06-02T03:12", "r2").partition_keys == []
    # days later, nothing new: the idle days complete too, the empty one with zero counts
    done = topic.check(monkeypatch, "2024-06-04T02:00", "r3")
    assert done.completed == [D2, D3]
    assert topic.marker(D2).records == 1 and topic.marker(D3).records == 0


def test_late_records_amend_a_complete_date_and_a_rebuild_rewrites_it(topic, monkeypatch):
    topic.produce(event(0, 2, "2024-06-02T03:00", "2024-06-02T03:00"))
    topic.archive("2024-06-02T03:05")
    topic.check(monkeypatch, "2024-06-02T03:10")
    first = topic.marker(D1)
    topic.produce(event(0, 3, "2024-06-02T05:00", "2024-06-01T20:00"))  # hours too late
    topic.archive("2024-06-02T05:05")
    opened = []
    read = topic.storage.open_read
    monkeypatch.setattr(topic.storage, "open_read", lambda key: opened.append(key) or read(key))
    done = topic.check(monkeypatch, "2024-06-02T05:10", "late")
    assert done.amended == [D1] and done.completed == [] and done.partition_keys == ["2024-06-01"]
    amended = topic.marker(D1)
    assert amended.records == first.records + 1 and amended.amendments == 1
    # recounted from the files, but only the late run's file was read: the others' counts are
    # remembered by version
    assert [parse_data_key(k).folder for k in opened] == ["dt=2024-06-01/hr=20"]
    assert amended.files == first.files + 1
    assert amended.change == "amended" and amended.completed_at == first.completed_at

    manifest = rebuild(topic.storage, topic.cfg, D1)
    assert topic.storage.exists(success_key(TOPIC, "dt=2024-06-01"))  # not removed as data
    redone = completeness.rebuilt(topic.cfg, topic.storage, manifest.token)
    assert redone.amended == [D1]
    assert topic.marker(D1).change == "rebuilt" and topic.marker(D1).records == amended.records


def test_a_rewind_amends_the_dates_the_re_read_runs_write(topic, monkeypatch):
    topic.produce(event(0, 2, "2024-06-02T03:00", "2024-06-02T03:00"))
    topic.archive("2024-06-02T03:05")
    topic.check(monkeypatch, "2024-06-02T03:10")
    rewind.rewind(topic.storage, topic.cfg, None, count=2)
    topic.archive("2024-06-02T04:00")  # re-reads everything into the same file names
    done = topic.check(monkeypatch, "2024-06-02T04:10", "after-rewind")
    assert done.amended == [D1]


def test_path_formats_without_a_date_folder_are_refused_unless_completeness_is_off(tmp_path):
    from cairn.topics_file import load_topics

    entry = {
        "topic": TOPIC,
        "format": "json",
        "schema": "order.avsc",
        "event_time": {"field": "ts", "encoding": "iso8601"},
        "path_format": "hr=%H/dt=%Y-%m-%d",
    }
    config(tmp_path)  # writes the schema
    for lateness, refused in ((None, False), ("2h", True)):
        doc = {"topics": [entry | {"lateness": lateness}]}
        (tmp_path / "t.yaml").write_text(json.dumps(doc))
        errors = load_topics(tmp_path / "t.yaml").errors
        assert bool(errors) is refused, errors
        if refused:
            assert errors[0].field == "path_format" and "lateness: null" in errors[0].message


def test_topics_without_completeness_mark_nothing(tmp_path, storage, monkeypatch):
    off = Topic(storage, config(tmp_path, lateness=None))
    off.produce(event(0, 0, "2024-06-01T10:00", "2024-06-01T10:00"))
    off.archive("2024-06-01T10:05")
    assert off.check(monkeypatch, "2024-06-05T00:00").partition_keys == []
    assert off.marker(D1) is None and not storage.exists("_complete/orders.json")
