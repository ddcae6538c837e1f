"""Secor's rule in the triggerer (`cairn.waiting`): a run fires when enough records wait beyond
what the position and the last firing cover, or the oldest has waited max_delay; never while idle,
at most two firings pending while the position stands still, and again if the runs never
commit."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import pytest

from cairn.config import TopicConfig
from cairn.schedule import completion_cron, topic_minute
from cairn.waiting import REREAD_CAP, WaitRule, Watch, waiting_records

RULE = WaitRule(min_records=100, max_delay=15.0)


def watching(position: dict[int, int]) -> Watch:
    watch = Watch(RULE)
    assert watch.needs_position({0: 1}, 0.0)  # never read yet
    watch.saw_position(position, 0.0)
    return watch


def test_an_empty_topic_asks_for_no_position_until_its_first_record():
    watch = Watch(RULE)
    assert not watch.needs_position({0: 0, 1: 0}, 0.0)
    assert not watch.due({0: 0, 1: 0}, 0.0)
    assert watch.needs_position({0: 1, 1: 0}, 5.0)


def test_an_idle_topic_never_fires_and_asks_for_nothing_but_its_offsets():
    watch = watching({0: 50, 1: 7})
    for second in range(0, 3600, 5):
        assert not watch.needs_position({0: 50, 1: 7}, float(second))
        assert not watch.due({0: 50, 1: 7}, float(second))


def test_a_few_records_fire_once_the_oldest_has_waited_max_delay():
    watch = watching({0: 50})
    assert not watch.due({0: 52}, 100.0)  # first seen at 100
    assert not watch.due({0: 53}, 114.0)
    assert watch.needs_position({0: 53}, 115.0)  # due: the position is read again first
    watch.saw_position({0: 50}, 115.0)
    assert watch.due({0: 53}, 115.0)


def test_enough_records_fire_at_once():
    watch = watching({0: 0, 1: 0})
    assert watch.due({0: 60, 1: 40}, 0.0)


def test_records_arriving_behind_a_firing_queue_one_run_behind_it_until_the_position_moves():
    watch = watching({0: 0})
    assert watch.due({0: 500}, 10.0)  # the first run reads at least these 500
    assert not watch.due({0: 520}, 12.0)  # 20 more, first seen at 12
    assert not watch.due({0: 530}, 26.0)
    assert watch.needs_position({0: 540}, 27.0)  # due: the position is read again first
    watch.saw_position({0: 0}, 27.0)
    assert watch.due({0: 540}, 27.0)  # queued behind the first run: they run back to back
    for second in range(30, 200, 5):  # two firings pending, the position still: no third
        if watch.needs_position({0: 540 + second}, float(second)):  # ever less often
            watch.saw_position({0: 0}, float(second))
        assert not watch.due({0: 540 + second}, float(second))
    watch.saw_position({0: 500}, 200.0)  # the first run committed; the second is running
    assert watch.due({0: 900}, 200.0)  # 360 records no firing covers


def test_a_pending_run_is_looked_for_only_when_its_commit_could_change_what_fires():
    """A run queued behind hundreds takes minutes. While no record waits beyond what its firing
    covers, a read could change nothing: its watch reads no group (until the run looks lost),
    but at the next poll after a commit made in the same process (`moved`)."""
    watch = watching({0: 0})
    assert watch.due({0: 500}, 0.0)
    for second in range(5, int(RULE.refire_after), 5):
        assert not watch.needs_position({0: 500}, float(second))
    assert watch.needs_position({0: 500}, 900.0, moved=True)  # a commit in this process


def test_firings_held_by_a_still_position_look_for_it_ever_less_often():
    """Two firings wait on the position (`AHEAD`) and records keep coming: only a move lets the
    next one fire, so the watch reads the group after max_delay, then twice as long each time it
    had not moved, up to REREAD_CAP; a move starts over."""
    watch = watching({0: 0})
    assert watch.due({0: 500}, 0.0)
    assert watch.due({0: 700}, 0.0)  # 200 more: a run queued behind the first
    reads = []
    for second in range(5, 900, 5):  # the position still
        if watch.needs_position({0: 700 + second}, float(second)):
            reads.append(second)
            watch.saw_position({0: 0}, float(second))
        assert not watch.due({0: 700 + second}, float(second))
    assert reads[:5] == [15, 45, 105, 225, 345]  # +15, +30, +60, +120, +120 (the cap)
    assert all(b - a == REREAD_CAP for a, b in pairwise(reads[3:]))
    assert watch.needs_position({0: 1600}, 900.0, moved=True)  # a commit in this process
    watch.saw_position({0: 500}, 900.0)  # it moved: max_delay again, once held
    assert watch.reread_after == RULE.max_delay
    assert watch.due({0: 1600}, 900.0)  # and the records beyond the firings fire


def test_a_firing_counts_the_next_records_from_their_arrival_not_from_the_first_wait():
    watch = watching({0: 0})
    assert not watch.due({0: 5}, 0.0)
    assert watch.due({0: 5}, 15.0)
    assert not watch.due({0: 6}, 20.0)  # first seen beyond the firing at 20
    watch.saw_position({0: 5}, 21.0)
    assert not watch.due({0: 6}, 34.0)
    assert watch.due({0: 6}, 35.0)


def test_a_topic_whose_runs_fail_fires_twice_then_waits_refire_after():
    watch = watching({0: 0})
    assert not watch.due({0: 5}, 0.0)
    assert watch.due({0: 5}, 15.0)
    assert not watch.due({0: 6}, 20.0)
    assert watch.due({0: 6}, 35.0)
    second = 35.0
    while second < 35.0 + RULE.refire_after:  # records keep coming; no run commits
        if watch.needs_position({0: int(second)}, second):
            watch.saw_position({0: 0}, second)
        assert not watch.due({0: int(second)}, second)
        second += 5.0
    assert watch.due({0: int(second)}, second)


def test_a_position_rewound_by_hand_is_waited_on_again_though_a_firing_covered_it():
    watch = watching({0: 300})
    assert watch.due({0: 500}, 0.0)
    watch.saw_position({0: 100}, 15.0)
    assert watch.due({0: 500}, 15.0)  # 400 waiting again


def test_a_run_that_never_commits_is_fired_again():
    watch = watching({0: 0})
    assert not watch.due({0: 5}, 0.0)
    assert watch.due({0: 5}, 15.0)
    assert not watch.due({0: 5}, 15.0 + RULE.refire_after - 1)
    assert watch.due({0: 5}, 15.0 + RULE.refire_after)


def test_a_run_that_commits_exactly_up_to_kafkas_end_leaves_the_topic_idle():
    watch = watching({0: 0})
    assert watch.due({0: 500}, 0.0)
    assert watch.needs_position({0: 500}, 15.0, moved=True)  # its commit, made here
    watch.saw_position({0: 500}, 15.0)
    assert not watch.needs_position({0: 500}, 100.0)
    assert not watch.due({0: 500}, 100.0)
    # its commit made elsewhere: unseen, and nothing fires, until the run looks lost
    unseen = watching({0: 0})
    assert unseen.due({0: 500}, 0.0)
    lost = RULE.refire_after
    assert not any(unseen.due({0: 500}, float(second)) for second in range(5, int(lost), 5))
    assert unseen.needs_position({0: 500}, lost)  # looked for before it fires again
    unseen.saw_position({0: 500}, lost)
    assert not unseen.due({0: 500}, lost)
    assert not unseen.needs_position({0: 500}, lost + 100.0)


def test_a_position_past_kafkas_end_fires_once_so_a_run_reports_the_recreated_topic():
    watch = watching({0: 900})
    assert watch.due({0: 3}, 0.0)
    assert not watch.due({0: 3}, 5.0)
    assert watch.due({0: 3}, RULE.refire_after)


def test_new_and_never_archived_partitions_count_from_zero():
    assert waiting_records({0: 10, 1: 5}, {0: 8}) == 7
    watch = watching({})
    assert watch.due({0: 150}, 0.0)


@pytest.mark.parametrize(("lateness", "hour"), [(60, 1), (90, 1), (0, 0), (24 * 60 + 30, 0)])
def test_the_completion_run_is_daily_past_the_lateness_at_the_topics_minute(lateness, hour):
    minute, cron = topic_minute("orders", 60), completion_cron("orders", lateness)
    offset = lateness + minute
    assert cron == f"{offset % 60} {offset // 60 % 24} * * *"
    assert int(cron.split()[1]) in (hour, hour + 1)


def entry(**settings) -> TopicConfig:
    return TopicConfig.model_validate({"topic": "orders", "format": "raw"} | settings)


def test_topics_run_when_records_wait_unless_they_give_a_schedule_or_keep_the_group_alone():
    assert entry().run_on == "records"
    assert entry().max_delay == timedelta(minutes=10)
    assert entry(max_delay="30s").max_delay == timedelta(seconds=30)
    assert entry(schedule="@hourly").run_on == "schedule"  # as before run_on existed
    assert entry(commit_consumer_group=False).run_on == "schedule"
    assert entry(schedule="@hourly", run_on="records").run_on == "records"
    with pytest.raises(ValueError, match="records needs commit_consumer_group"):
        entry(run_on="records", commit_consumer_group=False)
    with pytest.raises(ValueError, match="max_delay"):
        entry(max_delay="0s")
    assert entry(lateness=timedelta(minutes=61)).completion_schedule == completion_cron(
        "orders", 61
    )
    assert entry(lateness=None).completion_schedule is None
