"""Kafka metadata for planning: a topic's identity, partitions, watermarks and cleanup policy.

Every client is made from the one `KafkaConf` and watches librdkafka's error callback: a refused
login or an untrusted certificate fails at once as `KafkaAccessDenied`, naming the configuration
and the cause, instead of surfacing as a timeout after the full wait.

Metadata, offsets and group commits go through one admin client per process and `KafkaConf`
(`_admin`): its requests are asynchronous and thread-safe, so the triggerer's watchers and every
topic's plan and commit share it instead of paying librdkafka's start-up (threads, connections,
login) each time. Only reading records (`timestamps_at`) and a group's committed offsets
(`group_offsets`) need a consumer of their own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from cairn.errors import PermanentError
from cairn.kafka.connection import KafkaAccessDenied, KafkaConf

DENIED = {
    KafkaError._AUTHENTICATION: "check sasl.username and sasl.password",
    KafkaError._SSL: "check ssl.ca.location or ssl.ca.pem (the CA that signed the broker)",
}
"""librdkafka errors a retry cannot fix, and what to check."""


class Watermarks(NamedTuple):
    """Kafka's offsets for a partition: the oldest still held, and the next to be written."""

    low: int
    high: int


class TopicState(NamedTuple):
    """What planning needs to know of a topic now."""

    topic_id: str
    """Kafka's id: a topic deleted and recreated under the same name gets a new one."""
    watermarks: dict[int, Watermarks]
    compacted: bool
    """`cleanup.policy` includes `compact`: records below the high watermark may vanish."""


class TopicNotFound(PermanentError):
    """The topic does not exist on the cluster: retrying cannot create it (Cairn never creates
    topics), so a task fails at once, naming the topic and the cluster."""


_CONSUMER = {
    "enable.auto.commit": False,
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}
"""Cairn's consumers read by assignment, committed records only, and never create topics."""


_COORDINATOR_SETTLING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}
"""Answers of a group coordinator that is still starting (a new cluster): asked again."""


class _Client:
    """A confluent-kafka client that remembers the errors librdkafka reported on the side."""

    def __init__(
        self,
        kafka: KafkaConf,
        make: Callable[[dict], Any],
        overrides: dict[str, Any],
        retire: Callable[[], object] = lambda: None,
    ) -> None:
        self.kafka = kafka
        self.retire = retire
        """Called when access is denied: a shared client is then made anew by the next caller."""
        self.errors: deque[KafkaError] = deque(maxlen=64)
        self.client = make(kafka.client_config({**overrides, "error_cb": self.errors.append}))

    def check_access(self, poll: bool = True) -> None:
        """Raise KafkaAccessDenied if Kafka refused the login or the TLS handshake."""
        if poll:
            self.client.poll(0)  # serves the error callback (nothing is assigned to consume)
        for err in self.errors:
            # A TLS error that is not about the certificate (a connection cut mid-handshake)
            # may pass; a refused certificate or login will not.
            if err.code() == KafkaError._AUTHENTICATION or (
                err.code() == KafkaError._SSL and "certificate" in err.str()
            ):
                self.retire()
                raise KafkaAccessDenied(
                    f"{self.kafka.describe()}: Kafka refused the connection: {err.str()}; "
                    f"{DENIED[err.code()]}"
                )

    def metadata(self, topic: str | None, timeout: float) -> Any:
        """Cluster metadata (of `topic` only, if given), failing early when access is denied."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.client.list_topics(topic, timeout=min(1.0, timeout))
            except KafkaException as err:
                self.check_access()
                if time.monotonic() >= deadline:
                    what = f"metadata of topic {topic!r}" if topic else "the topic list"
                    raise KafkaException(
                        f"cannot read {what} from {self.kafka.describe()} within {timeout:g}s: "
                        f"{reason(err)}"
                    ) from err


def reason(err: KafkaException) -> str:
    """librdkafka's words for a failure (its `KafkaError` shown whole is a struct dump)."""
    first = err.args[0] if err.args else err
    return first.str() if isinstance(first, KafkaError) else str(first)


_admins: dict[str, _Client] = {}
_admins_lock = threading.Lock()
_inherited: list[dict[str, _Client]] = []
_MOST_ADMINS = 8
"""A process talks to a cluster or two; a connection whose secret rotates must not pile up."""


