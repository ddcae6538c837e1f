"""Alerts: when a topic's archive needs a person, decided from its run records.

Three limits per topic (`max_time_lag`, `max_freshness`, `max_quarantine_ratio` in topics.yaml).
Freshness is how long the records committed in the last hour waited from Kafka (p95,
`cairn.pipeline.freshness`): a topic archived too late alerts even while it keeps up. Time lag
is the age of the oldest record Kafka holds that the archive has not committed, 0 once caught up: a
topic that stops receiving data is therefore never an alert, and a topic that Cairn stops
archiving always becomes one. The quarantine ratio is taken over the recent runs, so one bad
record in a quiet hour does not page anyone while a parser that rejects a steady share does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from cairn.config import TopicConfig
from cairn.pipeline import freshness
from cairn.pipeline.run_record import TopicStatus


class Breach(NamedTuple):
    """A limit a topic is past: what, by how much, and which setting to look at."""

    topic: str
    what: str
    value: float
    limit: float
    setting: str

    def __str__(self) -> str:
        return (
            f"topic {self.topic!r}: {self.what} is {self.value:g}, over its limit {self.limit:g} "
            f"({self.setting} in topics.yaml)"
        )


def breaches(cfg: TopicConfig, status: TopicStatus, now: datetime | None = None) -> list[Breach]:
    """The limits `status` breaches; empty when the topic is healthy or has never run.

    An unknown time lag (Kafka did not answer after the commit) is no evidence either way, nor is
    freshness without records committed in the hour before `now` (default: the clock).
    """
    now = now or datetime.now(UTC)
    found = []
    last = status.last
    limit = cfg.max_time_lag.total_seconds()
    if last is not None and last.time_lag_seconds is not None and last.time_lag_seconds > limit:
        found.append(
            Breach(status.topic, "time lag (seconds)", last.time_lag_seconds, limit, "max_time_lag")
        )
    fresh = freshness.hour_quantiles(last.freshness, now) if last else None
    limit_fresh = cfg.freshness_limit
    if fresh is not None and limit_fresh is not None and fresh[1] > limit_fresh.total_seconds():
        found.append(
            Breach(
                status.topic,
                "p95 freshness over the last hour (seconds)",
                round(fresh[1], 1),
                limit_fresh.total_seconds(),
                "max_freshness",
            )
        )
    ratio = status.quarantine_ratio
    if ratio is not None and ratio > cfg.max_quarantine_ratio:
        found.append(
            Breach(
                status.topic,
                f"quarantine ratio over the last {len(status.recent)} runs",
                ratio,
                cfg.max_quarantine_ratio,
                "max_quarantine_ratio",
            )
        )
    return found
