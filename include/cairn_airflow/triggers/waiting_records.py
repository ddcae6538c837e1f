"""`WaitingRecordsTrigger`: fires a topic's archive DAG when records wait (`cairn.waiting`).

It runs in Airflow's triggerer behind an `AssetWatcher` (`cairn_airflow.assets.waiting_asset`).
It is no consumer-group member and commits nothing (Airflow's Kafka message-queue trigger does
both): every watched topic of a triggerer process shares one poll, one admin client asking
Kafka for the last stable offsets of all of them at once (`OffsetsReader`), and each topic's
trigger reads its consumer group, which each archive commit moves, only when its `Watch` asks
(at once after a commit in this process: `cluster.moved_since`).
A restarted triggerer starts the triggers again from the database; records still wait, so no
firing is lost, only its `max_delay` clock starts again.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import AsyncIterator, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from confluent_kafka import KafkaException

from cairn.kafka import cluster
from cairn.kafka.connection import KafkaAccessDenied, KafkaConf
from cairn.waiting import Offsets, WaitRule, Watch
from cairn_airflow.hooks.connections import KAFKA_CONN_ID, kafka_conf
from cairn_airflow.triggers.loop_logger import LoopLogger

log = LoopLogger(__name__)

POLL_SECONDS = 5.0
"""How often the shared poll asks Kafka for the watched topics' offsets."""

STREAM_KEY = ("cairn.waiting_records", KAFKA_CONN_ID)
"""The one shared poll every watched topic of a triggerer process joins."""
_WATCHED: dict[Hashable, Counter[str]] = {}
"""Per shared poll, the topics its triggers watch (a topic may have more than one trigger)."""
_KAFKA: list[KafkaConf] = []
"""The Kafka connection, read once per triggerer process (not once per topic's trigger): a
changed connection takes a triggerer restart, as the shared poll's client does."""
_GROUP_READS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cairn-group-read")
"""Where the watchers read their consumer groups (a consumer each, up to 10 s with a slow
coordinator): a burst's hundreds queue here, not in the event loop's default executor, which the
shared poll and Airflow's own calls need (in a 1,000-topic burst all six of its threads were in
group reads)."""


async def _kafka() -> KafkaConf:
    if not _KAFKA:
        # in a thread, through the process's cache of connections: the triggers of 1,000 topics
        # start at once and wait for the first one's read, not each reading (and masking) it
        # in a request of its own to the triggerer's supervisor
        found = await asyncio.to_thread(kafka_conf)
        if not _KAFKA:
            _KAFKA.append(found)
    return _KAFKA[0]


class Snapshot(NamedTuple):
    """One poll's answer: per watched topic, per partition, the last stable offset."""

    at: float
    stable: dict[str, Offsets]


class WaitingRecordsTrigger(BaseEventTrigger):
    """Fires once records wait in `topic` beyond its archive's position, by `WaitRule`."""

    def __init__(self, topic: str, group: str, min_records: int, max_delay: float) -> None:
        super().__init__()
        self.topic, self.group = topic, group
        self.rule = WaitRule(min_records=min_records, max_delay=max_delay)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{__name__}.{type(self).__name__}",
            {
                "topic": self.topic,
                "group": self.group,
                "min_records": self.rule.min_records,
                "max_delay": self.rule.max_delay,
            },
        )

    def shared_stream_key(self) -> Hashable:
        return STREAM_KEY

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Snapshot]:
        reader = cluster.OffsetsReader(await _kafka())
        while True:
            topics = {t for t, n in _WATCHED.get(STREAM_KEY, Counter()).items() if n > 0}
            try:
                stable = await asyncio.to_thread(reader.stable_offsets, topics)
            except KafkaAccessDenied:
                raise
            except KafkaException as err:  # Kafka away for a while: ask again next poll
                await log.warning(
                    "cannot read the offsets of %d watched topics: %s", len(topics), err
                )
            else:
                yield Snapshot(time.monotonic(), stable)
            await asyncio.sleep(POLL_SECONDS)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Snapshot]
    ) -> AsyncIterator[TriggerEvent]:
        watched = _WATCHED.setdefault(self.shared_stream_key(), Counter())
        watched[self.topic] += 1
        try:
            kafka = await _kafka()
            watch = Watch(self.rule)
            async for snapshot in shared_stream:
                stable = snapshot.stable.get(self.topic)
                if stable is None:
                    continue  # not (yet) on the cluster, or its offsets did not answer
                moved = cluster.moved_since(self.group, self.topic, watch.read_at)
                if watch.needs_position(stable, snapshot.at, moved):
                    read = functools.partial(
                        cluster.group_offsets, kafka, self.group, self.topic, list(stable), 10.0
                    )
                    try:
                        position = await asyncio.get_running_loop().run_in_executor(
                            _GROUP_READS, read
                        )
                    except KafkaException as err:
                        await log.warning(
                            "%s: cannot read group %s: %s", self.topic, self.group, err
                        )
                        continue
                    watch.saw_position(position, snapshot.at)
                if watch.due(stable, snapshot.at):
                    event = self._event(stable, watch.position or {})
                    await log.info(
                        "%s: %s records waiting; firing its archive", self.topic, event["waiting"]
                    )
                    yield TriggerEvent(event)
        finally:
            watched[self.topic] -= 1

    def _event(self, stable: Offsets, position: Offsets) -> dict[str, Any]:
        waiting = {str(p): end - position.get(p, 0) for p, end in stable.items()}
        return {"topic": self.topic, "waiting": waiting, "at": time.time()}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Alone, outside a triggerer's shared polls (the same poll, for this topic only)."""
        async for event in self.filter_shared_stream(self.open_shared_stream({})):
            yield event
