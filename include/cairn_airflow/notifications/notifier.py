"""When a topic needs a person: the configured notifier, the run deadline, the health check and
the config check.

Four things call the notifier (`CAIRN_NOTIFIER`, docs/operating.md "Alerts"): an archive task
that failed for good, an archive run still unfinished `max_run_duration` after it was queued (an
Airflow Deadline Alert), the `check_health` task, which fails when the topic is past one of its
limits (`cairn.views.alerts`), and `check_config`, when the topics files gain a mistake.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from airflow.sdk import DeadlineAlert, DeadlineReference, SyncCallback, Variable
from airflow.sdk.exceptions import AirflowFailException
from airflow.sdk.module_loading import import_string

from cairn.config import TopicConfig
from cairn.pipeline import run_record
from cairn.views import alerts
from cairn_airflow.dag_topics import topics_loaded
from cairn_airflow.failures import CAUSE_KEY
from cairn_airflow.hooks.connections import storage

log = logging.getLogger(__name__)

CONFIG_ERRORS_VARIABLE = "cairn_config_errors"
"""Airflow Variable holding the topics files' errors the notifier was last told of (JSON)."""
NOTIFIER_ENV = "CAIRN_NOTIFIER"
"""Import path (`package.module.name`) of what Cairn calls when a topic needs a person: an
Airflow notifier instance (e.g. a `SlackNotifier(...)` made in a module of yours) or any
callable taking the task context. Unset: failures only show in the UI."""


def notifier() -> list[Callable[..., Any]]:
    """The configured notifier as Airflow failure callbacks (empty when none is configured)."""
    path = os.environ.get(NOTIFIER_ENV, "").strip()
    return [Alert(import_string(path))] if path else []


class Alert:
    """A task's failure callback: the configured notifier, told why. A task the triggerer
    ended as failed (`cairn_airflow.triggers.step`: *check_health*'s breach) has its callback
    run by the DAG processor, whose context holds no exception: the cause comes from the XCom
    the ending event stored, as the exception and as `reason`."""

    def __init__(self, notify: Callable[..., Any]) -> None:
        self.notify = notify
        self.__name__ = getattr(notify, "__name__", type(notify).__name__)  # Airflow logs it

    def __call__(self, context: Any) -> Any:
        ti = context.get("ti")
        told = context.get("exception") is not None or context.get("reason") is not None
        if not told and ti is not None:
            try:
                cause = ti.xcom_pull(task_ids=ti.task_id, key=CAUSE_KEY, map_indexes=ti.map_index)
            except Exception:  # the alert goes out without its cause rather than not at all
                log.warning("the failure's cause could not be read for the alert", exc_info=True)
                cause = None
            if cause:
                context["exception"] = AirflowFailException(cause)
                context["reason"] = cause
        return self.notify(context)


def run_overdue(context: dict | None = None, topic: str = "?", limit: str = "") -> None:
    """Deadline Alert callback (run by the scheduler's executor, with Airflow's deadline context:
    the DAG run as a dict): an archive run is still unfinished past `max_run_duration`."""
    context = context or {}
    run_id = (context.get("dag_run") or {}).get("dag_run_id")
    reason = (
        f"topic {topic!r}: archive run {run_id} is not finished {limit} after it was queued "
        "(max_run_duration in topics.yaml)"
    )
    log.error(reason)
    for callback in notifier():
        callback({**context, "reason": reason})


def archive_deadline(cfg: TopicConfig) -> DeadlineAlert:
    """Report a run not finished `max_run_duration` after it was queued: stuck on a task, a
    Spark job or a full pool, it archives nothing and no check task would run to say so."""
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=cfg.max_run_duration,
        callback=SyncCallback(
            run_overdue, kwargs={"topic": cfg.topic, "limit": str(cfg.max_run_duration)}
        ),
    )


def check_health(cfg: TopicConfig) -> list[str]:
    """Fail the task (so the notifier is called) if the topic breaches a limit; else return
    what was checked."""
    found = alerts.breaches(cfg, run_record.topic_status(storage(cfg), cfg.topic))
    if found:
        raise AirflowFailException("; ".join(map(str, found)))
    return [
        f"topic {cfg.topic!r}: within max_time_lag {cfg.max_time_lag}, "
        f"max_freshness {cfg.freshness_limit or 'none'} and "
        f"max_quarantine_ratio {cfg.max_quarantine_ratio:g}"
    ]


def check_config(context: dict) -> list[str]:
    """Fail the task while the topics files have mistakes, naming each (file, line, entry,
    field); call the notifier when they change, not at every check, so a mistake left for a
    day is one alert. Fixed, the task passes and the next mistake alerts again."""
    found = [str(e) for e in topics_loaded().errors]
    if found != json.loads(Variable.get(CONFIG_ERRORS_VARIABLE, default="[]")):
        Variable.set(CONFIG_ERRORS_VARIABLE, json.dumps(found))
        if found:
            reason = f"topics files: {len(found)} mistake(s), not archived until fixed: " + (
                "; ".join(found)
            )
            log.error(reason)
            for callback in notifier():
                callback({**context, "reason": reason})
    if found:
        raise AirflowFailException("\n".join(found))
    return ["the topics files have no mistakes"]