def _admin(kafka: KafkaConf) -> _Client:
    """The process's admin client for `kafka`, made on first use. It never asks the broker to
    create a topic: an admin client is a producer to librdkafka, whose metadata requests would
    otherwise let a broker with `auto.create.topics.enable` (Kafka's default) create a topic
    that was deleted, or never existed, the moment Cairn asks about it."""
    key = kafka.identity()
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            if len(_admins) >= _MOST_ADMINS:
                del _admins[next(iter(_admins))]  # the oldest
            admin = _admins[key] = _Client(
                kafka,
                AdminClient,
                {"allow.auto.create.topics": False},
                retire=lambda: _retire(key),
            )
        return admin


def _retire(key: str) -> None:
    with _admins_lock:
        _admins.pop(key, None)


def _forget_parent_clients() -> None:
    """After a fork, the child makes its own clients: the parent's librdkafka threads did not
    come along, so its clients are kept, unused, rather than destroyed (which would wait on
    those threads) — as is its lock, which another thread may have held."""
    global _admins, _admins_lock
    _inherited.append(_admins)
    _admins, _admins_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_clients)


def _list_offsets(
    admin: _Client, topic: str, partitions: list[int], spec: OffsetSpec, timeout: float
) -> dict[int, int]:
    """`spec`'s offset of each of `topic`'s `partitions` as `read_committed` readers see them:
    one ListOffsets request per partition leader. A retriable answer (a leader just elected, as
    in a topic just created) is asked again, with fresh metadata, until `timeout`; then this
    raises naming every partition that failed."""
    deadline = time.monotonic() + timeout
    found: dict[int, int] = {}
    pending = list(partitions)
    while True:
        futures = admin.client.list_offsets(
            {TopicPartition(topic, p): spec for p in pending},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=max(1.0, deadline - time.monotonic()),
        )
        failed: dict[int, KafkaException] = {}
        for tp, future in futures.items():
            try:
                found[tp.partition] = future.result().offset
            except KafkaException as err:
                failed[tp.partition] = err
        retriable = all(_retriable(err) for err in failed.values())
        if not failed or not retriable or time.monotonic() >= deadline:
            break
        pending = sorted(failed)
        time.sleep(0.2)
        with contextlib.suppress(KafkaException):  # the next answer says what is wrong
            admin.client.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
    if failed:
        admin.check_access()
        raise KafkaException(
            f"topic {topic!r}: no offsets from {admin.kafka.describe()} within {timeout:g}s: "
            + "; ".join(f"partition {p}: {reason(err)}" for p, err in sorted(failed.items()))
        )
    return found


_LEADER_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
"""Answers for a partition whose leader is being elected (librdkafka may not mark them
retriable)."""


def _retriable(err: KafkaException) -> bool:
    first = err.args[0] if err.args else None
    return isinstance(first, KafkaError) and (first.retriable() or first.code() in _LEADER_MOVING)


def list_topic_names(kafka: KafkaConf, timeout: float = 30.0) -> list[str]:
    """Every topic's name but Kafka's internal ones (`__…`), for topic patterns."""
    admin = _admin(kafka)
    names = admin.metadata(None, timeout).topics
    return sorted(name for name in names if not name.startswith("__"))


class OffsetsReader:
    """One admin client that reads the last stable offsets of many topics at once: the
    triggerer's one metadata client (`cairn_airflow.triggers.waiting_records`)."""

    def __init__(self, kafka: KafkaConf) -> None:
        self.admin = _admin(kafka)

    def stable_offsets(self, topics: set[str], timeout: float = 10.0) -> dict[str, dict[int, int]]:
        """Per topic that exists, per partition, the last stable offset: the end of what
        `read_committed` readers see. One metadata request and one ListOffsets request per
        broker, whatever the number of topics; a partition whose answer failed is left out."""
        if not topics:
            return {}
        found = self.admin.metadata(None, timeout).topics
        asked = {
            TopicPartition(topic, p): OffsetSpec.latest()
            for topic in topics
            if topic in found and found[topic].error is None
            for p in found[topic].partitions
        }
        if not asked:
            return {}
        futures = self.admin.client.list_offsets(
            asked, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout
        )
        offsets: dict[str, dict[int, int]] = {}
        for tp, future in futures.items():
            with contextlib.suppress(KafkaException):
                offsets.setdefault(tp.topic, {})[tp.partition] = future.result().offset
        self.admin.check_access()
        return offsets


