"""One `archive__<topic>` DAG per configured topic: plan → clean → archive → verify → commit.

Only wiring: each task is one call into `cairn.run` (or the Spark job). Topics come from
include/topics.yaml; pattern entries are matched against the topic list that the
`cairn_discover_topics` DAG caches in the `cairn_kafka_topics` Variable, so parsing this file
never queries Kafka.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, get_current_context, task

from cairn import run
from cairn.config import TopicConfig, dag_safe
from cairn.manifest import VerifyReport
from cairn_airflow import (
    CairnSparkOperator,
    configured_topics,
    fail_fast,
    kafka_conf,
    storage,
)

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
    dag_id = f"archive__{dag_safe(topic)}"
    with DAG(
        dag_id=dag_id,
        description=f"Archive Kafka topic {topic} into {cfg.archive_root}",
        schedule=cfg.schedule,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["cairn", "archive"],
        doc_md=__doc__,
    ) as dag:

        @task.short_circuit
        def plan() -> dict | bool:
            run_id = get_current_context()["run_id"]
            with fail_fast():
                planned = run.plan_run(cfg, storage(cfg), kafka_conf(), run_id)
            if planned is None:
                log.info("topic %s: nothing new in Kafka; no Spark job, no token", topic)
                return False
            log.info("%s: reading %s", planned.claim.label, planned.plan.to_read)
            return planned.model_dump(mode="json")

        @task
        def clean(planned: dict) -> list[str]:
            with fail_fast():
                return run.clean_run(
                    cfg, storage(cfg), run.Planned.model_validate(planned), kafka_conf()
                )

        @task
        def verify(planned: dict) -> dict:
            with fail_fast():
                report = run.verify_run(storage(cfg), run.Planned.model_validate(planned))
            return report.model_dump(mode="json")

        @task
        def commit(planned: dict, report: dict) -> dict:
            with fail_fast():
                summary = run.commit_run(
                    cfg,
                    storage(cfg),
                    run.Planned.model_validate(planned),
                    VerifyReport.model_validate(report),
                    kafka_conf(),
                )
            log.info("run summary: %s", summary.model_dump_json(indent=2))
            return summary.model_dump(mode="json")

        @task.short_circuit
        def more_waiting(summary: dict) -> bool:
            """At the per-run cap: start the next run now instead of waiting for the schedule."""
            return summary["more_waiting"]

        planned = plan()
        archive = CairnSparkOperator(task_id="archive", job="archive", topic=topic, payload=planned)
        report = verify(planned)
        summary = commit(planned, report)
        clean(planned) >> archive >> report
        more_waiting(summary) >> TriggerDagRunOperator(
            task_id="drain_backlog", trigger_dag_id=dag_id
        )
    return dag


for _cfg in configured_topics():
    globals()[f"archive__{dag_safe(_cfg.topic)}"] = archive_dag(_cfg)
