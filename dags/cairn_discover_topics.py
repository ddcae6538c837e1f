"""`cairn_discover_topics`: cache Kafka's topic names for pattern entries in include/topics.yaml.

The archive DAG file matches patterns against this cached list instead of asking Kafka while
Airflow parses DAG files. So a new topic that matches a pattern waits for discovery, every five
minutes, then gets its DAGs at the DAG processor's next parse of the DAG files, and is archived
from the first run of its archive DAG; an exact `topic:` entry does not wait for discovery.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

from airflow.sdk import DAG, Variable, task

from cairn.kafka import cluster
from cairn_airflow.dag_topics import (
    DISCOVERY_DELAY,
    DISCOVERY_SCHEDULE,
    TOPICS_VARIABLE,
    pattern_topics,
)
from cairn_airflow.failures import fail_fast
from cairn_airflow.hooks.connections import kafka_conf

log = logging.getLogger(__name__)

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
        before = set(pattern_topics(json.loads(Variable.get(TOPICS_VARIABLE, default="[]"))))
        Variable.set(TOPICS_VARIABLE, json.dumps(names))
        new = [t for t in pattern_topics(names) if t not in before]
        if new:
            log.info(
                "new topics matching a pattern entry: %s; their DAGs appear at the DAG "
                "processor's next parse (topics matching a pattern wait up to %s for this DAG)",
                ", ".join(new),
                DISCOVERY_DELAY,
            )
        return names

    discover()
