"""Planning: which offsets a run reads, decided from the newest token and Kafka's watermarks.

Pure functions, so every edge (retention gaps, recreated topics, new partitions, the per-run cap)
is decided here once and tested without Kafka. It lives in the protocol, below the pipeline,
because a rewind (`cairn.protocol.rewind.refusal`) judges with the very rule the run plans with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field, NonNegativeInt

from cairn.errors import PermanentError
from cairn.kafka.cluster import Watermarks
from cairn.protocol.tokens import Gap, Token

NewPartitionStart = Literal["earliest", "latest"]


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


class ArchiveElsewhere(PlanError):
    """The archive root holds nothing of a topic that a witness says was archived: a changed or
    mistyped `archive_root` would start it again from the beginning in the wrong place.
    `witness` says what was found ("its consumer group ... shows ...")."""

    def __init__(self, topic: str, root: str, witness: str) -> None:
        super().__init__(
            f"topic {topic!r}: archive root {root} holds no tokens of it, but {witness}, so its "
            "archive is elsewhere: was archive_root changed or mistyped? Point archive_root back "
            "at the archive, or, to start a new archive here on purpose, set start_new_archive: "
            "true for this topic (remove it after the first run)"
        )

    @classmethod
    def by_group(
        cls, topic: str, root: str, group: str, offsets: Mapping[int, int]
    ) -> ArchiveElsewhere:
        shown = " ".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
        witness = (
            f"its consumer group {group!r} shows it was archived up to offsets {shown} "
            "(partition:offset)"
        )
        return cls(topic, root, witness)

    @classmethod
    def by_root(cls, topic: str, root: str, earlier: str) -> ArchiveElsewhere:
        witness = f"archive root {earlier}, where it was archived before, holds its tokens"
        return cls(topic, root, witness)


class Span(NamedTuple):
    """A rewound backup file: archived by a run whose token a rewind deleted, at or after the
    position. Every parsed and quarantine file of its records lies within `[first, last]`."""

    first: int
    last: int
    keep: bool = False
    """Its records must not be read again whatever Kafka holds (they are sealed)."""


class Plan(BaseModel):
    """The offsets one run reads: `[start, end)` per partition (start == end: nothing new).

    JSON-serialisable, so it can travel between Airflow tasks.
    """

    topic: str
    ranges: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]]
    capped: bool
    gaps: list[Gap] = Field(default_factory=list)
    adopted: dict[NonNegativeInt, tuple[NonNegativeInt, NonNegativeInt]] = Field(
        default_factory=dict
    )
    """Per partition, rewound offsets `[from, to)` that stay archived as they are instead of
    being read again (Kafka no longer holds them, the topic is compacted, or they are sealed)."""

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
    rewound: Mapping[int, list[Span]] | None = None,
    compacted: bool = False,
    planned_before: bool = False,
) -> Plan:
    """Read each partition from the token's offset up to the high watermark, at most `cap` records.

    `latest` starts partitions at their end only on the topic's first run (no token, nothing
    archived, never `planned_before`): a partition that appears later is read from its first
    offset, and a partition that already lost records to retention then is a gap too. So a
    topic whose every token was deleted by hand is read from Kafka's first offset, never
    skipping what its runs had not archived yet. `topic_id` is Kafka's id of the
    topic now; a token that recorded another id belongs to a deleted topic of the same name.

    `rewound` are the files a rewind left at or after the position (`cairn.protocol.rewind`). Those
    that cannot be read again (below Kafka's low watermark, any on a `compacted` topic, or kept) are
    adopted, with everything before them: the run starts after them and keeps them as they are,
    so no gap is ever declared for offsets the archive holds. A range never ends inside a
    rewound file, so the commit that supersedes it covers all of its records.
    """
    if cap < 1:
        raise ValueError(f"per-run cap must be positive, got {cap}")
    if token is not None and token.topic_id and topic_id and token.topic_id != topic_id:
        raise TopicRecreated(_recreated_message(topic, token, topic_id))
    known = token.next_offsets if token else {}
    rewound = rewound or {}
    vanished = sorted(set(known) - set(partitions))
    if vanished:
        raise PartitionVanished(
            f"topic {topic!r}: partitions {vanished} were archived but Kafka no longer has them; "
            "the topic was probably deleted and recreated with fewer partitions"
        )
    first_run = token is None and not any(rewound.values()) and not planned_before
    ranges, gaps, adopted = {}, [], {}
    for p, (low, high) in sorted(partitions.items()):
        spans = sorted(rewound.get(p, ()))
        if p in known:
            start = known[p]
        elif spans:
            start = spans[0].first  # the rewind deleted every token that knew p
        elif first_run and new_partition_start == "latest":
            start = high
        else:
            start = low if token is None else 0
        kept = [s for s in spans if s.keep or compacted or s.first < low]
        if kept:
            end_kept = max(s.last for s in kept) + 1
            adopted[p] = (start, end_kept)
            start = end_kept
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
        end = min(high, start + cap)
        for span in spans:  # never end inside a rewound file
            if span.first < end <= span.last:
                end = span.last + 1
        if end > high:
            raise OffsetAheadOfKafka(_ahead_message(topic, p, end, low, high))
        ranges[p] = (start, end)
    capped = any(end < partitions[p].high for p, (_, end) in ranges.items())
    return Plan(topic=topic, ranges=ranges, capped=capped, gaps=gaps, adopted=adopted)


def kafka_source_options(ranges: Mapping[str, Mapping[int, tuple[int, int]]]) -> dict[str, str]:
    """Spark Kafka source `assign`, `startingOffsets` and `endingOffsets` for the non-empty
    `ranges` of each topic (a plan's `to_read`, or the part of it `cairn.packing` gives a
    source): one source reads them all (Spark demands offsets for every partition it reads, and
    reads exactly the partitions assigned)."""
    assign, start, end = {}, {}, {}
    for topic, partitions in ranges.items():
        read = {p: (s, e) for p, (s, e) in partitions.items() if e > s}
        if not read:
            raise ValueError(f"topic {topic!r}: nothing to read; do not start Spark")
        assign[topic] = sorted(read)
        start[topic] = {str(p): s for p, (s, _) in read.items()}
        end[topic] = {str(p): e for p, (_, e) in read.items()}
    return {
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(start),
        "endingOffsets": json.dumps(end),
    }


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
