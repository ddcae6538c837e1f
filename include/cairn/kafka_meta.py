"""Kafka metadata for planning: a topic's identity, partitions, watermarks and cleanup policy."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from cairn.plan import Watermarks


class TopicState(NamedTuple):
    """What planning needs to know of a topic now."""

    topic_id: str
    """Kafka's id: a topic deleted and recreated under the same name gets a new one."""
    watermarks: dict[int, Watermarks]
    compacted: bool
    """`cleanup.policy` includes `compact`: records below the high watermark may vanish."""


class TopicNotFound(Exception):
    """The topic does not exist on the cluster."""


def fetch_watermarks(
    bootstrap_servers: str, topic: str, timeout: float = 10.0
) -> dict[int, Watermarks]:
    """Low and high watermark of every partition of `topic`.

    With `read_committed` the high watermark is the last stable offset, so a planned range never
    ends inside an open transaction. Never creates the topic.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "cairn-planner",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as err:
            raise KafkaException(
                f"cannot read metadata of topic {topic!r} from {bootstrap_servers} "
                f"within {timeout}s: {err}"
            ) from err
        if metadata is None or (
            metadata.error is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise TopicNotFound(f"topic {topic!r} does not exist on {bootstrap_servers}")
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        watermarks = {}
        for partition in sorted(metadata.partitions):
            offsets = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout, cached=False
            )
            if offsets is None:
                raise KafkaException(
                    f"topic {topic!r} partition {partition}: no watermarks within {timeout}s"
                )
            watermarks[partition] = Watermarks(*offsets)
        return watermarks
    finally:
        consumer.close()


def fetch_topic(bootstrap_servers: str, topic: str, timeout: float = 10.0) -> TopicState:
    """The topic's id, watermarks and cleanup policy."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    with _describing(bootstrap_servers, topic, timeout):
        topic_id = _topic_id(admin, topic, timeout)
        resource = ConfigResource(ResourceType.TOPIC, topic)
        (configs,) = admin.describe_configs([resource], request_timeout=timeout).values()
        policy = configs.result(timeout)["cleanup.policy"].value or ""
    watermarks = fetch_watermarks(bootstrap_servers, topic, timeout)
    return TopicState(topic_id, watermarks, "compact" in policy.split(","))


def fetch_topic_id(bootstrap_servers: str, topic: str, timeout: float = 10.0) -> str:
    """Only the topic's id: whether it is still the topic that was planned."""
    with _describing(bootstrap_servers, topic, timeout):
        return _topic_id(AdminClient({"bootstrap.servers": bootstrap_servers}), topic, timeout)


def _topic_id(admin: AdminClient, topic: str, timeout: float) -> str:
    (described,) = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()
    return str(described.result(timeout).topic_id)


@contextlib.contextmanager
def _describing(bootstrap_servers: str, topic: str, timeout: float) -> Iterator[None]:
    """Admin errors named: a missing topic as TopicNotFound, the rest with topic and broker."""
    try:
        yield
    except KafkaException as err:
        if err.args and getattr(err.args[0], "code", lambda: None)() == (
            KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise TopicNotFound(f"topic {topic!r} does not exist on {bootstrap_servers}") from None
        raise KafkaException(
            f"cannot describe topic {topic!r} on {bootstrap_servers} within {timeout}s: {err}"
        ) from err


def timestamps_at(
    bootstrap_servers: str, topic: str, offsets: dict[int, int], timeout: float = 10.0
) -> dict[int, int]:
    """Kafka timestamp (millis) of the record at each partition's offset, for time lag.

    A partition whose record cannot be fetched in time is left out rather than guessed.
    """
    if not offsets:
        return {}
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "cairn-lag",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "allow.auto.create.topics": False,
            "fetch.max.bytes": 1024 * 1024,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        found: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(offsets) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            p = msg.partition()
            if p not in found and msg.offset() >= offsets[p]:
                found[p] = msg.timestamp()[1]
                consumer.pause([TopicPartition(topic, p)])
        return found
    finally:
        consumer.close()
