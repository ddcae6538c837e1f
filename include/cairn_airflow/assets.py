"""A topic's Airflow asset and its events: one per date that became complete
(docs/table.md, Complete dates), the date as the event's partition key."""

from __future__ import annotations

from airflow.sdk import Asset, get_current_context
from airflow.sdk.exceptions import AirflowSkipException

from cairn.pipeline import completeness


def topic_asset(topic: str) -> Asset:
    """The asset whose events announce `topic`'s complete dates."""
    return Asset(completeness.asset_name(topic))


def announce_dates(asset: Asset, done: dict) -> list[str]:
    """Emit one event of `asset` per date `done` (a `Completion`) marked, the date as partition
    key; skip the task when there is none, so no event without a date is ever emitted."""
    keys = completeness.Completion.model_validate(done).partition_keys
    if not keys:
        raise AirflowSkipException("no date became complete or changed")
    events = get_current_context()["outlet_events"][asset]
    events.add_partitions(keys)
    events.extra = {"topic": done["topic"], "complete_through": done["through"]}
    return keys
