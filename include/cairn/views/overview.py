"""What the overview page shows, read from the archive alone: where each topic stands, how far
behind Kafka it is and how that moved over the recent runs, what its files and quarantine hold.

Every number comes from objects Cairn already writes (the newest token, the run records of
`cairn.pipeline.run_record`, the data files' names, the quarantine files' `reason` field), so the
page needs no Kafka call and shows the same truth as the CLI and the metrics. The Airflow plugin
only adds what Airflow knows (the runs' states) and renders.

Reading is bounded: the trend is the newest `TREND_RUNS` run records, files per date come from
one listing per output, and quarantine reasons are counted over the newest `REASON_FILES` files.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any, cast

import fastavro
from pydantic import BaseModel

from cairn.config import TopicConfig
from cairn.pipeline import completeness, freshness, run_record
from cairn.pipeline.proof import read_proof
from cairn.pipeline.run_record import RunRecord
from cairn.protocol import commit
from cairn.storage.layout import file_date, kind_folder, parse_data_key
from cairn.storage.objects import Storage

TREND_RUNS = 20
"""Runs the lag trend spans."""

PROOFS_READ = 60
"""Sealed dates whose proof the page reads (the newest; older rows say only `sealed`)."""

REASON_FILES = 50
"""Newest quarantine files whose reasons are counted."""


class TopicOverview(BaseModel):
    """One topic's line on the overview page."""

    topic: str
    archive_root: str
    position: dict[int, int]
    """Next offset per partition after the newest token (empty: never committed)."""
    records_archived: int | None
    """Records committed since the run records began (None: no run record yet)."""
    offset_lag: int | None
    """Records Kafka held beyond the position just after the newest run, over all partitions."""
    time_lag_seconds: float | None
    offset_lag_trend: list[int]
    """Total offset lag after each recent run, oldest first."""
    time_lag_trend: list[float]
    """Time lag after each recent run, oldest first (runs that did not know it left out)."""
    freshness: tuple[float, float] | None
    """p50 and p95 seconds the records committed in the last hour waited from Kafka."""
    freshness_limit_seconds: float | None
    last: RunRecord | None
    quarantined: int
    """Records quarantined over the recent runs."""
    quarantine_ratio: float | None
    last_complete: date | None


class DateFiles(BaseModel):
    """The data files one date holds, and whether it is sealed (`cairn.pipeline.seal`)."""

    day: date
    partitioned: int = 0
    quarantine: int = 0
    sealed: int = 0
    """Of the files, how many are sealed files."""
    files_before: int | None = None
    """How many files the last seal merged (from the date's proof)."""
    snapshot_id: int | None = None
    """The table snapshot that holds the date (from its proof)."""
    table_records: int | None = None

    @property
    def state(self) -> str:
        """`sealed`, `sealed, N late files`, or `not sealed`."""
        if not self.sealed:
            return "not sealed"
        late = self.partitioned + self.quarantine - self.sealed
        return "sealed" if not late else f"sealed, {late} late file{'s' if late > 1 else ''}"


class TopicDetail(BaseModel):
    """One topic's own page."""

    overview: TopicOverview
    runs: list[RunRecord]
    """Newest first."""
    dates: list[DateFiles]
    """Newest first."""
    reasons: list[tuple[str, int]]
    """Quarantine reasons by count, most frequent first, over `reason_files` files."""
    reason_files: int


def topic_overview(storage: Storage, cfg: TopicConfig, runs: int = TREND_RUNS) -> TopicOverview:
    """The topic's position, lag, trend, last run and quarantine share."""
    return _overview(storage, cfg, run_record.recent(storage, cfg.topic_name, runs))


def topic_detail(
    storage: Storage, cfg: TopicConfig, runs: int = TREND_RUNS, reason_files: int = REASON_FILES
) -> TopicDetail:
    """The overview line plus the recent runs, files per date and quarantine reasons."""
    recent = run_record.recent(storage, cfg.topic_name, runs)
    reasons, read = quarantine_reasons(storage, cfg.topic_name, reason_files)
    return TopicDetail(
        overview=_overview(storage, cfg, recent),
        runs=recent,
        dates=files_per_date(storage, cfg),
        reasons=reasons,
        reason_files=read,
    )


def files_per_date(storage: Storage, cfg: TopicConfig) -> list[DateFiles]:
    """Partitioned and quarantine files per date (partitioned by the topic's folder format,
    quarantine by processing date), newest date first."""
    days: dict[date, DateFiles] = {}
    for kind in ("partitioned", "quarantine"):
        for key in storage.list(kind_folder(kind, cfg.topic_name)):
            data = parse_data_key(key)
            day = None if data is None else file_date(data, cfg.path_format)
            if data is None or day is None:  # not a data file, or of an earlier path format
                continue
            entry = days.setdefault(day, DateFiles(day=day))
            setattr(entry, kind, getattr(entry, kind) + 1)
            entry.sealed += data.sealed
    newest = sorted(days.values(), key=lambda d: d.day, reverse=True)
    for entry in [d for d in newest if d.sealed][:PROOFS_READ]:
        proof = read_proof(storage, cfg, entry.day)
        if proof is not None:
            entry.files_before, entry.snapshot_id = proof.files_before, proof.snapshot_id
            entry.table_records = proof.table_records
    return newest


def quarantine_reasons(
    storage: Storage, topic: str, max_files: int = REASON_FILES
) -> tuple[list[tuple[str, int]], int]:
    """Reasons of the newest `max_files` quarantine files by count (most frequent first), and
    how many files were read."""
    keys = [k for k in storage.list(kind_folder("quarantine", topic)) if parse_data_key(k)]
    newest = keys[-max_files:] if max_files > 0 else []
    counts: Counter[str] = Counter()
    for key in newest:
        for row in cast(Iterable[dict[str, Any]], fastavro.reader(io.BytesIO(storage.read(key)))):
            counts[row["reason"]] += 1
    return counts.most_common(), len(newest)


def _overview(storage: Storage, cfg: TopicConfig, recent: list[RunRecord]) -> TopicOverview:
    topic = cfg.topic_name
    token = commit.newest(storage, topic)
    last = recent[0] if recent else None
    oldest_first = list(reversed(recent))
    return TopicOverview(
        topic=topic,
        archive_root=cfg.root.storage_url,
        position=dict(token.next_offsets) if token else {},
        records_archived=sum(c.read for c in last.partition_totals.values()) if last else None,
        offset_lag=sum(last.offset_lag.values()) if last else None,
        time_lag_seconds=last.time_lag_seconds if last else None,
        offset_lag_trend=[sum(r.offset_lag.values()) for r in oldest_first],
        time_lag_trend=[r.time_lag_seconds for r in oldest_first if r.time_lag_seconds is not None],
        freshness=freshness.hour_quantiles(last.freshness, datetime.now(UTC)) if last else None,
        freshness_limit_seconds=limit.total_seconds() if (limit := cfg.freshness_limit) else None,
        last=last,
        quarantined=sum(r.counts.quarantined for r in recent),
        quarantine_ratio=run_record.quarantine_ratio(recent),
        last_complete=completeness.last_complete(storage, topic),
    )
