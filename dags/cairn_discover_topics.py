"""`cairn_discover_topics`: cache Kafka's topic names for pattern entries in include/topics.yaml.

The archive DAG file matches patterns against this cached list instead of asking Kafka while
Airflow parses DAG files. So a new topic that matches a pattern waits for discovery, every five
minutes, then gets its DAGs at once: when the topics the patterns match change, the DAG processor
is told to parse the topic DAG files again (`cairn_airflow.dag_parse`). It is archived from the
first run of its archive DAG; an exact `topic:` entry does not wait for discovery.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, get_current_context, task

from cairn.kafka import cluster
from cairn_airflow.dag_parse import dag_folder
from cairn_airflow.dag_topics import DISCOVERY_SCHEDULE, remember_topic_names
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import kafka_conf

with DAG(
    dag_id="cairn_discover_topics",
    description="Cache Kafka's topic list for topic patterns",
    schedule=DISCOVERY_SCHEDULE,
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
        remember_topic_names(names, dag_folder(get_current_context()))
        return names

    discover()
