"""Re-producing archived records to a Kafka topic from the verbatim backup.

A replay sends, per partition, exactly the archived records with offsets in `[start, end)`
(start inclusive, end exclusive, the way Kafka's own positions read), in offset order, with their
keys, headers and timestamps (sent as CreateTime, so a topic with the default
`message.timestamp.type` keeps them). Each record goes to the same partition number it came from
unless `keep_partitions` is off, when the producer's partitioner picks one by key.

Only the backup files whose manifest spans meet the range are read (`cairn.views.finder`). The
producer is idempotent (`enable.idempotence`: no duplicates or reordering from its own retries,
`acks=all`), and the replay fails unless every record was acknowledged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Producer

from cairn.datafiles.avro_file import millis
from cairn.errors import PermanentError
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.views.finder import ArchiveIndex, NotArchived, read_records

PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 20}
_BOUND_RE = re.compile(r"(\d+):(\d+)")


class ReplayRefused(PermanentError):
    """The replay asked for something the archive or the target topic cannot give."""


class DeliveryFailed(PermanentError):
    """Kafka did not acknowledge every replayed record."""


@dataclass(frozen=True)
class Range:
    """Offsets `[start, end)` of one partition."""

    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"partition {self.partition} [{self.start}, {self.end})"


@dataclass
class ReplayResult:
    produced: dict[int, int] = field(default_factory=dict)
    """Records acknowledged per source partition."""
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.produced.values())


def parse_bound(text: str) -> tuple[int, int]:
    """`P:O` as (partition, offset)."""
    match = _BOUND_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not PARTITION:OFFSET (e.g. 0:1500)")
    return int(match.group(1)), int(match.group(2))


def plan_ranges(
    starts: Mapping[int, int], ends: Mapping[int, int], position: Mapping[int, int]
) -> list[Range]:
    """The ranges to replay: each partition named by a start or an end, from its start (default
    0) to its end (default: the archive's position, everything archived). Without any bound,
    every archived partition whole. NotArchived for an end past what the archive holds."""
    partitions = sorted(set(starts) | set(ends)) or sorted(p for p, n in position.items() if n)
    ranges = []
    for p in partitions:
        start, end = starts.get(p, 0), ends.get(p, position.get(p, 0))
        if end > position.get(p, 0):
            raise NotArchived(
                f"partition {p}: offsets up to {end} asked, but the archive holds partition {p} "
                f"only below offset {position.get(p, 0)}; wait for the next run or lower --to"
            )
        if start >= end:
            raise ValueError(f"partition {p}: --from {start} is not below --to {end} (exclusive)")
        ranges.append(Range(p, start, end))
    return ranges


def archived_records(index: ArchiveIndex, r: Range) -> Iterator[dict[str, Any]]:
    """The backup records of range `r`, in offset order, reading only the files that meet it."""
    for located in index.backup_files(r.partition, r.start, r.end):
        for row in read_records(index.storage, located.key):
            if row["offset"] >= r.end:
                break
            if row["offset"] >= r.start:
                yield row


def replay(
    index: ArchiveIndex,
    ranges: list[Range],
    kafka: KafkaConf,
    to_topic: str,
    *,
    keep_partitions: bool = True,
    progress: Callable[[Range, int], None] | None = None,
    timeout: float = 60.0,
) -> ReplayResult:
    """Produce `ranges` of the archive to `to_topic` (see the module doc); `progress(range,
    offset)` is called after each record is handed to the producer.

    Raises ReplayRefused if the target topic is missing or lacks a source partition (with
    `keep_partitions`), DeliveryFailed if any record was not acknowledged.
    """
    try:
        target = cluster.fetch_watermarks(kafka, to_topic)
    except cluster.TopicNotFound as err:
        raise ReplayRefused(f"{err}: create it first (Cairn never creates topics)") from None
    missing = sorted({r.partition for r in ranges} - set(target)) if keep_partitions else []
    if missing:
        raise ReplayRefused(
            f"topic {to_topic!r} has {len(target)} partitions and lacks {missing}: add partitions, "
            "or replay with --repartition to let the producer choose them by key"
        )
    result = ReplayResult()
    producer = Producer(kafka.client_config(PRODUCER))

    def delivered(err: KafkaError | None, partition: int, offset: int) -> None:
        if err is None:
            result.produced[partition] = result.produced.get(partition, 0) + 1
        elif len(result.errors) < 10:
            result.errors.append(f"partition {partition} offset {offset}: {err.str()}")

    for r in ranges:
        result.produced.setdefault(r.partition, 0)
        for row in archived_records(index, r):
            _produce(producer, to_topic, row, keep_partitions, delivered)
            if progress is not None:
                progress(r, row["offset"])
    left = producer.flush(timeout)
    if left or result.errors:
        lost = f"{left} records still unacknowledged after {timeout}s; " if left else ""
        raise DeliveryFailed(
            f"replay to {to_topic!r} on {kafka.describe()}: {lost}{len(result.errors)} delivery "
            f"errors (first: {'; '.join(result.errors[:3]) or 'none'}); acknowledged "
            f"{result.total} records: the target may hold part of the range"
        )
    return result


def _produce(
    producer: Producer,
    topic: str,
    row: dict[str, Any],
    keep_partitions: bool,
    delivered: Callable[[KafkaError | None, int, int], None],
) -> None:
    source, offset = row["partition"], row["offset"]
    args: dict[str, Any] = {
        "value": row["value"],
        "key": row["key"],
        "headers": [(h["key"], h["value"]) for h in row["headers"]],
        "timestamp": millis(row["timestamp"]),
        "on_delivery": lambda err, _msg: delivered(err, source, offset),
    }
    if keep_partitions:
        args["partition"] = source
    while True:
        try:
            producer.produce(topic, **args)
            producer.poll(0)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.5)
