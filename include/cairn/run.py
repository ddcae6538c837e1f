"""One archive run, step by step: plan → clean → (Spark archives) → verify → commit.

The Airflow tasks are one-line calls into these functions; `Planned` is what travels between
them (as XCom JSON), so every step after planning works on exactly the ranges that were planned.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel

from cairn import clean, kafka_meta, manifest, tokens
from cairn.config import TopicConfig
from cairn.layout import manifest_key
from cairn.plan import Plan, lag, plan
from cairn.storage import Storage

log = logging.getLogger(__name__)


class Planned(BaseModel):
    """A planned run: the ranges to read and the token they were planned from."""

    topic: str
    run_id: str
    attempt_id: str
    seq: int
    """The seq this run commits."""
    base_offsets: dict[int, int]
    """`next_offsets` of the token planned from (empty when there was none)."""
    plan: Plan
    planned_at: datetime

    @property
    def manifest_key(self) -> str:
        return manifest_key(self.topic, self.attempt_id)


class Summary(BaseModel):
    """What a committed run read and wrote, and how far behind Kafka the topic still is."""

    topic: str
    seq: int
    ranges: dict[int, tuple[int, int]]
    counts: tokens.Counts
    offset_lag: dict[int, int]
    time_lag_seconds: float
    """Age of the oldest record not yet archived (0 when caught up)."""
    more_waiting: bool
    gaps: list[tokens.Gap]


def plan_run(cfg: TopicConfig, storage: Storage, bootstrap: str, run_id: str) -> Planned:
    topic = cfg.topic
    token = tokens.newest(storage, topic)
    watermarks = kafka_meta.fetch_watermarks(bootstrap, topic)
    planned = plan(
        topic,
        token,
        watermarks,
        cfg.max_records_per_partition,
        cfg.new_partition_start,
        cfg.accept_gaps,
    )
    for gap in planned.gaps:
        log.warning(
            "topic %s partition %s: offsets [%s, %s) were lost to retention before archiving "
            "(accepted by accept_gaps)",
            topic,
            gap.partition,
            gap.from_offset,
            gap.to_offset,
        )
    seq = tokens.next_seq(token)
    return Planned(
        topic=topic,
        run_id=run_id,
        attempt_id=f"{seq:012d}-{uuid.uuid4().hex[:12]}",
        seq=seq,
        base_offsets=token.next_offsets if token else {},
        plan=planned,
        planned_at=datetime.now(UTC),
    )


def clean_run(cfg: TopicConfig, storage: Storage) -> list[str]:
    """Delete what no surviving token covers, so the read that follows cannot duplicate."""
    deleted = clean.clean(storage, cfg.topic, tokens.newest(storage, cfg.topic))
    for key in deleted:
        log.info("removed uncommitted %s", key)
    return deleted


def verify_run(storage: Storage, planned: Planned) -> manifest.VerifyReport:
    attempt = manifest.load(storage, planned.manifest_key)
    return manifest.verify(attempt, planned.plan.to_read, storage)


def commit_run(
    cfg: TopicConfig,
    storage: Storage,
    planned: Planned,
    report: manifest.VerifyReport,
    bootstrap: str,
) -> Summary:
    """Write the next token; only now is the run's output part of the archive."""
    token = tokens.Token(
        seq=planned.seq,
        topic=planned.topic,
        generation=cfg.generation,
        next_offsets=planned.plan.next_offsets,
        previous_offsets=planned.base_offsets,
        counts=report.counts,
        manifest=planned.manifest_key,
        run_id=planned.run_id,
        created_at=datetime.now(UTC),
        planned_at=planned.planned_at,
        gaps=planned.plan.gaps,
    )
    tokens.commit(storage, token)
    watermarks = kafka_meta.fetch_watermarks(bootstrap, planned.topic)
    offset_lag = lag(token.next_offsets, watermarks)
    behind = {p: token.next_offsets[p] for p, n in offset_lag.items() if n > 0}
    oldest = kafka_meta.timestamps_at(bootstrap, planned.topic, behind)
    now_ms = datetime.now(UTC).timestamp() * 1000
    return Summary(
        topic=planned.topic,
        seq=token.seq,
        ranges=planned.plan.to_read,
        counts=report.counts,
        offset_lag=offset_lag,
        time_lag_seconds=max(((now_ms - ts) / 1000 for ts in oldest.values()), default=0.0),
        more_waiting=planned.plan.capped,
        gaps=planned.plan.gaps,
    )
