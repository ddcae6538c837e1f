"""One archive run, step by step: plan → clean → (Spark archives) → verify → commit.

The Airflow tasks are one-line calls into these functions; `Planned` is what travels between
them. Planning claims the next token (`cairn.fence`) and stores the whole plan in the claim
object, so the Spark job reads it by reference, and every later step first checks that the claim
is still live: a stale plan fails fast instead of touching the archive.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pydantic import BaseModel

from cairn import clean, fence, kafka_meta, manifest, staging, status, tokens
from cairn.config import TopicConfig
from cairn.kafka_conf import KafkaConf
from cairn.layout import manifest_key
from cairn.plan import Plan, TopicRecreated, lag, plan
from cairn.storage import Storage

log = logging.getLogger(__name__)


class Planned(BaseModel):
    """A planned run: its claim, the ranges to read and the token they were planned from."""

    claim: fence.Claim
    topic: str
    run_id: str
    topic_id: str | None
    compacted: bool = False
    """The topic's `cleanup.policy` includes compact (re-reads may return fewer records)."""
    base_offsets: dict[int, int]
    """`next_offsets` of the token planned from (empty when there was none)."""
    plan: Plan
    planned_at: datetime
    """Also the processing time the Spark job parses with, so a retry writes the same bytes."""

    @property
    def seq(self) -> int:
        """The token this run commits."""
        return self.claim.seq

    @property
    def attempt_id(self) -> str:
        return self.claim.attempt_id

    @property
    def manifest_key(self) -> str:
        return manifest_key(self.topic, self.attempt_id)

    def staged(self, storage: Storage) -> Storage:
        """Where this attempt's files wait until its token commits."""
        return staging.staged(storage, self.topic, self.attempt_id)


class Summary(BaseModel):
    """What a committed run read and wrote, and how far behind Kafka the topic still is."""

    topic: str
    seq: int
    ranges: dict[int, tuple[int, int]]
    counts: tokens.Counts
    offset_lag: dict[int, int]
    time_lag_seconds: float | None
    """Age of the oldest record not yet archived (0 when caught up; None if Kafka did not say)."""
    more_waiting: bool
    gaps: list[tokens.Gap]
    lag_error: str | None = None
    """Why the lag is unknown: the token is committed all the same."""
    partition_time_lag_seconds: dict[int, float] = {}
    """`time_lag_seconds` per partition (0 where caught up)."""
    consumer_group: str | None = None
    """The consumer group the token's offsets were committed to (None: not committed)."""
    consumer_group_error: str | None = None
    """Why committing them failed: the token is committed all the same."""


def load_planned(storage: Storage, claim_key: str) -> Planned:
    """The plan stored in a claim object (how the Spark job receives it)."""
    return Planned.model_validate_json(storage.read(claim_key))


def plan_run(cfg: TopicConfig, storage: Storage, kafka: KafkaConf, run_id: str) -> Planned | None:
    """Plan and claim the next token; None when there is nothing to read or record.

    First finishes publishing any committed run a crash interrupted, so the archive is whole
    even when nothing new arrives.
    """
    topic = cfg.topic
    staging.settle(storage, topic)
    token = tokens.newest(storage, topic)
    state = kafka_meta.fetch_topic(kafka, topic)
    args = (topic, token, state.watermarks, cfg.max_records_per_partition, cfg.new_partition_start)
    base = token.next_offsets if token else {}
    rewound = clean.rewound_backups(storage, topic, base, cfg.generation)
    if rewound:  # a rewind: refuse before anything else if its output cannot be read again
        probe = plan(*args, accept_gaps=True, topic_id=state.topic_id)
        starts = {p: start for p, (start, _) in probe.ranges.items()}
        clean.check_rereadable(topic, rewound, starts, state.compacted)
    planned = plan(*args, accept_gaps=cfg.accept_gaps, topic_id=state.topic_id)
    for gap in planned.gaps:
        log.warning(
            "topic %s partition %s: offsets [%s, %s) were lost to retention before archiving "
            "(accepted by accept_gaps)",
            topic,
            gap.partition,
            gap.from_offset,
            gap.to_offset,
        )
    if planned.empty and not planned.gaps and planned.next_offsets == base and not rewound:
        return None

    def made(claim: fence.Claim) -> Planned:
        return Planned(
            claim=claim,
            topic=topic,
            run_id=run_id,
            topic_id=state.topic_id,
            compacted=state.compacted,
            base_offsets=base,
            plan=planned,
            planned_at=claim.created_at,
        )

    link = fence.Link(seq=token.seq, created_at=token.created_at) if token else None
    claim = fence.claim(
        storage, topic, "archive", link, run_id, lambda c: made(c).model_dump_json().encode()
    )
    return made(claim)


