"""One `archive__<topic>` DAG per configured topic: plan → clean → archive → verify → commit →
check_health, and complete → announce (the dates that became complete, as asset events).

Only wiring: each task is one call into `cairn.pipeline.archive_run` (or the Spark job). The
archive task and the steps around it (clean, verify, commit, complete: `ArchiveStep`) start in
the triggerer, not on a worker; plan, check_health, announce and more_waiting run on workers.
Topics come from include/topics.yaml; pattern entries are matched against the topic list that
the `cairn_discover_topics` DAG caches in the `cairn_kafka_topics` Variable, so parsing this
file never queries Kafka.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, TriggerRule, get_current_context, task

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn.pipeline import archive_run
from cairn_airflow.assets import announce_dates, archive_schedule, archive_start, topic_asset
from cairn_airflow.dag_topics import misconfigured_run_dags, topic_doc, topics_to_build
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import kafka_conf, storage
from cairn_airflow.notifications.notifier import archive_deadline, check_health, notifier
from cairn_airflow.operators.spark import CairnSparkOperator
from cairn_airflow.operators.step import ArchiveStep
from cairn_airflow.priority import LAG_FIRST, remember_lag
from cairn_airflow.root_memory import earlier_roots

log = logging.getLogger(__name__)

DEFAULT_ARGS = {
    "owner": "cairn",
    "retries": 3,
    "retry_delay": timedelta(seconds=20),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}


def archive_dag(cfg: TopicConfig) -> DAG:
    topic = cfg.topic
    asset = topic_asset(topic)
    with DAG(
        dag_id=dag_id("archive", topic),
        dag_display_name=f"{topic} · archive",
        description=f"Archive Kafka topic {topic} into {cfg.archive_root}",
        schedule=archive_schedule(cfg),
        start_date=archive_start(cfg),
        catchup=False,
        max_active_runs=1,
        default_args={**DEFAULT_ARGS, "on_failure_callback": notifier()},
        deadline=archive_deadline(cfg),
        tags=["cairn", "archive"],
        doc_md=topic_doc(cfg, "archive", __doc__),
    ) as dag:

        @task.short_circuit(ignore_downstream_trigger_rules=False)
        def plan() -> dict | bool:
            """Skips only its direct downstream tasks when nothing is new: `complete` still
            runs, so idle partitions do not hold dates back."""
            run_id = get_current_context()["run_id"]
            with fail_fast():
                planned = archive_run.plan_run(
                    cfg, storage(cfg), kafka_conf(), run_id, lambda: earlier_roots(cfg)
                )
            if planned is None:
                log.info("topic %s: nothing new in Kafka; no Spark job, no token", topic)
                remember_lag(topic, 0.0)
                return False
            log.info("%s: reading %s", planned.claim.label, planned.plan.to_read)
            return planned.model_dump(mode="json")

        @task(task_id="check_health", retries=0)
        def health(summary: dict) -> list[str]:
            """Fail, calling the notifier, if the topic is past max_time_lag or
            max_quarantine_ratio (docs/operating.md, Alerts)."""
            return check_health(cfg)

        @task(outlets=[asset])
        def announce(done: dict) -> list[str]:
            """One asset event per date, the date as its partition key; skipped if none."""
            return announce_dates(asset, done)

        @task.short_circuit
        def more_waiting(summary: dict) -> bool:
            """At the per-run cap: start the next run now instead of waiting for the schedule."""
            return summary["more_waiting"]

        planned = plan()
        archive = CairnSparkOperator(
            task_id="archive",
            job="archive",
            cfg=cfg,
            payload=planned,
            weight_rule=LAG_FIRST,  # the most lagging topic's job first (cairn_airflow.priority)
        )
        report = ArchiveStep(step="verify", topic=topic, inputs={"planned": planned})
        summary = ArchiveStep(
            step="commit", topic=topic, inputs={"planned": planned, "report": report.output}
        )
        ArchiveStep(step="clean", topic=topic, inputs={"planned": planned}) >> archive >> report
        done = ArchiveStep(step="complete", topic=topic, trigger_rule=TriggerRule.NONE_FAILED)
        summary >> done
        announce(done.output)
        health(summary.output)
        more_waiting(summary.output) >> TriggerDagRunOperator(
            task_id="drain_backlog", trigger_dag_id=dag.dag_id
        )
    return dag


globals().update(
    {dag_id("archive", c.topic): archive_dag(c) for c in topics_to_build("archive")}
    or misconfigured_run_dags("archive")  # a run in flight when its topic's entry broke
)
