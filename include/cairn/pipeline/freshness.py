"""Freshness: how long records waited from Kafka to the archive, p50 and p95 over the last hour.

A committed run knows when it committed and, from Kafka, the timestamps of the first and the
last record it read in each partition: its records waited between `commit - last` and
`commit - first`. A `Span` keeps that per run, counting the records read, and assumes them
spread evenly between the two (the rule a record-by-record histogram would refine, at the cost
of reading every timestamp). Each run record carries the spans of the hour before it
(`window`), so a page or a scrape reads one record per topic, however many runs the hour held.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel

WINDOW = timedelta(hours=1)


class Span(BaseModel):
    """One run's records: how many, and the least and most any of them waited (seconds)."""

    committed_at: datetime
    records: int
    low: float
    high: float


def run_span(
    committed_at: datetime,
    planned_at: datetime,
    read: dict[int, int],
    first: dict[int, int],
    last: dict[int, int],
) -> Span | None:
    """The span of a run planned at `planned_at` that read `read` records per partition, whose
    first and last records Kafka timestamped `first` and `last` (millis). A partition without a
    first timestamp is left out; one without a last (its range ends in transaction markers)
    counts its newest record as arrived when the run was planned, as it did at the latest.
    None when the run read nothing that was timestamped."""
    parts = [p for p, n in read.items() if n > 0 and p in first]
    if not parts:
        return None
    at, planned = committed_at.timestamp() * 1000, planned_at.timestamp() * 1000
    waits = [(at - last.get(p, planned)) / 1000 for p in parts] + [
        (at - first[p]) / 1000 for p in parts
    ]
    return Span(
        committed_at=committed_at,
        records=sum(read[p] for p in parts),
        low=max(0.0, min(waits)),
        high=max(0.0, max(waits)),
    )


def window(span: Span | None, earlier: list[Span], now: datetime) -> list[Span]:
    """`span` and the `earlier` spans committed within `WINDOW` before `now`, oldest first."""
    kept = [s for s in earlier if now - s.committed_at <= WINDOW]
    return kept + ([span] if span is not None else [])


def hour_quantiles(spans: list[Span], now: datetime) -> tuple[float, float] | None:
    """p50 and p95 of the waits of the records committed in the hour before `now`; None when
    none was (an idle topic has no freshness to speak of, and no alert)."""
    recent = window(None, spans, now)
    p50, p95 = quantile(recent, 0.5), quantile(recent, 0.95)
    return None if p50 is None or p95 is None else (p50, p95)


def quantile(spans: list[Span], q: float) -> float | None:
    """The wait that a share `q` of the spans' records did not exceed; None without records."""
    total = sum(s.records for s in spans)
    if not total:
        return None
    lo, hi = min(s.low for s in spans), max(s.high for s in spans)
    for _ in range(60):  # bisect the mixture's distribution function
        mid = (lo + hi) / 2
        if _below(spans, mid) / total < q:
            lo = mid
        else:
            hi = mid
    return hi


def _below(spans: list[Span], wait: float) -> float:
    """Records that waited at most `wait`, spread evenly within each span."""
    found = 0.0
    for s in spans:
        if wait >= s.high:
            found += s.records
        elif wait > s.low:
            found += s.records * (wait - s.low) / (s.high - s.low)
    return found
