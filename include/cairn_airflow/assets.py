"""A topic's Airflow assets: its complete dates, one event per date that became complete
(docs/table.md, Complete dates), the date as the event's partition key; and its waiting records,
watched in the triggerer, which schedule the archive DAG of a `run_on: records` topic."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import (
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    CronTriggerTimetable,
    get_current_context,
)
from airflow.sdk.exceptions import AirflowSkipException

from cairn.config import TopicConfig
from cairn_airflow.failures import NeedsWorker
from cairn_airflow.triggers.waiting_records import WaitingRecordsTrigger


def topic_asset(topic: str) -> Asset:
    """The asset whose events announce `topic`'s complete dates: `cairn.<topic>`."""
    return Asset(f"cairn.{topic}")


def waiting_asset(cfg: TopicConfig) -> Asset:
    """The asset whose events say records wait in the topic: a `WaitingRecordsTrigger` watches
    it. `:` cannot be in a topic's name, so no topic's other asset can take this name."""
    topic = cfg.topic_name
    trigger = WaitingRecordsTrigger(
        topic=topic,
        group=cfg.group_id,
        min_records=cfg.min_records,
        max_delay=cfg.max_delay.total_seconds(),
    )
    name = f"cairn.waiting:{topic}"
    return Asset(name=name, uri=name, watchers=[AssetWatcher(name=name, trigger=trigger)])


def archive_schedule(cfg: TopicConfig) -> str | AssetOrTimeSchedule | Asset:
    """`run_on: schedule`: the topic's cron. `run_on: records`: its waiting records, or the daily
    run that completes its dates when it is idle (`TopicConfig.completion_schedule`)."""
    if cfg.run_on == "schedule":
        return cfg.archive_schedule
    waiting = waiting_asset(cfg)
    if cfg.completion_schedule is None:
        return waiting
    # Never the latest past time at once, so a new topic waits for its records or its next
    # completion time: run_immediately=False would run it if recent (Airflow 3.3 reads False
    # like None); a zero buffer never does.
    daily = CronTriggerTimetable(
        cfg.completion_schedule, timezone=cfg.timezone, run_immediately=timedelta(0)
    )
    return AssetOrTimeSchedule(timetable=daily, assets=waiting)


def archive_start(cfg: TopicConfig) -> datetime | None:
    """The archive DAG's start date: none for `run_on: records`, so a new topic waits for its
    records (or its next completion time) instead of running the daily completion run at once
    (with a start date, Airflow runs a cron's latest past time at once whatever
    `run_immediately` says)."""
    return None if cfg.run_on == "records" else datetime(2024, 1, 1)


def announce_dates(asset: Asset, done: dict) -> list[str]:
    """Emit one event of `asset` per date `done` (a `Completion`) marked, the date as partition
    key; skip the task when there is none, so no event without a date is ever emitted (in the
    triggerer too: only a task with dates to announce needs a worker)."""
    from cairn.pipeline.completeness import Completion  # numpy and pyarrow: not at parse time

    keys = Completion.model_validate(done).partition_keys
    if not keys:
        raise AirflowSkipException("no date became complete or changed")
    try:
        context = get_current_context()
    except RuntimeError as err:  # the triggerer's thread: no task, no outlet events
        raise NeedsWorker(f"{len(keys)} date(s) to announce as asset events") from err
    events = context["outlet_events"][asset]
    events.add_partitions(keys)
    events.extra = {"topic": done["topic"], "complete_through": done["through"]}
    return keys
