"""One archive run, step by step: plan → (Spark archives, clean beside it) → verify → commit.

The Airflow tasks are one-line calls into these functions; `Planned` is what travels between
them. A run is an attempt (`cairn.protocol.attempt`, `ARCHIVE`), as rebuilds and seals are:
planning claims the next token and stores the whole plan in the claim object, so the Spark job
reads it by reference (`load_claimed`), every later step first checks that the claim is still
live, the job saves its manifest (`save_attempt`), and the run commits through the one commit
site (`commit_archive`). This module supplies what is the archive's own: the plan, the manifest,
and the change a run makes (its position, its files, its `ArchivePayload`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import Field

from cairn.config import TopicConfig
from cairn.kafka import cluster
from cairn.kafka.connection import KafkaConf
from cairn.pipeline import freshness, run_record
from cairn.protocol import commit, leftovers, manifest, rewind, tokens
from cairn.protocol.attempt import Attempts, Claimed
from cairn.protocol.plan import ArchiveElsewhere, Plan, TopicRecreated, lag, plan
from cairn.storage.layout import chain_folder, claims_folder
from cairn.storage.objects import Storage

if TYPE_CHECKING:
    from cairn.datafiles.writer import PartitionResult

log = logging.getLogger(__name__)


class Planned(Claimed):
    """A planned run: its claim, the ranges to read and the rewound files its commit replaces."""

    topic: str
    run_id: str
    topic_id: str | None
    compacted: bool = False
    """The topic's `cleanup.policy` includes compact (re-reads may return fewer records)."""
    plan: Plan
    planned_at: datetime
    """Also the processing time the Spark job parses with, so a retry writes the same bytes."""
    replaces: list[str] = Field(default_factory=list)
    """Rewound files holding offsets this run reads again (`cairn.protocol.rewind.supersedes`)."""

    @property
    def seq(self) -> int:
        """The token this run commits (unless a rebuild or seal commits first)."""
        return self.claim.seq

    @property
    def base_offsets(self) -> dict[int, int]:
        """The position planned from (empty when there was no token)."""
        return self.claim.base_offsets


ARCHIVE = Attempts("archive", Planned, manifest.Manifest, manifest.CorruptManifest, what="manifest")
load_claimed = ARCHIVE.load
"""The plan stored in a claim object (how the Spark job receives it)."""


EarlierRoots = Callable[[], Mapping[str, Storage]]
"""The archive roots a topic was archived under before, opened (the Airflow edge remembers the
root of each commit: `cairn_airflow.root_memory`); asked only before a topic's first run at a
root."""


def check_new_archive(
    cfg: TopicConfig, kafka: KafkaConf, partitions: list[int], earlier_roots: EarlierRoots
) -> None:
    """Refuse to start an archive where the root holds nothing of the topic but a witness says
    it was archived elsewhere (`ArchiveElsewhere`), unless the entry says `start_new_archive`.

    Two witnesses, each one request: the topic's consumer group, which every commit moves
    (unless `commit_consumer_group` is false), and an earlier root of the topic that still holds
    its tokens (a listing of at most one key), which needs no consumer group.
    """
    if cfg.start_new_archive:
        return
    if cfg.commit_consumer_group:
        found = cluster.group_offsets(kafka, cfg.group_id, cfg.topic_name, partitions)
        if found:
            raise ArchiveElsewhere.by_group(cfg.topic_name, cfg.archive_root, cfg.group_id, found)
    for root, earlier in earlier_roots().items():
        if root != cfg.archive_root and earlier.holds_any(chain_folder(cfg.topic_name)):
            raise ArchiveElsewhere.by_root(cfg.topic_name, cfg.archive_root, root)


