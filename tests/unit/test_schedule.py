"""Many topics on one deployment: schedules spread by topic keep their frequency, the offset is
stable (not Python's salted hash), and the priority weight grows with the lag."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from croniter import croniter

from cairn.schedule import MAX_LAG_WEIGHT, lag_weight, spread, topic_minute


def fire_minutes(cron: str, hours: int = 3) -> list[datetime]:
    """When `cron` fires in the first `hours` hours of 2024-05-01 (UTC)."""
    it = croniter(cron, datetime(2024, 5, 1, tzinfo=UTC) - timedelta(seconds=1))
    found = []
    while (at := it.get_next(datetime)) < datetime(2024, 5, 1, hours, tzinfo=UTC):
        found.append(at)
    return found


@pytest.mark.parametrize("period", [2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60])
def test_a_step_dividing_the_hour_keeps_its_frequency_and_shifts_inside_the_interval(period):
    cron = f"*/{period} * * * *"
    for topic in ("orders", "payments.eu", "clicks", "x"):
        spread_cron = spread(cron, topic)
        assert croniter.is_valid(spread_cron), spread_cron
        times = fire_minutes(spread_cron)
        assert len(times) == len(fire_minutes(cron))  # the same number of runs
        gaps = {(b - a).total_seconds() for a, b in pairwise(times)}
        assert gaps <= {period * 60.0}  # evenly spaced, also across the hour
        assert times[0].minute == topic_minute(topic, period)


def test_the_fleet_is_spread_over_the_interval():
    topics = [f"orders.{i}" for i in range(300)]
    minutes = Counter(fire_minutes(spread("*/10 * * * *", t), hours=1)[0].minute for t in topics)
    assert set(minutes) == set(range(10))  # every minute of the interval is used
    assert max(minutes.values()) < 60  # ~30 each, none near the 300 a shared minute would take


def test_the_offset_is_stable_across_interpreters():
    """blake2b, not hash(): another process (another PYTHONHASHSEED) finds the same minute."""
    code = "from cairn.schedule import spread; print(spread('*/10 * * * *', 'orders.eu'))"
    other = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": "include"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other == spread("*/10 * * * *", "orders.eu")
    assert spread("*/10 * * * *", "orders.eu") == "7-59/10 * * * *"  # pinned: a change moves it


def test_other_fields_are_kept():
    assert spread("*/15 8-18 * * 1-5", "orders").split()[1:] == ["8-18", "*", "*", "1-5"]


@pytest.mark.parametrize(
    ("preset", "rest"),
    [
        ("@hourly", "* * * *"),
        ("@daily", "0 * * *"),
        ("@weekly", "0 * * 0"),
        ("@monthly", "0 1 * *"),
        ("@yearly", "0 1 1 *"),
    ],
)
def test_presets_at_minute_zero_get_the_topics_minute(preset, rest):
    assert spread(preset, "orders") == f"{topic_minute('orders', 60)} {rest}"


@pytest.mark.parametrize(
    "cron",
    [
        "* * * * *",  # every minute: nothing to spread
        "*/1 * * * *",
        "*/7 * * * *",  # 7 does not divide 60: a shift would change the gap at the hour
        "*/45 * * * *",
        "0 * * * *",  # a minute written out is meant
        "5,35 * * * *",
        "3-59/10 * * * *",
        "@continuous",
    ],
)
def test_crons_whose_minute_is_meant_or_cannot_move_are_left_alone(cron):
    assert spread(cron, "orders") == cron


def test_an_offset_of_zero_keeps_the_cron_as_written():
    topic = next(t for t in (f"t{i}" for i in range(100)) if topic_minute(t, 10) == 0)
    assert spread("*/10 * * * *", topic) == "*/10 * * * *"


@pytest.mark.parametrize(
    ("lag", "weight"),
    [
        (None, 0),
        (float("nan"), 0),
        (-5.0, 0),
        (0.0, 0),
        (59.9, 0),
        (60.0, 1),
        (3600.0, 60),
        (1e12, MAX_LAG_WEIGHT),
    ],
)
def test_lag_weight_is_whole_minutes_of_lag_capped(lag, weight):
    assert lag_weight(lag) == weight
