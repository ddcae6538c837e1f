"""`cairn_config_watch`: every five minutes, check the topics files and alert on a mistake.

Its one task, `check` (`cairn_airflow.notifications.notifier.check_config`), fails while a
topics file has a mistake, naming file, line, entry and field, and calls the configured
notifier when the mistakes change. The Airflow UI shows the same mistakes as the import error
of `cairn_config_check.py`. When a topics file changed since the topic DAG files were last
parsed, it first has the DAG processor parse them again (`cairn_airflow.dag_parse`).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

from cairn_airflow.dag_parse import parse_if_topics_changed
from cairn_airflow.dag_topics import DISCOVERY_SCHEDULE
from cairn_airflow.notifications.notifier import check_config

with DAG(
    dag_id="cairn_config_watch",
    description="Alert on mistakes in the topics files",
    schedule=DISCOVERY_SCHEDULE,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["cairn"],
    doc_md=__doc__,
):

    @task(retries=0)
    def check() -> list[str]:
        context = get_current_context()
        parse_if_topics_changed(context)
        return check_config(context)

    check()
