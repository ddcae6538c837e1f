"""Cairn's Airflow edge: connections → core objects, and the Spark archive operator.

The DAG files only wire tasks; what they need from Airflow (the Kafka, S3 and Spark connections)
is turned into plain values here, and all rules stay in the `cairn` package.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook

from cairn.config import REPO, TopicConfig, find_topic
from cairn.run import Planned
from cairn.storage import Storage, s3_options

KAFKA_CONN_ID = os.environ.get("CAIRN_KAFKA_CONN_ID", "cairn_kafka")
SPARK_CONN_ID = os.environ.get("CAIRN_SPARK_CONN_ID", "cairn_spark")
SPARK_JARS_DIR = Path(os.environ.get("CAIRN_JARS_DIR", REPO / ".cairn" / "jars")) / "spark"
ARCHIVE_JOB = REPO / "spark_jobs" / "archive.py"
TOPICS_VARIABLE = "cairn_kafka_topics"
"""Airflow Variable holding Kafka's topic names (JSON), refreshed by `cairn_discover_topics`."""


def bootstrap_servers() -> str:
    extra = BaseHook.get_connection(KAFKA_CONN_ID).extra_dejson
    servers = extra.get("bootstrap.servers")
    if not servers:
        raise ValueError(f"Airflow connection {KAFKA_CONN_ID!r} has no 'bootstrap.servers' extra")
    return servers


def storage_options(cfg: TopicConfig) -> dict[str, Any]:
    """fsspec options for the topic's archive root; S3 credentials from its Airflow connection."""
    root = cfg.root
    if root.scheme == "file":
        return {}
    conn = BaseHook.get_connection(root.conn_id)
    return s3_options(conn.login, conn.password, conn.extra_dejson)


def storage(cfg: TopicConfig) -> Storage:
    return Storage(cfg.root.storage_url, **storage_options(cfg))


class ArchiveOperator(SparkSubmitOperator):
    """Submit spark_jobs/archive.py for the planned run, through the Spark connection.

    Credentials are resolved when the task runs (never at DAG parse time) and reach the job as
    environment, not as arguments that would show in process listings and the Spark UI.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "planned")

    def __init__(self, *, topic: str, planned: Any, **kwargs: Any) -> None:
        super().__init__(
            application=str(ARCHIVE_JOB),
            conn_id=SPARK_CONN_ID,
            name=f"cairn-archive-{topic}",
            conf={"spark.ui.showConsoleProgress": "false"},
            **kwargs,
        )
        self.topic = topic
        self.planned = planned

    def execute(self, context: Any) -> None:
        jars = sorted(SPARK_JARS_DIR.glob("*.jar"))
        if not jars:
            raise FileNotFoundError(f"no Spark Kafka connector jars in {SPARK_JARS_DIR}")
        self.jars = ",".join(map(str, jars))
        cfg = find_topic(self.topic)
        planned = Planned.model_validate(self.planned)
        self.application_args = [
            "--planned",
            planned.model_dump_json(),
            "--bootstrap-servers",
            bootstrap_servers(),
        ]
        self.env_vars = {
            "CAIRN_STORAGE_OPTIONS": json.dumps(storage_options(cfg)),
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        super().execute(context)
