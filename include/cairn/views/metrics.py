"""Cairn's metrics, named once: what the commit task sends through Airflow's stats (StatsD or
OpenTelemetry) and what the plugin's Prometheus endpoint serves, from the same run records.

Every run metric is per topic, most per partition too (labels `topic`, `partition`); the config
metric is per topics file (label `file`). Gauges are the
state after the newest committed run; counters differ by source, as each protocol expects:
`run_samples` gives one run's increments (StatsD `incr`), `samples` the running totals kept in
the newest run record (a Prometheus counter; a restarted total reads as a counter reset).
Names are dotted as in StatsD; Prometheus renders dots as underscores (and adds `_total` to
counters).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from cairn.pipeline import freshness
from cairn.pipeline.run_record import RunRecord, TopicStatus
from cairn.protocol.tokens import Counts
from cairn.topics_file import LoadResult

Kind = Literal["gauge", "counter"]


class Sample(NamedTuple):
    """One value of one metric, with the labels that tell its series apart."""

    name: str
    kind: Kind
    value: float
    labels: dict[str, str]
    help: str


OFFSET_LAG = "cairn.offset_lag"
TIME_LAG = "cairn.time_lag_seconds"
RECORDS_ARCHIVED = "cairn.records_archived"
BYTES_ARCHIVED = "cairn.bytes_archived"
RECORDS_QUARANTINED = "cairn.records_quarantined"
RUN_DURATION = "cairn.run_duration_seconds"
LAST_COMMIT = "cairn.last_commit_timestamp_seconds"
QUARANTINE_RATIO = "cairn.quarantine_ratio"
FRESHNESS_P50 = "cairn.freshness_p50_seconds"
FRESHNESS_P95 = "cairn.freshness_p95_seconds"
CONFIG_ERRORS = "cairn.config_errors"

TIMINGS = frozenset({RUN_DURATION})
"""Gauges that StatsD receives as timers (in Prometheus, the newest run's value)."""

HELP = {
    OFFSET_LAG: "Records Kafka holds beyond the archive's committed position.",
    TIME_LAG: "Age in seconds of the oldest record not yet archived (0 when caught up).",
    RECORDS_ARCHIVED: "Records read from Kafka and committed to the archive.",
    BYTES_ARCHIVED: "Bytes of data files committed to the archive.",
    RECORDS_QUARANTINED: "Records committed to quarantine because they could not be parsed.",
    RUN_DURATION: "Seconds from planning a run to committing its token.",
    LAST_COMMIT: "When the newest token was committed, in Unix epoch seconds.",
    QUARANTINE_RATIO: "Records quarantined per record read over the recent runs.",
    FRESHNESS_P50: "Median seconds records committed in the last hour waited from Kafka.",
    FRESHNESS_P95: "95th percentile of the seconds records committed in the last hour waited.",
    CONFIG_ERRORS: "Mistakes in a topics file; the topics they describe are not archived.",
}

_COUNTERS = (
    (RECORDS_ARCHIVED, "read"),
    (BYTES_ARCHIVED, "bytes"),
    (RECORDS_QUARANTINED, "quarantined"),
)


def run_samples(record: RunRecord) -> list[Sample]:
    """What one committed run reports: gauges after it, counters by its own counts."""
    gauges = _gauges(record, record.committed_at)
    return gauges + _counters(record.topic, record.partition_counts, record)


def samples(status: TopicStatus, now: datetime | None = None) -> list[Sample]:
    """What a scrape at `now` (default: the clock) serves for a topic: gauges of its newest run
    (freshness over the hour before `now`), counters from running totals, and the quarantine
    ratio over its recent runs. Empty for a topic never run."""
    record = status.last
    if record is None:
        return []
    gauges = _gauges(record, now or datetime.now(UTC))
    found = gauges + _counters(record.topic, record.partition_totals, record)
    if status.quarantine_ratio is not None:
        found.append(_sample(QUARANTINE_RATIO, "gauge", status.quarantine_ratio, record.topic))
    return found


def config_samples(loaded: LoadResult) -> list[Sample]:
    """How many mistakes each topics file holds, every file listed (0 once fixed, so an alert on
    it resolves)."""
    per_file = Counter(e.file for e in loaded.errors)
    return [
        Sample(CONFIG_ERRORS, "gauge", float(per_file[f]), {"file": f}, HELP[CONFIG_ERRORS])
        for f in map(str, loaded.files)
    ]


def _gauges(record: RunRecord, now: datetime) -> list[Sample]:
    topic = record.topic
    found = [
        _sample(OFFSET_LAG, "gauge", lag, topic, p) for p, lag in sorted(record.offset_lag.items())
    ]
    if record.time_lag_seconds is not None:
        lags = record.partition_time_lag_seconds or {
            p: (record.time_lag_seconds if lag else 0.0) for p, lag in record.offset_lag.items()
        }
        found += [_sample(TIME_LAG, "gauge", lag, topic, p) for p, lag in sorted(lags.items())]
    found.append(_sample(RUN_DURATION, "gauge", record.duration_seconds, topic))
    found.append(_sample(LAST_COMMIT, "gauge", record.committed_at.timestamp(), topic))
    fresh = freshness.hour_quantiles(record.freshness, now)
    if fresh is not None:
        found.append(_sample(FRESHNESS_P50, "gauge", fresh[0], topic))
        found.append(_sample(FRESHNESS_P95, "gauge", fresh[1], topic))
    return found


def _counters(topic: str, counts: dict[int, Counts], record: RunRecord) -> list[Sample]:
    partitions = sorted(set(counts) | set(record.next_offsets))
    return [
        _sample(name, "counter", getattr(counts.get(p, Counts()), field), topic, p)
        for name, field in _COUNTERS
        for p in partitions
    ]


def _sample(
    name: str, kind: Kind, value: float, topic: str, partition: int | None = None
) -> Sample:
    labels = {"topic": topic}
    if partition is not None:
        labels["partition"] = str(partition)
    return Sample(name, kind, float(value), labels, HELP[name])