def plan_run(
    cfg: TopicConfig,
    storage: Storage,
    kafka: KafkaConf,
    run_id: str,
    earlier_roots: EarlierRoots = dict,
) -> Planned | None:
    """Plan and claim the next token; None when there is nothing to read or record.

    Settles the newest token first (`cairn.protocol.commit.settle`: a crashed commit's publication
    is finished), so the archive is whole even when nothing new arrives. A topic's first run at
    a root is refused if a witness says it was archived elsewhere (`check_new_archive`).
    """
    topic = cfg.topic_name
    token = commit.settle(storage, topic)
    state = cluster.fetch_topic(kafka, topic)
    position = token.next_offsets if token else {}
    rewound = rewind.survey(storage, topic, position)
    spans = rewind.spans(storage, rewound)
    planned_before = token is None and storage.holds_any(claims_folder(topic, "archive"))
    if token is None and not any(spans.values()) and not planned_before:
        check_new_archive(cfg, kafka, list(state.watermarks), earlier_roots)
    planned = plan(
        topic,
        token,
        state.watermarks,
        cfg.max_records_per_partition,
        cfg.new_partition_start,
        cfg.accept_gaps,
        state.topic_id,
        rewound=spans,
        compacted=state.compacted,
        planned_before=planned_before,
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
    for p, (first, end) in planned.adopted.items():
        log.warning(
            "topic %s partition %s: rewound offsets [%s, %s) cannot be read again (retention, "
            "compaction or a seal): their files stay archived as they are",
            topic,
            p,
            first,
            end,
        )
    if planned.empty and not planned.gaps and planned.next_offsets == position:
        return None
    replaces = rewind.supersedes(rewound, planned.to_read)

    def made(claim: commit.Claim) -> Planned:
        return Planned(
            claim=claim,
            topic=topic,
            run_id=run_id,
            topic_id=state.topic_id,
            compacted=state.compacted,
            plan=planned,
            planned_at=claim.created_at,
            replaces=replaces,
        )

    return ARCHIVE.claim(storage, topic, token, run_id, made, cfg.attempt_timeout)


def save_attempt(
    cfg: TopicConfig,
    storage: Storage,
    planned: Planned,
    results: list[PartitionResult],
    spark_job: manifest.SparkJob | None = None,
) -> manifest.Manifest:
    """The attempt manifest of what the writers staged (the Spark job's last step), staged with
    them only while the claim is live (`Attempts.save`)."""
    attempt = manifest.Manifest(
        topic=planned.topic,
        attempt_id=planned.attempt_id,
        run_id=planned.run_id,
        generation=cfg.generation,
        ranges=planned.plan.to_read,
        records_read={r.partition: r.records for r in results if r.partition is not None},
        files=[entry for r in results for entry in r.files],
        processing_time=planned.planned_at,
        created_at=datetime.now(UTC),
        gaps=planned.plan.gaps,
        parses=cfg.parses,
        spark_job=spark_job,
        timestamps={
            r.partition: (r.first_timestamp, r.last_timestamp)
            for r in results
            if r.partition is not None
            and r.first_timestamp is not None
            and r.last_timestamp is not None
        },
    )
    ARCHIVE.save(storage, planned, attempt)
    return attempt


def clean_run(storage: Storage, planned: Planned) -> list[str]:
    """Remove what attempts that can no longer commit left (`cairn.protocol.leftovers`: those
    this run fenced out among them), never a data file: rewound files stay readable until this
    run's commit replaces them."""
    planned.check_live(storage)
    return leftovers.sweep(storage, planned.topic, spare=planned.attempt_id)


def verify_run(storage: Storage, planned: Planned) -> manifest.VerifyReport:
    planned.check_live(storage)
    if planned.plan.empty:  # the run only records a position (new partitions, a gap)
        return manifest.VerifyReport(counts=tokens.Counts(), partitions={})
    attempt = ARCHIVE.load_attempt(planned.staged(storage), planned.manifest_key)
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
) -> run_record.RunRecord:
    """Commit the run (`commit_archive`); only now is its output archived. Returns the run's
    record (`cairn.pipeline.run_record`).

    Then, best effort (the token stands whatever happens): the topic's consumer group gets the
    token's offsets and the run its status record.
    """
    token = commit_archive(cfg, storage, planned, report, kafka)
    record = _run_record(planned, token, report, kafka)
    if cfg.commit_consumer_group and _still_the_position(storage, token):
        record = _commit_group(cfg, kafka, record, planned.plan.next_offsets)
    run_record.save(storage, record)
    return record


def commit_archive(
    cfg: TopicConfig,
    storage: Storage,
    planned: Planned,
    report: manifest.VerifyReport,
    kafka: KafkaConf | None,
) -> tokens.Token:
    """Commit a verified run through the one commit site: its staged files in, the rewound
    files it read again out. Safe to retry at any point (`cairn.protocol.commit.commit`)."""

    def change() -> commit.Change:
        staged = planned.staged(storage)
        empty = planned.plan.empty
        files = [] if empty else ARCHIVE.load_attempt(staged, planned.manifest_key).files
        return commit.Change(
            requirements=[commit.SamePosition(), commit.NewestClaim(), SameTopic(kafka, planned)],
            adds={f.key: f.bytes for f in files},
            replaces=planned.replaces,
            position=planned.plan.next_offsets,
            payload=tokens.ArchivePayload(
                generation=cfg.generation,
                counts=report.counts,
                manifest=None if empty else planned.manifest_key,
                topic_id=planned.topic_id,
                planned_at=planned.planned_at,
                gaps=planned.plan.gaps,
                adopted=planned.plan.adopted,
            ),
        )

    return ARCHIVE.commit(storage, planned, change)


def _still_the_position(storage: Storage, token: tokens.Token) -> bool:
    """Whether the archive still stands where `token` left it, so the group may follow it.

    Not whether `token` is the newest: a seal or rebuild committed since carries the position
    over, and skipping the group then would leave the triggerer of a `run_on: records` topic
    waiting for a commit that happened. A later archive token (this is a late retry) or a rewind
    below `token` has moved the position, and the group must not be moved away from it."""
    later = tokens.seqs(storage, token.topic, after=token.seq)
    newest = tokens.read(storage, token.topic, later[-1] if later else token.seq)
    return newest is not None and newest.next_offsets == token.next_offsets


