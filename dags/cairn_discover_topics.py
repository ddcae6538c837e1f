"""`cairn_discover_topics`: cache Kafka's topic names for pattern entries in include/topics.yaml.

The archive DAG file matches patterns against this cached list instead of asking Kafka while
Airflow parses DAG files; a new topic gets its DAG at the next parse after this DAG has run.
"""

from __future__ import annotations

import json
from datetime import datetime

from airflow.sdk import DAG, Variable, task

from cairn.kafka import cluster
from cairn_connections import kafka_conf
from cairn_dags import TOPICS_VARIABLE
from cairn_failures import fail_fast

with DAG(
    dag_id="cairn_discover_topics",
    description="Cache Kafka's topic list for topic patterns",
    schedule="*/5 * * * *",
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["cairn"],
    doc_md=__doc__,
):

    @task
    def discover() -> list[str]:
        with fail_fast():
            names = cluster.list_topic_names(kafka_conf())
        Variable.set(TOPICS_VARIABLE, json.dumps(names))
        return names

    discover()
