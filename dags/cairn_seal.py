"""One `seal__<topic>` DAG per topic that seals: a complete date becomes a few large files, its
partition of the topic's Iceberg table, and a proof of completeness (`cairn.pipeline.seal`).

A run per date the archive or rebuild DAG announces as complete or changed (the topic's asset,
one partition key per date): select → seal (Spark) → commit, *select* in the triggerer
(`cairn_airflow.steps.seal_select`). A date already sealed is sealed again only once its
unsealed part (late records, a rebuild) passes `reseal_files` or `reseal_mb`; otherwise the run
stops at select, with no worker process. Trigger it by hand with the `date` param to seal
a date now (asset-scheduled DAGs have no backfill).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param, PartitionedAssetTimetable, task

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn.table.catalog import SEALS_AT_ONCE
from cairn_airflow.assets import topic_asset
from cairn_airflow.dag_topics import misconfigured_run_dags, topic_doc, topics_to_build
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.catalog import catalog
from cairn_airflow.hooks.connections import storage
from cairn_airflow.operators.spark import CairnSparkOperator
from cairn_airflow.operators.step import Step
from cairn_airflow.step_result import pulled


def seal_dag(cfg: TopicConfig) -> DAG:
    topic = cfg.topic
    with DAG(
        dag_id=dag_id("seal", topic),
        dag_display_name=f"{topic} · seal",
        description=f"Seal the complete dates of {topic}",
        schedule=PartitionedAssetTimetable(assets=topic_asset(topic)),
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=SEALS_AT_ONCE,
        default_args={"owner": "cairn", "retries": 2},
        tags=["cairn", "seal"],
        params={"date": Param("", type="string", description="the date to seal (YYYY-MM-DD)")},
        doc_md=topic_doc(cfg, "seal", __doc__),
    ) as dag:

        @task
        def commit(chosen: dict | str) -> dict:
            """Commit the sealed files, replace the date in the table, write the proof."""
            from cairn.pipeline import seal
            from cairn.table import iceberg

            found = catalog()
            with fail_fast():
                proof = seal.finish_seal(
                    storage(cfg),
                    cfg,
                    seal.Selection.model_validate(pulled(chosen)),
                    iceberg.catalog_of(found) if found else None,
                )
            return proof.model_dump(mode="json", exclude={"partitions"})

        # in the triggerer: most seal runs stop at select (`steps.seal_select`)
        chosen = Step(step="seal_select", topic=topic, task_id="select").output
        spark = CairnSparkOperator(
            task_id="seal",
            job="seal",
            cfg=cfg,
            payload=chosen,
        )
        spark >> commit(chosen)
    return dag


globals().update(
    {dag_id("seal", c.topic): seal_dag(c) for c in topics_to_build("seal") if c.seals}
    or misconfigured_run_dags("seal")  # a run in flight when its topic's entry broke
)