def fetch_watermarks(kafka: KafkaConf, topic: str, timeout: float = 10.0) -> dict[int, Watermarks]:
    """Low and high watermark of every partition of `topic`.

    The high watermark is the last stable offset (`read_committed`), so a planned range never
    ends inside an open transaction. Never creates the topic.
    """
    admin = _admin(kafka)
    return _watermarks(admin, kafka, admin.metadata(topic, timeout), topic, timeout)


def _watermarks(
    admin: _Client, kafka: KafkaConf, found: Any, topic: str, timeout: float
) -> dict[int, Watermarks]:
    """`fetch_watermarks` of the partitions cluster metadata `found` lists for `topic`."""
    metadata = found.topics.get(topic)
    if metadata is None or (
        metadata.error is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    ):
        raise TopicNotFound(f"topic {topic!r} does not exist on {kafka.describe()}")
    if metadata.error is not None:
        raise KafkaException(metadata.error)
    partitions = sorted(metadata.partitions)
    low = _list_offsets(admin, topic, partitions, OffsetSpec.earliest(), timeout)
    high = _list_offsets(admin, topic, partitions, OffsetSpec.latest(), timeout)
    return {p: Watermarks(low[p], high[p]) for p in partitions}


def fetch_topic(kafka: KafkaConf, topic: str, timeout: float = 10.0) -> TopicState:
    """The topic's id, watermarks and cleanup policy."""
    admin = _admin(kafka)
    found = admin.metadata(topic, timeout)  # reachable, and allowed in, before waiting on requests
    with _describing(kafka, topic, timeout):
        topic_id = _topic_id(admin.client, topic, timeout)
        resource = ConfigResource(ResourceType.TOPIC, topic)
        (configs,) = admin.client.describe_configs([resource], request_timeout=timeout).values()
        policy = configs.result(timeout)["cleanup.policy"].value or ""
    watermarks = _watermarks(admin, kafka, found, topic, timeout)
    return TopicState(topic_id, watermarks, "compact" in policy.split(","))


def fetch_topic_id(kafka: KafkaConf, topic: str, timeout: float = 10.0) -> str:
    """Only the topic's id: whether it is still the topic that was planned."""
    admin = _admin(kafka)
    admin.metadata(topic, timeout)
    with _describing(kafka, topic, timeout):
        return _topic_id(admin.client, topic, timeout)


def _topic_id(admin: AdminClient, topic: str, timeout: float) -> str:
    (described,) = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout).values()
    return str(described.result(timeout).topic_id)


