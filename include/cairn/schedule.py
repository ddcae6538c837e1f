"""When a topic's archive runs, and which topic's Spark job goes first when slots are scarce.

A deployment carries hundreds of topics, most with the same `*/10 * * * *`. Fired together they
would all plan, then all queue for Spark in the same second. `spread` gives each topic a stable
minute offset inside its interval, derived from the topic's name with blake2b (never Python's
`hash()`, which changes with every interpreter), so the fleet's runs are spread evenly and a
topic keeps its minute across restarts and machines. It only touches schedules whose frequency
the offset cannot change: a minute field `*/N` with N dividing 60, and Airflow's presets that fire
at minute 0 (`@hourly`, `@daily`…). Any other cron names its minute on purpose and is kept.

`lag_weight` is the priority an archive Spark task gets from the time lag its topic's last run
left: the further behind, the sooner it gets a slot of the Spark pool.
"""

from __future__ import annotations

import hashlib

# Presets whose minute Airflow fixes at 0, as five-field crons.
_PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

MAX_LAG_WEIGHT = 1_000_000
"""Cap of `lag_weight` (almost two years of lag, in minutes): Airflow stores weights as 32-bit."""


def topic_minute(topic: str, period: int) -> int:
    """A minute in `[0, period)` fixed by the topic's name alone: the same on every machine."""
    digest = hashlib.blake2b(topic.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % period


def spread(cron: str, topic: str) -> str:
    """`cron` with the topic's minute offset where that keeps its frequency, else unchanged.

    `*/10 * * * *` becomes e.g. `7-59/10 * * * *` (minutes 7, 17, … 57), `@hourly` becomes
    `7 * * * *`, `@daily` `7 0 * * *`. The other fields are kept as written.
    """
    fields = _PRESETS.get(cron, cron).split()
    if len(fields) != 5:  # @continuous, or not a cron at all
        return cron
    minute = fields[0]
    if cron in _PRESETS:
        fields[0] = str(topic_minute(topic, 60))
    elif minute.startswith("*/") and minute[2:].isdigit():
        period = int(minute[2:])
        if period < 2 or 60 % period:  # every minute, or a step that wraps unevenly at :60
            return cron
        offset = topic_minute(topic, period)
        if offset == 0:
            return cron
        fields[0] = f"{offset}-59/{period}"
    else:
        return cron
    return " ".join(fields)


def lag_weight(time_lag_seconds: float | None) -> int:
    """Priority weight for a topic whose last run left this time lag: whole minutes of lag
    (0 when unknown or caught up), capped at `MAX_LAG_WEIGHT`."""
    if time_lag_seconds is None or time_lag_seconds != time_lag_seconds or time_lag_seconds < 0:
        return 0
    return min(int(time_lag_seconds // 60), MAX_LAG_WEIGHT)


def completion_cron(topic: str, lateness_minutes: int) -> str:
    """A daily cron just past the end of a date plus its lateness, at the topic's own minute:
    the run that lets an idle topic's dates become complete (`cairn.pipeline.completeness`)
    when no record starts one. A lateness of a day or more lands on a later day's run."""
    offset = lateness_minutes + topic_minute(topic, 60)
    return f"{offset % 60} {offset // 60 % 24} * * *"
