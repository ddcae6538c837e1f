"""Planning: which offsets a run reads, decided from the newest token and Kafka's watermarks.

Pure functions, so every edge (retention gaps, recreated topics, new partitions, the per-run cap)
is decided here once and tested without Kafka.
"""

from __future__ import annotations

import json
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field, NonNegativeInt

from cairn.errors import PermanentError
from cairn.tokens import Gap, Token

NewPartitionStart = Literal["earliest", "latest"]


class Watermarks(NamedTuple):
    """Kafka's offsets for a partition: the oldest still held, and the next to be written."""

    low: int
    high: int


class PlanError(PermanentError):
    """Kafka and the token disagree in a way Cairn will not resolve on its own."""


class RetentionGap(PlanError):
    """Kafka deleted records the archive never read."""


class OffsetAheadOfKafka(PlanError):
    """The token is past Kafka's end: the topic was recreated or the partition truncated."""


class TopicRecreated(PlanError):
    """Kafka's topic of this name is not the one the archive holds (deleted and recreated)."""


class PartitionVanished(PlanError):
    """A partition the archive has read from no longer exists in Kafka."""


class Plan(BaseModel):
    """The offsets one run reads: `[start, end)` per partition (start == end: nothing new).

    JSON-serialisable, so it can travel between Airflow tasks.
    """

    topic: str
    ranges: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]]
    capped: bool
    gaps: list[Gap] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.to_read

    @property
    def to_read(self) -> dict[int, tuple[int, int]]:
        """The ranges that hold records."""
        return {p: (start, end) for p, (start, end) in self.ranges.items() if end > start}

    @property
    def next_offsets(self) -> dict[int, int]:
        """The position after this run, for every partition including those with nothing new."""
        return {p: end for p, (_, end) in self.ranges.items()}


def plan(
    topic: str,
    token: Token | None,
    partitions: dict[int, Watermarks],
    cap: int,
    new_partition_start: NewPartitionStart,
    accept_gaps: bool,
    topic_id: str | None = None,
) -> Plan:
    """Read each partition from the token's offset up to the high watermark, at most `cap` records.

    Partitions the token does not know start at `new_partition_start`. A partition that appeared
    after the token but already lost records to retention is a gap too: those records were
    written after the last run and never archived. `topic_id` is Kafka's id of the topic now;
    a token that recorded another id belongs to a deleted topic of the same name.
    """
    if cap < 1:
        raise ValueError(f"per-run cap must be positive, got {cap}")
    if token is not None and token.topic_id and topic_id and token.topic_id != topic_id:
        raise TopicRecreated(_recreated_message(topic, token, topic_id))
    known = token.next_offsets if token else {}
    vanished = sorted(set(known) - set(partitions))
    if vanished:
        raise PartitionVanished(
            f"topic {topic!r}: partitions {vanished} were archived but Kafka no longer has them; "
            "the topic was probably deleted and recreated with fewer partitions"
        )
    ranges, gaps = {}, []
    for p, (low, high) in sorted(partitions.items()):
        if p in known:
            start = known[p]
        elif new_partition_start == "latest":
            start = high
        else:
            start = 0 if token else low
        if start > high:
            raise OffsetAheadOfKafka(_ahead_message(topic, p, start, low, high))
        if start < low:
            if not accept_gaps:
                raise RetentionGap(
                    f"topic {topic!r} partition {p}: offsets [{start}, {low}) were deleted by "
                    "Kafka retention before they were archived; archive faster, raise retention, "
                    "or set accept_gaps for this topic to skip them (the gap is then recorded)"
                )
            gaps.append(Gap(partition=p, from_offset=start, to_offset=low))
            start = low
        ranges[p] = (start, min(high, start + cap))
    capped = any(end < partitions[p].high for p, (_, end) in ranges.items())
    return Plan(topic=topic, ranges=ranges, capped=capped, gaps=gaps)


def kafka_json_offsets(topic: str, plan: Plan) -> tuple[str, str]:
    """Spark Kafka source `startingOffsets` and `endingOffsets` for the non-empty ranges.

    Spark demands offsets for every partition it reads, so pair these with `kafka_assign_json`.
    """
    ranges = plan.to_read
    if not ranges:
        raise ValueError(f"topic {topic!r}: the plan reads nothing; do not start Spark")
    start = {topic: {str(p): s for p, (s, _) in ranges.items()}}
    end = {topic: {str(p): e for p, (_, e) in ranges.items()}}
    return json.dumps(start), json.dumps(end)


def kafka_assign_json(topic: str, plan: Plan) -> str:
    """Spark Kafka source `assign` option: exactly the partitions with records to read."""
    return json.dumps({topic: sorted(plan.to_read)})


def lag(next_offsets: dict[int, int], watermarks: dict[int, Watermarks]) -> dict[int, int]:
    """Records per partition that Kafka holds beyond the archive's position.

    A partition the position does not know counts from its low watermark (all of it is waiting).
    """
    return {
        p: max(0, high - max(low, next_offsets.get(p, low)))
        for p, (low, high) in sorted(watermarks.items())
    }


def _recreated_message(topic: str, token: Token, topic_id: str) -> str:
    return (
        f"topic {topic!r} was deleted and recreated: the archive's token {token.seq} belongs to "
        f"the topic with id {token.topic_id}, but Kafka's topic {topic!r} now has id {topic_id}. "
        "Its offsets name other records, so Cairn will not continue the old archive with it. "
        "To archive the new topic and keep the old archive as it is, give this topic a new "
        "archive_root (another prefix) in topics.yaml; its first run starts from the beginning"
    )


def _ahead_message(topic: str, partition: int, start: int, low: int, high: int) -> str:
    return (
        f"topic {topic!r} partition {partition}: the archive has read up to offset {start} but "
        f"Kafka's partition ends at {high} (low watermark {low}). The topic was deleted and "
        "recreated, or the partition was truncated (unclean leader election), so offsets no "
        "longer name the records already archived. Cairn will not guess: move this topic's "
        "archive (backup/, partitioned/, quarantine/, _tokens/, _manifests/) aside, or archive "
        "the new topic under a new root, and the next run starts it from scratch."
    )
