"""The triggerer's side of `run_on: records` without a triggerer: the trigger rebuilt from what
it serializes, its filter over a shared stream of snapshots firing by the rule, surviving a
consumer group that does not answer, and leaving the shared poll's watch list when it ends."""

from __future__ import annotations

import asyncio
import threading

from confluent_kafka import KafkaException

from cairn.kafka.connection import KafkaConf
from cairn_airflow.triggers import waiting_records
from cairn_airflow.triggers.waiting_records import Snapshot, WaitingRecordsTrigger


def test_the_trigger_is_rebuilt_from_what_it_serializes_and_shares_one_poll():
    trigger = WaitingRecordsTrigger(
        topic="orders", group="cairn.orders", min_records=5, max_delay=15
    )
    path, kwargs = trigger.serialize()
    assert path == "cairn_airflow.triggers.waiting_records.WaitingRecordsTrigger"
    again = WaitingRecordsTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)
    other = WaitingRecordsTrigger(topic="b", group="cairn.b", min_records=1, max_delay=60)
    assert trigger.shared_stream_key() == other.shared_stream_key()


def test_the_filter_fires_by_the_rule_and_a_silent_group_skips_a_poll(monkeypatch):
    reads = iter([{0: 0}, KafkaException("coordinator away"), {0: 0}])

    def group_offsets(kafka, group, topic, partitions, timeout):
        found = next(reads)
        if isinstance(found, Exception):
            raise found
        return found

    async def kafka() -> KafkaConf:
        return KafkaConf({"bootstrap.servers": "nowhere:9092"}, "test")

    monkeypatch.setattr(waiting_records.cluster, "group_offsets", group_offsets)
    monkeypatch.setattr(waiting_records, "_kafka", kafka)
    trigger = WaitingRecordsTrigger(
        topic="orders", group="cairn.orders", min_records=100, max_delay=15
    )
    watched = waiting_records._WATCHED.setdefault(
        trigger.shared_stream_key(), waiting_records.Counter()
    )

    async def stream():
        yield Snapshot(0.0, {"orders": {0: 5}})  # position read: 5 records wait from now
        assert watched["orders"] == 1  # the shared poll asks for this topic's offsets
        yield Snapshot(5.0, {"other": {0: 9}})  # the topic did not answer this poll
        yield Snapshot(15.0, {"orders": {0: 5}})  # due, but the group does not answer
        yield Snapshot(20.0, {"orders": {0: 5}})  # due, position read again: fire
        yield Snapshot(25.0, {"orders": {0: 5}})  # its run's commit not looked for
        yield Snapshot(35.0, {"orders": {0: 5}})  # nor later: nothing beyond what it covers

    async def collect():
        return [e.payload async for e in trigger.filter_shared_stream(stream())]

    (fired,) = asyncio.run(collect())
    assert next(reads, None) is None  # every read the rule asked for was made
    assert fired["topic"] == "orders" and fired["waiting"] == {"0": 5}
    assert watched["orders"] == 0


def test_a_commit_in_the_triggerers_own_process_is_looked_for_at_the_next_poll(monkeypatch):
    """A step's commit in this process moved the group (`cluster.moved_since`): the watch reads
    it at the next poll, not a max_delay (or longer, backing off) after its firing."""
    reads, threads = iter([{0: 0}, {0: 5}]), set()

    def group_offsets(kafka, group, topic, partitions, timeout):
        threads.add(threading.current_thread().name.rsplit("_", 1)[0])
        return next(reads)

    async def kafka() -> KafkaConf:
        return KafkaConf({"bootstrap.servers": "nowhere:9092"}, "test")

    monkeypatch.setattr(waiting_records.cluster, "group_offsets", group_offsets)
    monkeypatch.setattr(waiting_records.cluster, "_group_moves", {})
    monkeypatch.setattr(waiting_records, "_kafka", kafka)
    trigger = WaitingRecordsTrigger(
        topic="orders", group="cairn.orders", min_records=5, max_delay=15
    )

    async def stream():
        yield Snapshot(0.0, {"orders": {0: 5}})  # position read, 5 records: fire at once
        yield Snapshot(5.0, {"orders": {0: 5}})  # its run pending; not looked for yet
        waiting_records.cluster._group_moves[("cairn.orders", "orders")] = 7.0  # committed here
        yield Snapshot(10.0, {"orders": {0: 5}})  # read at once: up to 5, nothing pending

    async def collect():
        return [e.payload async for e in trigger.filter_shared_stream(stream())]

    (fired,) = asyncio.run(collect())
    assert fired["waiting"] == {"0": 5}
    assert next(reads, None) is None  # the commit was read at 10 s, before max_delay
    # in their own threads: a burst's group reads leave the loop's default executor to the poll
    assert threads == {"cairn-group-read"}