def _commit_group(
    cfg: TopicConfig, kafka: KafkaConf, summary: run_record.RunRecord, offsets: dict[int, int]
) -> run_record.RunRecord:
    """Give the topic's consumer group the token's offsets; a failure is reported, not raised."""
    group = cfg.group_id
    try:
        cluster.commit_group_offsets(kafka, group, summary.topic, offsets)
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


@dataclass(frozen=True)
class SameTopic:
    """The topic read must still be the one planned: recreated meanwhile, the records differ."""

    kafka: KafkaConf | None
    """None only where no topic id was recorded (runs without Kafka, in tests)."""
    planned: Planned

    def check(self, storage: Storage, claim: commit.Claim, newest: tokens.Token | None) -> None:
        planned = self.planned
        if planned.topic_id is None:
            return
        if self.kafka is None:
            raise ValueError(f"{claim.label}: checking Kafka's topic id needs a Kafka connection")
        now = cluster.fetch_topic_id(self.kafka, planned.topic)
        if now != planned.topic_id:
            raise TopicRecreated(
                f"topic {planned.topic!r} was deleted and recreated while {planned.attempt_id} "
                f"ran (id {planned.topic_id} when planned, {now} now); nothing was committed"
            )


def _run_record(
    planned: Planned, token: tokens.Token, report: manifest.VerifyReport, kafka: KafkaConf
) -> run_record.RunRecord:
    """The run's record; Kafka failing to report lag does not undo a committed run."""
    next_offsets = planned.plan.next_offsets
    offset_lag: dict[int, int] = {}
    time_lag: float | None = None
    partition_lag: dict[int, float] = {}
    error = None
    try:
        watermarks = cluster.fetch_watermarks(kafka, planned.topic)
        offset_lag = lag(next_offsets, watermarks)
        behind = {p: next_offsets[p] for p, n in offset_lag.items() if n > 0 and p in next_offsets}
        oldest = cluster.timestamps_at(kafka, planned.topic, behind)
        now_ms = datetime.now(UTC).timestamp() * 1000
        partition_lag = {p: 0.0 for p in offset_lag}
        partition_lag.update({p: max(0.0, (now_ms - ts) / 1000) for p, ts in oldest.items()})
        time_lag = max(partition_lag.values(), default=0.0)
    except Exception as err:  # the token is committed; a lag query must not fail the run
        error = f"{type(err).__name__}: {err}"
        partition_lag = {}
        log.warning("topic %s: lag unknown after commit: %s", planned.topic, error)
    span = _freshness(planned, token, report, kafka)
    return run_record.RunRecord(
        topic=planned.topic,
        seq=token.seq,
        run_id=planned.run_id,
        planned_at=planned.planned_at,
        committed_at=token.created_at,
        duration_seconds=max(0.0, (token.created_at - planned.planned_at).total_seconds()),
        ranges=planned.plan.to_read,
        counts=report.counts,
        more_waiting=planned.plan.capped,
        gaps=planned.plan.gaps,
        offset_lag=offset_lag,
        time_lag_seconds=time_lag,
        lag_error=error,
        next_offsets=next_offsets,
        partition_time_lag_seconds=partition_lag,
        partition_counts=report.partitions,
        freshness=[span] if span else [],
        spark_job=report.spark_job,
    )


def _freshness(
    planned: Planned, token: tokens.Token, report: manifest.VerifyReport, kafka: KafkaConf
) -> freshness.Span | None:
    """How long the run's records waited (`cairn.pipeline.freshness`), from the Kafka timestamps
    of the first and last record it read per partition: the Spark job's (the manifest's), else
    asked of Kafka; None if Kafka did not say, or if the run reads rewound records again (their
    wait is the rewind's, not the archive's)."""
    if planned.replaces:
        return None
    read = {p: c.read for p, c in report.partitions.items()}
    ranges = {p: r for p, r in planned.plan.to_read.items() if read.get(p)}
    if all(p in report.timestamps for p in ranges):
        first = {p: report.timestamps[p][0] for p in ranges}
        last = {p: report.timestamps[p][1] for p in ranges}
        return freshness.run_span(token.created_at, planned.planned_at, read, first, last)
    try:
        first = cluster.timestamps_at(kafka, planned.topic, {p: a for p, (a, _) in ranges.items()})
        ends = {p: b for p, (_, b) in ranges.items()}
        last = cluster.timestamps_at(
            kafka, planned.topic, {p: b - 1 for p, b in ends.items()}, before=ends
        )
    except Exception as err:  # the token is committed; freshness is only reported
        log.warning("topic %s: freshness unknown after commit: %s", planned.topic, err)
        return None
    return freshness.run_span(token.created_at, planned.planned_at, read, first, last)
