"""The steps of an archive run around its Spark job — clean, verify, commit, complete — each one
call into `cairn.pipeline`, written once for both places a step runs: the triggerer, where its
task starts (`cairn_airflow.triggers.step`: no worker process, no DAG file parsed), and a
worker, where it goes when that fails (`cairn_airflow.operators.step`). Each is safe to run
again: the commit protocol makes every step idempotent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from cairn.config import TopicConfig
from cairn.pipeline import archive_run, completeness
from cairn.protocol.manifest import VerifyReport
from cairn.topics_file import find_topic
from cairn_airflow.hooks.connections import kafka_conf, storage
from cairn_airflow.priority import remember_lag
from cairn_airflow.root_memory import remember_root
from cairn_airflow.stats import report_run

log = logging.getLogger(__name__)

Step = Literal["clean", "verify", "commit", "complete"]


def clean(cfg: TopicConfig, run_id: str, planned: dict) -> list[str]:
    """Discard what fenced-out attempts staged; rewound files stay until the commit."""
    return archive_run.clean_run(storage(cfg), archive_run.Planned.model_validate(planned))


def verify(cfg: TopicConfig, run_id: str, planned: dict) -> dict:
    report = archive_run.verify_run(storage(cfg), archive_run.Planned.model_validate(planned))
    return report.model_dump(mode="json")


def commit(cfg: TopicConfig, run_id: str, planned: dict, report: dict) -> dict:
    summary = archive_run.commit_run(
        cfg,
        storage(cfg),
        archive_run.Planned.model_validate(planned),
        VerifyReport.model_validate(report),
        kafka_conf(),
    )
    log.info("run summary: %s", summary.model_dump_json(indent=2))
    report_run(cfg, summary.seq)
    remember_lag(cfg.topic, summary.time_lag_seconds)
    remember_root(cfg)
    return summary.model_dump(mode="json")


def complete(cfg: TopicConfig, run_id: str) -> dict:
    """Write `_SUCCESS` into dates that became complete or changed (docs/table.md)."""
    done = completeness.complete_run(cfg, storage(cfg), kafka_conf(), run_id)
    return done.model_dump(mode="json")


STEPS: dict[Step, Callable[..., Any]] = {
    "clean": clean,
    "verify": verify,
    "commit": commit,
    "complete": complete,
}


def run(step: Step, topic: str, run_id: str, inputs: dict[str, Any]) -> Any:
    """`step` of `topic`'s run `run_id`, on its upstream tasks' results `inputs` (by name)."""
    return STEPS[step](find_topic(topic), run_id, **inputs)