def clean_run(cfg: TopicConfig, storage: Storage, planned: Planned, kafka: KafkaConf) -> list[str]:
    """Delete what a rewind un-committed, so the read cannot duplicate (other attempts were
    settled when planning: their staged files never reach the data folders)."""
    fence.check_live(storage, planned.claim)
    position = planned.base_offsets
    rewound = clean.rewound_backups(storage, planned.topic, position, cfg.generation)
    if not rewound:
        return []
    low = {p: w.low for p, w in kafka_meta.fetch_watermarks(kafka, planned.topic).items()}
    starts = {p: max(start, low.get(p, start)) for p, (start, _) in planned.plan.ranges.items()}
    clean.check_rereadable(planned.topic, rewound, starts, planned.compacted)
    deleted = clean.delete_rewound(storage, planned.topic, position)
    for key in deleted:
        log.info("removed rewound %s", key)
    return deleted


def verify_run(storage: Storage, planned: Planned) -> manifest.VerifyReport:
    fence.check_live(storage, planned.claim)
    if planned.plan.empty:  # the run only records a position (new partitions, a gap)
        return manifest.VerifyReport(counts=tokens.Counts(), partitions={})
    attempt = manifest.load(storage, planned.manifest_key)
    if attempt.attempt_id != planned.attempt_id:
        raise manifest.VerificationFailed(
            f"{planned.manifest_key} belongs to attempt {attempt.attempt_id}, not "
            f"{planned.attempt_id}"
        )
    return manifest.verify(attempt, planned.plan.to_read, planned.staged(storage))


def commit_run(
    cfg: TopicConfig,
    storage: Storage,
    planned: Planned,
    report: manifest.VerifyReport,
    kafka: KafkaConf,
) -> Summary:
    """Create the token, then publish the run's staged files; only now is its output archived.

    Safe to retry at any point: a token that already names this attempt is success, and
    publishing finishes what a crash interrupted. Then, best effort (the token stands whatever
    happens): the topic's consumer group gets the token's offsets and the run its status record.
    """
    topic = planned.topic
    newest = True
    if fence.decided_for(storage, topic, "archive", planned.seq) == planned.attempt_id:
        log.info("topic %s: token %s was already committed by this attempt", topic, planned.seq)
        link = fence.read_link(storage, topic, "archive", planned.seq)
        committed_at = link.created_at if link else datetime.now(UTC)
        newest = fence.link_seqs(storage, topic, "archive")[-1:] == [planned.seq]
    else:
        _check_same_topic(kafka, planned)
        prepare_publication(storage, planned)
        token = token_for(cfg, planned, report)
        tokens.commit(storage, token, planned.claim)
        committed_at = token.created_at
    staging.publish(storage, topic, planned.attempt_id)
    summary = _summary(planned, report, kafka)
    if cfg.commit_consumer_group and newest:  # a late retry must not move the group back
        summary = _commit_group(cfg, kafka, summary, planned.plan.next_offsets)
    status.save(storage, run_record(planned, report, summary, committed_at))
    return summary


def run_record(
    planned: Planned, report: manifest.VerifyReport, summary: Summary, committed_at: datetime
) -> status.RunRecord:
    """The status record of a committed run."""
    counts = report.counts
    return status.RunRecord(
        topic=planned.topic,
        seq=planned.seq,
        run_id=planned.run_id,
        planned_at=planned.planned_at,
        committed_at=committed_at,
        duration_seconds=max(0.0, (committed_at - planned.planned_at).total_seconds()),
        records_read=counts.read,
        records_partitioned=counts.partitioned,
        records_quarantined=counts.quarantined,
        bytes_written=counts.bytes,
        offset_lag=summary.offset_lag,
        time_lag_seconds=summary.time_lag_seconds,
        lag_error=summary.lag_error,
        next_offsets=planned.plan.next_offsets,
        partition_time_lag_seconds=summary.partition_time_lag_seconds,
        partition_counts=report.partitions,
        consumer_group=summary.consumer_group,
        consumer_group_error=summary.consumer_group_error,
    )