@contextlib.contextmanager
def _describing(kafka: KafkaConf, topic: str, timeout: float) -> Iterator[None]:
    """Admin errors named: a missing topic as TopicNotFound, the rest with topic and broker."""
    try:
        yield
    except KafkaException as err:
        if err.args and getattr(err.args[0], "code", lambda: None)() == (
            KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            raise TopicNotFound(f"topic {topic!r} does not exist on {kafka.describe()}") from None
        raise KafkaException(
            f"cannot describe topic {topic!r} on {kafka.describe()} within {timeout:g}s: "
            f"{reason(err)}"
        ) from err


def timestamps_at(
    kafka: KafkaConf,
    topic: str,
    offsets: dict[int, int],
    timeout: float = 10.0,
    before: dict[int, int] | None = None,
) -> dict[int, int]:
    """Kafka timestamp (millis) of the first record at or after each partition's offset (and
    before `before[p]`, if given), for time lag and freshness.

    A partition whose record cannot be fetched in time, or that has none there (its end reached,
    or only transaction markers and aborted records), is left out rather than guessed.
    """
    if not offsets:
        return {}
    lag_reader = _Client(
        kafka,
        Consumer,
        {
            **_CONSUMER,
            "group.id": "cairn-lag",
            "fetch.max.bytes": 1024 * 1024,
            "enable.partition.eof": True,
        },
    )
    consumer = lag_reader.client
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        found: dict[int, int] = {}
        pending = set(offsets)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            lag_reader.check_access(poll=False)
            if msg is None:
                continue
            p = msg.partition()
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(p)
                continue
            if p in pending and msg.offset() >= offsets[p]:
                if before is None or msg.offset() < before[p]:
                    found[p] = msg.timestamp()[1]
                pending.discard(p)
                consumer.pause([TopicPartition(topic, p)])
        return found
    finally:
        consumer.close()


_group_moves: dict[tuple[str, str], float] = {}
"""When this process last moved a consumer group's offsets of a topic (monotonic seconds)."""


def moved_since(group: str, topic: str, since: float | None) -> bool:
    """Whether this process moved `group`'s offsets of `topic` after `since` (monotonic
    seconds): a triggerer's watcher of the topic then reads them at once (`cairn.waiting`)."""
    at = _group_moves.get((group, topic))
    return at is not None and (since is None or at > since)


def commit_group_offsets(
    kafka: KafkaConf, group: str, topic: str, offsets: dict[int, int], timeout: float = 10.0
) -> None:
    """Record `offsets` (the next offset to read, per partition) as consumer group `group`'s
    position, so lag tools show the archive's lag like any consumer's. Raises on failure; the
    caller decides that this never matters more than the token."""
    if not offsets:
        return
    admin = _admin(kafka)
    admin.metadata(topic, timeout)
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
    )
    try:
        (done,) = admin.client.alter_consumer_group_offsets(
            [request], request_timeout=timeout
        ).values()
        result = done.result(timeout)
    except KafkaException as err:
        raise KafkaException(
            f"cannot commit consumer group {group!r} offsets of topic {topic!r} on "
            f"{kafka.describe()}: {err}"
        ) from err
    failed = [tp for tp in result.topic_partitions if tp.error is not None]
    if failed:
        raise KafkaException(
            f"consumer group {group!r} topic {topic!r}: "
            + "; ".join(f"partition {tp.partition}: {tp.error.str()}" for tp in failed)
        )
    _group_moves[(group, topic)] = time.monotonic()


def group_offsets(
    kafka: KafkaConf, group: str, topic: str, partitions: list[int], timeout: float = 30.0
) -> dict[int, int]:
    """The offsets consumer group `group` has committed for `topic`, per partition that has one:
    where the archive's commits last put the group (`commit_group_offsets`).

    Asked by a consumer of the group that never joins it (nothing subscribes, nothing commits):
    the admin client's `list_consumer_group_offsets` crashes the process on a group whose
    coordinator is still loading (librdkafka, confluent-kafka-python#1982). A new cluster's
    coordinator takes a while: each try is a new consumer, so it looks the coordinator up anew.
    """
    asked = [TopicPartition(topic, p) for p in sorted(partitions)]
    deadline = time.monotonic() + timeout
    while True:
        reader = _Client(kafka, Consumer, {**_CONSUMER, "group.id": group})
        try:
            found = reader.client.committed(asked, timeout=max(1.0, deadline - time.monotonic()))
            return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}
        except KafkaException as err:
            reader.check_access()
            settling = err.args[0].retriable() or err.args[0].code() in _COORDINATOR_SETTLING
            if not settling or time.monotonic() >= deadline:
                raise KafkaException(
                    f"cannot read consumer group {group!r} offsets of topic {topic!r} on "
                    f"{kafka.describe()} within {timeout:g}s: {reason(err)}"
                ) from err
        finally:
            reader.client.close()
        time.sleep(0.5)


def offsets_after(
    kafka: KafkaConf, topic: str, partitions: list[int], millis: int, timeout: float = 10.0
) -> dict[int, int | None]:
    """Per partition, the first offset whose Kafka timestamp is after `millis` (None: no such
    record yet), for completeness. One ListOffsets request per leader; no record is fetched."""
    if not partitions:
        return {}
    found = _list_offsets(
        _admin(kafka), topic, sorted(partitions), OffsetSpec.for_timestamp(millis + 1), timeout
    )
    return {p: offset if offset >= 0 else None for p, offset in found.items()}
