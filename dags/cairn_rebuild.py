"""One `rebuild__<topic>` DAG per configured JSON topic: re-derive dates from the backup.

A run (select → rebuild → commit → complete → announce) re-derives the records filed under its
dates (`partitioned/<topic>/dt=<date>/` and that date's quarantine) from the verbatim backup with
today's parser, schema and generation, and commits like an archive run (`cairn.protocol.commit`). It
runs only when a person asks: by a backfill (`airflow backfill create --dag-id rebuild__<topic>
--from-date … --to-date … --reprocess-behavior completed`, or the UI), by clearing earlier runs,
or by a trigger (UI or REST, with or without a logical date) whose `from_date`/`to_date` params
name a range to rebuild as one operation. The daily timetable exists so that backfills have
dates; the runs it schedules by itself (one per topic a day, and one for each new topic) skip at
*select*, which starts in the triggerer, so they start no worker process (and they give recent
dates a run, which a backfill's default reprocess behavior, `none`, skips).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn.pipeline import completeness, rebuild
from cairn.protocol import tokens
from cairn_airflow.assets import announce_dates, topic_asset
from cairn_airflow.dag_topics import misconfigured_run_dags, topic_doc, topics_to_build
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import storage
from cairn_airflow.operators.spark import CairnSparkOperator
from cairn_airflow.operators.step import Step
from cairn_airflow.step_result import pulled


def rebuild_dag(cfg: TopicConfig) -> DAG:
    topic = cfg.topic
    asset = topic_asset(topic)
    with DAG(
        dag_id=dag_id("rebuild", topic),
        dag_display_name=f"{topic} · rebuild",
        description=f"Re-derive dates of {topic}'s parsed output from the backup",
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone=cfg.timezone),
        start_date=datetime(2000, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args={"owner": "cairn", "retries": 2, "retry_delay": timedelta(minutes=1)},
        tags=["cairn", "rebuild"],
        params={
            "from_date": Param("", type="string", description="first date of a range (optional)"),
            "to_date": Param("", type="string", description="last date of a range (optional)"),
        },
        doc_md=topic_doc(cfg, "rebuild", __doc__),
    ) as dag:

        @task
        def commit(chosen: dict | str) -> dict:
            """Replace the dates' files by the re-derived ones (the one commit site)."""
            with fail_fast():
                token = rebuild.commit_rebuild(
                    storage(cfg), cfg, rebuild.Selection.model_validate(pulled(chosen))
                )
            return token.model_dump(mode="json", exclude={"adds", "replaces"}) | {
                "files_written": len(token.adds),
                "files_removed": len(token.replaces),
            }

        @task
        def complete(done: dict) -> dict:
            """Recount the complete dates the rebuild changed and rewrite their `_SUCCESS`."""
            token = tokens.token_at(storage(cfg), topic, done["seq"])
            with fail_fast():
                return completeness.rebuilt(cfg, storage(cfg), token).model_dump(mode="json")

        @task(outlets=[asset])
        def announce(done: dict) -> list[str]:
            """One asset event per changed complete date; skipped if none."""
            return announce_dates(asset, done)

        # starts in the triggerer: the daily runs the timetable schedules skip there
        chosen = Step(step="select", topic=topic).output
        spark = CairnSparkOperator(
            task_id="rebuild",
            job="rebuild",
            cfg=cfg,
            payload=chosen,
        )
        done = commit(chosen)
        spark >> done
        announce(complete(done))
    return dag


globals().update(
    {dag_id("rebuild", c.topic): rebuild_dag(c) for c in topics_to_build("rebuild") if c.parses}
    or misconfigured_run_dags("rebuild")  # a run in flight when its topic's entry broke
)
