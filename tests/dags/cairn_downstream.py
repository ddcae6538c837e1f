"""A downstream DAG as a user writes one: one run per complete date of a Cairn topic.

Cairn's archive DAG emits an event of the asset `cairn.<topic>` for every date that becomes
complete (and again when late records or a rebuild change it), with the date as the event's
partition key; `PartitionedAssetTimetable` starts one run per key. The test stack loads this
folder as a DAG bundle of its own (`StackSettings.extra_dag_folders`).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, PartitionedAssetTimetable, get_current_context, task

with DAG(
    dag_id="downstream__e2e_complete",
    schedule=PartitionedAssetTimetable(assets=Asset("cairn.e2e.complete")),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["cairn", "example"],
):

    @task
    def use_date() -> str:
        """Read the complete date's folder here, e.g. partitioned/e2e.complete/dt=<date>/."""
        return get_current_context()["dag_run"].partition_key

    use_date()