def _commit_group(
    cfg: TopicConfig, kafka: KafkaConf, summary: Summary, offsets: dict[int, int]
) -> Summary:
    """Give the topic's consumer group the token's offsets; a failure is reported, not raised."""
    group = cfg.group_id
    try:
        kafka_meta.commit_group_offsets(kafka, group, summary.topic, offsets)
    except Exception as err:  # the token is committed; the group only mirrors it
        error = f"{type(err).__name__}: {err}"
        log.warning(
            "topic %s: consumer group %s not updated to token %s: %s",
            summary.topic,
            group,
            summary.seq,
            error,
        )
        return summary.model_copy(update={"consumer_group_error": error})
    return summary.model_copy(update={"consumer_group": group})


def prepare_publication(storage: Storage, planned: Planned) -> None:
    """Store what committing moves into the data folders: the files the manifest lists."""
    files = [] if planned.plan.empty else manifest.load(storage, planned.manifest_key).files
    publication = staging.Publication(move=[f.key for f in files])
    staging.prepare(storage, planned.topic, planned.attempt_id, publication)


def token_for(cfg: TopicConfig, planned: Planned, report: manifest.VerifyReport) -> tokens.Token:
    """The token a verified attempt commits."""
    return tokens.Token(
        seq=planned.seq,
        topic=planned.topic,
        generation=cfg.generation,
        next_offsets=planned.plan.next_offsets,
        previous_offsets=planned.base_offsets,
        counts=report.counts,
        manifest=None if planned.plan.empty else planned.manifest_key,
        attempt_id=planned.attempt_id,
        topic_id=planned.topic_id,
        run_id=planned.run_id,
        created_at=datetime.now(UTC),
        planned_at=planned.planned_at,
        gaps=planned.plan.gaps,
    )


def _check_same_topic(kafka: KafkaConf, planned: Planned) -> None:
    """The topic read must still be the one planned: recreated meanwhile, the records differ."""
    if planned.topic_id is None:
        return
    now = kafka_meta.fetch_topic_id(kafka, planned.topic)
    if now != planned.topic_id:
        raise TopicRecreated(
            f"topic {planned.topic!r} was deleted and recreated while {planned.attempt_id} ran "
            f"(id {planned.topic_id} when planned, {now} now); nothing was committed"
        )


def _summary(planned: Planned, report: manifest.VerifyReport, kafka: KafkaConf) -> Summary:
    """The run summary; Kafka failing to report lag does not undo a committed run."""
    next_offsets = planned.plan.next_offsets
    offset_lag: dict[int, int] = {}
    time_lag: float | None = None
    partition_lag: dict[int, float] = {}
    error = None
    try:
        watermarks = kafka_meta.fetch_watermarks(kafka, planned.topic)
        offset_lag = lag(next_offsets, watermarks)
        behind = {p: next_offsets[p] for p, n in offset_lag.items() if n > 0 and p in next_offsets}
        oldest = kafka_meta.timestamps_at(kafka, planned.topic, behind)
        now_ms = datetime.now(UTC).timestamp() * 1000
        partition_lag = {p: 0.0 for p in offset_lag}
        partition_lag.update({p: max(0.0, (now_ms - ts) / 1000) for p, ts in oldest.items()})
        time_lag = max(partition_lag.values(), default=0.0)
    except Exception as err:  # the token is committed; a lag query must not fail the run
        error = f"{type(err).__name__}: {err}"
        partition_lag = {}
        log.warning("topic %s: lag unknown after commit: %s", planned.topic, error)
    return Summary(
        topic=planned.topic,
        seq=planned.seq,
        ranges=planned.plan.to_read,
        counts=report.counts,
        offset_lag=offset_lag,
        time_lag_seconds=time_lag,
        more_waiting=planned.plan.capped,
        gaps=planned.plan.gaps,
        lag_error=error,
        partition_time_lag_seconds=partition_lag,
    )
