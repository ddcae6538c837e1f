"""The run record: one small record per committed run, which the commit writes and the overview,
CLI and metrics read.

The token says where a topic stands; it does not say how far behind Kafka the topic was when the
run committed, nor how long the run took. A `RunRecord` keeps that, in
`_status/<topic>/<seq:012d>.json`; the same record is what the archive DAG's `commit` task
returns (its XCom). It is written after the token, best effort: it describes the archive and is
never part of it, so a failure to write it is logged and the commit stands.

Only the newest `KEEP` records of a topic are kept (each save deletes the one `KEEP` runs
older), so reading the recent history is one listing however long the topic has been archived.
Each record also carries running totals per partition, so a Prometheus counter can be served
from the newest record alone.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from cairn.pipeline.freshness import Span, window
from cairn.protocol.manifest import SparkJob
from cairn.protocol.tokens import Counts, Gap
from cairn.storage.layout import status_folder, status_key
from cairn.storage.objects import Storage

log = logging.getLogger(__name__)

KEEP = 1000
"""Records kept per topic: one S3 listing page."""


class RunRecord(BaseModel):
    """What one committed archive run read and wrote, and how far behind Kafka it left the topic."""

    topic: str
    seq: int
    run_id: str
    planned_at: datetime
    committed_at: datetime
    duration_seconds: float
    """From planning to the token's creation."""
    ranges: dict[int, tuple[int, int]] = Field(default_factory=dict)
    """The offsets read per partition, `[first, end)`."""
    counts: Counts
    """What the run read and wrote (the token's counts)."""
    more_waiting: bool = False
    """The run stopped at the per-run cap: Kafka held more (the DAG starts the next run now)."""
    gaps: list[Gap] = Field(default_factory=list)
    """Offsets lost to retention before archiving, accepted by `accept_gaps`."""
    offset_lag: dict[int, int]
    """Records per partition Kafka held beyond the committed position, just after commit."""
    time_lag_seconds: float | None
    """Age of the oldest record not yet archived (0 when caught up; None if Kafka did not say)."""
    lag_error: str | None
    next_offsets: dict[int, int]
    partition_time_lag_seconds: dict[int, float] = Field(default_factory=dict)
    """`time_lag_seconds` per partition (0 for a caught-up partition)."""
    partition_counts: dict[int, Counts] = Field(default_factory=dict)
    """This run's counts per partition."""
    partition_totals: dict[int, Counts] = Field(default_factory=dict)
    """Counts per partition summed over this topic's runs since the record chain began (a missing
    previous record restarts the sums, which Prometheus reads as a counter reset)."""
    consumer_group: str | None = None
    """The Kafka consumer group the token's offsets were committed to (None: not committed)."""
    consumer_group_error: str | None = None
    """Why committing the consumer group's offsets failed (the token stands all the same)."""
    freshness: list[Span] = Field(default_factory=list)
    """How long this run's records waited from Kafka to the commit, after the spans of the
    runs committed in the hour before it (`cairn.pipeline.freshness`)."""
    spark_job: SparkJob | None = None
    """The Spark job that staged the run's records (None: it read none, or no job said)."""

    @model_validator(mode="before")
    @classmethod
    def _earlier_format(cls, data: Any) -> Any:
        """Records saved before `counts` held the run's counts as four fields."""
        if isinstance(data, dict) and "counts" not in data and "records_read" in data:
            data = dict(data)
            read = data.pop("records_read")
            data["counts"] = Counts(
                read=read,
                backup=read,
                partitioned=data.pop("records_partitioned", 0),
                quarantined=data.pop("records_quarantined", 0),
                bytes=data.pop("bytes_written", 0),
            )
        return data


class TopicStatus(BaseModel):
    """A topic as its recent runs show it."""

    topic: str
    last: RunRecord | None
    quarantine_ratio: float | None
    """Records quarantined per record read over the recent runs (None: nothing read)."""
    recent: list[RunRecord] = Field(default_factory=list)
    """The recent runs, newest first (what the ratio was computed over)."""


def folder(topic: str) -> str:
    return status_folder(topic)


def key(topic: str, seq: int) -> str:
    return status_key(topic, seq)


def with_history(record: RunRecord, previous: RunRecord | None) -> RunRecord:
    """`record` with `partition_totals` = the previous run's totals plus this run's counts, and
    the previous run's freshness spans of the last hour before its own."""
    before = previous.partition_totals if previous else {}
    totals = {}
    for p in sorted(set(before) | set(record.partition_counts)):
        old, new = before.get(p, Counts()), record.partition_counts.get(p, Counts())
        totals[p] = Counts(**{f: getattr(old, f) + getattr(new, f) for f in Counts.model_fields})
    spans = window(None, previous.freshness if previous else [], record.committed_at)
    return record.model_copy(
        update={"partition_totals": totals, "freshness": spans + record.freshness}
    )


def save(storage: Storage, record: RunRecord) -> bool:
    """Store `record` (with running totals from the newest earlier run's record) and drop the
    records beyond the newest `KEEP`. Never raises: the run is committed whatever happens here;
    False on failure.
    """
    try:
        earlier = sorted(s for s in _seqs(storage, record.topic) if s < record.seq)
        previous = load(storage, record.topic, earlier[-1]) if earlier else None
        full = with_history(record, previous)
        storage.write(key(record.topic, record.seq), full.model_dump_json(indent=2).encode())
        for seq in earlier[: max(0, len(earlier) + 1 - KEEP)]:
            storage.delete(key(record.topic, seq))
        return True
    except Exception as err:  # status describes the archive; it must never fail a commit
        log.warning(
            "topic %s: run status of token %s not saved (the token is committed): %s: %s",
            record.topic,
            record.seq,
            type(err).__name__,
            err,
        )
        return False


def _seqs(storage: Storage, topic: str) -> list[int]:
    """The seqs of the topic's run records (one listing: at most `KEEP` are kept)."""
    names = (
        k.rsplit("/", 1)[-1].removesuffix(".json") for k in storage.list_after(folder(topic), "")
    )
    return [int(n) for n in names if n.isdigit()]


def load(storage: Storage, topic: str, seq: int) -> RunRecord | None:
    """Run `seq`'s record; None if missing or unreadable (status is never load-bearing)."""
    try:
        return RunRecord.model_validate_json(storage.read(key(topic, seq)))
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError) as err:
        log.warning("topic %s: run status %s is unreadable, skipped: %s", topic, seq, err)
        return None


def recent(storage: Storage, topic: str, limit: int = 50) -> list[RunRecord]:
    """The newest `limit` run records of `topic`, newest first (one listing, `limit` reads)."""
    if limit < 1:
        return []
    records = []
    for seq in sorted(_seqs(storage, topic), reverse=True):
        record = load(storage, topic, seq)
        if record is not None:
            records.append(record)
            if len(records) == limit:
                break
    return records


def topic_status(storage: Storage, topic: str, limit: int = 50) -> TopicStatus:
    """The topic's newest run and its quarantine ratio over the last `limit` runs."""
    runs = recent(storage, topic, limit)
    return TopicStatus(
        topic=topic,
        last=runs[0] if runs else None,
        quarantine_ratio=quarantine_ratio(runs),
        recent=runs,
    )


def quarantine_ratio(runs: list[RunRecord]) -> float | None:
    """Quarantined per read over `runs`; None when they read nothing (no evidence either way)."""
    read = sum(r.counts.read for r in runs)
    return sum(r.counts.quarantined for r in runs) / read if read else None
