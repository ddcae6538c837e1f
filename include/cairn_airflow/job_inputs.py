"""A Spark task's job input (`cairn.jobs`), resolved when the task starts: in a worker, or, for
an archive run, in the triggerer (`cairn_airflow.triggers.shared_archive`). Never at DAG parse
time: the settings come from the connections as they are now."""

from __future__ import annotations

import logging
from typing import Any, Literal

from cairn.config import TopicConfig
from cairn.jobs import ArchiveInput, JobInput, RebuildInput, SealInput
from cairn.protocol import commit
from cairn.protocol.plan import Plan
from cairn.topics_file import find_topic
from cairn_airflow.hooks.catalog import catalog
from cairn_airflow.hooks.connections import (
    kafka_conf,
    schema_registries,
    storage,
    storage_options,
)
from cairn_airflow.spark_artifact import code_artifact

log = logging.getLogger(__name__)

Job = Literal["archive", "rebuild", "seal"]


def resolve(job: Job, topic: str, payload: dict[str, Any]) -> tuple[TopicConfig, JobInput] | None:
    """The topic's entry and its job's input (`checked`, then `job_input`); None when the run
    only records a position (no Spark job)."""
    cfg = checked(topic, payload)
    return None if cfg is None else (cfg, job_input(job, cfg, payload))


def checked(topic: str, payload: dict[str, Any]) -> TopicConfig | None:
    """The topic's entry once the run's claim is checked; None when the run only records a
    position. A fenced-out attempt, or an entry broken since the run started, raises here,
    before any Spark work."""
    claim = commit.Claim.model_validate(payload["claim"])
    if "plan" in payload and Plan.model_validate(payload["plan"]).empty:
        log.info("%s only records a position: no Spark job", claim.label)
        return None
    cfg = find_topic(topic)
    commit.check_live(storage(cfg), claim)
    return cfg


def job_input(job: Job, cfg: TopicConfig, payload: dict[str, Any]) -> JobInput:
    """What the Spark job needs: the entry, the claim's key, the settings of the connections
    as they are now, and the code artifact's name."""
    common: dict[str, Any] = {
        "topic": cfg.snapshot(),
        "claim": commit.Claim.model_validate(payload["claim"]).key,
        "storage_options": storage_options(cfg, for_spark=True),
        "artifact": code_artifact().name,
    }
    if job == "archive":
        kafka = kafka_conf()
        kafka.spark_options()  # a setting Spark cannot use fails here, before any job
        return ArchiveInput(
            **common,
            kafka=kafka.settings,
            kafka_label=kafka.label,
            registries=schema_registries(cfg),
        )
    if job == "rebuild":
        return RebuildInput(**common, registries=schema_registries(cfg))
    from cairn.table import iceberg  # pyarrow and pyiceberg: only where a task needs them

    found = catalog()
    return SealInput(
        **common,
        table_options=iceberg.storage_options(found) if found else {},
        table_location=(payload.get("table") or {}).get("location"),
    )
