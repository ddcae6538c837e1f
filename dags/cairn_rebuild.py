"""One `rebuild__<topic>` DAG per configured JSON topic: re-derive one date from the backup.

Each run re-derives `partitioned/<topic>/dt=<its date>/` and that date's quarantine from the
verbatim backup with today's parser, schema and generation. Daily data intervals, no catchup:
rebuild a date range by creating a backfill (`airflow backfill create --dag-id rebuild__<topic>
--from-date … --to-date …`, or the UI) or by clearing existing runs' tasks.
"""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, Param, get_current_context, task

from cairn import rebuild
from cairn.config import TopicConfig, dag_safe
from cairn_airflow import CairnSparkOperator, configured_topics, storage

log = logging.getLogger(__name__)


def rebuild_dag(cfg: TopicConfig) -> DAG:
    topic = cfg.topic
    with DAG(
        dag_id=f"rebuild__{dag_safe(topic)}",
        description=f"Re-derive one date of {topic}'s parsed output from the backup",
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone=cfg.timezone),
        start_date=datetime(2000, 1, 1),
        catchup=False,
        max_active_runs=1,  # two rebuilds of one date must not delete each other's files
        default_args={"owner": "cairn", "retries": 2, "retry_delay": timedelta(minutes=1)},
        tags=["cairn", "rebuild"],
        params={
            "margin_hours": Param(24, type="integer", minimum=0),
            "also_from": Param([], type="array", description="other dates records moved from"),
        },
        doc_md=__doc__,
    ) as dag:

        @task.short_circuit
        def select() -> dict | bool:
            context = get_current_context()
            day = context["data_interval_start"].in_timezone(cfg.timezone).date()
            params = context["params"]
            chosen = rebuild.select(
                storage(cfg),
                cfg,
                day,
                timedelta(hours=params["margin_hours"]),
                [date.fromisoformat(d) for d in params["also_from"]],
            )
            if chosen is None:
                log.info("topic %s was never archived: nothing to rebuild", topic)
                return False
            log.info("rebuilding %s %s from %d backup files", topic, day, len(chosen.sources))
            return chosen.model_dump(mode="json")

        @task
        def report() -> dict:
            day = get_current_context()["data_interval_start"].in_timezone(cfg.timezone).date()
            done = rebuild.newest_rebuild(storage(cfg), topic, day)
            return done.model_dump(mode="json", exclude={"files"}) | {"files": len(done.files)}

        chosen = select()
        spark = CairnSparkOperator(task_id="rebuild", job="rebuild", topic=topic, payload=chosen)
        chosen >> spark >> report()
    return dag


for _cfg in configured_topics():
    if _cfg.format == "json":
        globals()[f"rebuild__{dag_safe(_cfg.topic)}"] = rebuild_dag(_cfg)
