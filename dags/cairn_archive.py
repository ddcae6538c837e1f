"""One `archive__<topic>` DAG per configured topic: plan → archive (clean beside it) → verify →
commit → check_health, and complete → announce (the dates that became complete, as asset
events).

Only wiring: each task is one call into `cairn.pipeline.archive_run` (or the Spark job). Every
task but `drain_backlog` starts in the triggerer, not on a worker: the archive task and the
steps around it (`Step`, `cairn_airflow.steps`); a worker takes one only to finish what the
triggerer cannot (a failure, a Spark job of its own, asset events to emit).
Topics come from include/topics.yaml; pattern entries are matched against the topic list that
the `cairn_discover_topics` DAG caches in the `cairn_kafka_topics` Variable, so parsing this
file never queries Kafka.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, TriggerRule

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn_airflow.assets import archive_schedule, archive_start, topic_asset
from cairn_airflow.dag_topics import misconfigured_run_dags, topic_doc, topics_to_build
from cairn_airflow.notifications.notifier import archive_deadline, notifier
from cairn_airflow.operators.spark import CairnSparkOperator
from cairn_airflow.operators.step import Step
from cairn_airflow.priority import LAG_FIRST

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
        planned = Step(step="plan", topic=topic)
        archive = CairnSparkOperator(
            task_id="archive",
            job="archive",
            cfg=cfg,
            payload=planned.output,
            weight_rule=LAG_FIRST,  # the most lagging topic's job first (cairn_airflow.priority)
        )
        report = Step(step="verify", topic=topic, inputs={"planned": planned.output})
        summary = Step(
            step="commit",
            topic=topic,
            inputs={"planned": planned.output, "report": report.output},
        )
        # clean only removes what fenced-out attempts left, so it runs beside the Spark job
        [Step(step="clean", topic=topic, inputs={"planned": planned.output}), archive] >> report
        done = Step(step="complete", topic=topic, trigger_rule=TriggerRule.NONE_FAILED)
        summary >> done
        Step(step="announce", topic=topic, inputs={"done": done.output}, outlets=[asset])
        # check_health fails (and calls the notifier) on a breach: retrying would not heal it;
        # it reads the topic's status, not the summary (one request fewer in the triggerer)
        summary >> Step(step="check_health", topic=topic, retries=0)
        Step(
            step="more_waiting", topic=topic, inputs={"summary": summary.output}
        ) >> TriggerDagRunOperator(task_id="drain_backlog", trigger_dag_id=dag.dag_id)
    return dag


globals().update(
    {dag_id("archive", c.topic): archive_dag(c) for c in topics_to_build("archive")}
    or misconfigured_run_dags("archive")  # a run in flight when its topic's entry broke
)
