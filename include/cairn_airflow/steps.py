"""The steps of an archive run around its Spark job — plan, clean, verify, commit, complete,
check_health, announce, more_waiting — and the selects of a rebuild and a seal, each one call into
`cairn.pipeline` (or Cairn's Airflow glue), written once for both places a step runs: the
triggerer, where its task starts (`cairn_airflow.triggers.step`: no worker process, no DAG file
parsed), and a worker, where it goes when that fails or when only a worker can finish it
(`failures.NeedsWorker`; `cairn_airflow.operators.step`). A step skips its task (and so the
tasks that need its result) by raising `AirflowSkipException`, in either place. Each is safe to
run again: the commit protocol makes every step idempotent."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any, Literal

from airflow.sdk.exceptions import AirflowSkipException

from cairn.config import TopicConfig
from cairn.errors import PermanentError
from cairn.pipeline import archive_run, completeness, rebuild
from cairn.protocol.manifest import VerifyReport
from cairn.topics_file import find_topic
from cairn_airflow import assets
from cairn_airflow.hooks.catalog import catalog
from cairn_airflow.hooks.connections import kafka_conf, spark_conn_id, storage
from cairn_airflow.notifications import notifier
from cairn_airflow.priority import remember_lag
from cairn_airflow.root_memory import earlier_roots, remember_root
from cairn_airflow.stats import report_run
from cairn_airflow.triggers.shared_archive import own_job

log = logging.getLogger(__name__)

StepName = Literal[
    "plan",
    "clean",
    "verify",
    "commit",
    "complete",
    "check_health",
    "announce",
    "more_waiting",
    "select",
    "seal_select",
]
Context = Mapping[str, Any]
"""The task's Airflow context (a worker's, or the one the triggerer renders its fields with)."""


def plan(cfg: TopicConfig, context: Context) -> dict:
    """Claim the run's offsets. Nothing new skips the tasks that need a plan (clean through
    commit and check_health): `complete` still runs, so idle partitions do not hold dates back."""
    planned = archive_run.plan_run(
        cfg, storage(cfg), kafka_conf(), context["run_id"], lambda: earlier_roots(cfg)
    )
    if planned is None:
        _remember_lag(cfg, 0.0)
        raise AirflowSkipException(
            f"topic {cfg.topic}: nothing new in Kafka; no Spark job, no token"
        )
    log.info("%s: reading %s", planned.claim.label, planned.plan.to_read)
    return planned.model_dump(mode="json")


def clean(cfg: TopicConfig, context: Context, planned: dict) -> list[str]:
    """Discard what fenced-out attempts staged; rewound files stay until the commit."""
    return archive_run.clean_run(storage(cfg), archive_run.Planned.model_validate(planned))


def verify(cfg: TopicConfig, context: Context, planned: dict) -> dict:
    report = archive_run.verify_run(storage(cfg), archive_run.Planned.model_validate(planned))
    return report.model_dump(mode="json")


def commit(cfg: TopicConfig, context: Context, planned: dict, report: dict) -> dict:
    claimed = archive_run.Planned.model_validate(planned)
    summary = archive_run.commit_run(
        cfg,
        storage(cfg),
        claimed,
        VerifyReport.model_validate(report),
        kafka_conf(),
    )
    log.info("run summary: %s", summary.model_dump_json(indent=2))
    report_run(cfg, summary.seq)
    _remember_lag(cfg, summary.time_lag_seconds)
    remember_root(cfg, first=claimed.claim.base_seq == 0)
    return summary.model_dump(mode="json")


def _remember_lag(cfg: TopicConfig, lag: float | None) -> None:
    """The lag orders the Spark pool's queue (`cairn_airflow.priority`): recorded only for a
    topic whose archive runs queue there. One whose runs share Spark jobs from the triggerer
    waits for no slot, and each write is a request to the triggerer's supervisor."""
    try:
        queues = own_job(cfg, spark_conn_id(cfg)) is not None
    except Exception:  # the connection is unreadable: record, as any run did before
        queues = True
    if queues:
        remember_lag(cfg.topic, lag)


def complete(cfg: TopicConfig, context: Context) -> dict:
    """Write `_SUCCESS` into dates that became complete or changed (docs/table.md)."""
    done = completeness.complete_run(cfg, storage(cfg), kafka_conf(), context["run_id"])
    return done.model_dump(mode="json")


def check_health(cfg: TopicConfig, context: Context) -> list[str]:
    """Fail, calling the notifier, if the topic is past one of its limits (docs/operating.md,
    Alerts): in the triggerer too, which ends the task as failed with the cause."""
    return notifier.check_health(cfg)


def announce(cfg: TopicConfig, context: Context, done: dict) -> list[str]:
    """One asset event per date that became complete or changed; skipped if none."""
    return assets.announce_dates(assets.topic_asset(cfg.topic), done)


def more_waiting(cfg: TopicConfig, context: Context, summary: dict) -> bool:
    """At the per-run cap: start the next run now (`drain_backlog`) instead of waiting for the
    records' next firing or the schedule; otherwise skip it."""
    if not summary["more_waiting"]:
        raise AirflowSkipException("the run read all that waited")
    return True


def select(cfg: TopicConfig, context: Context) -> dict:
    """A rebuild's dates and backup files. Rebuilds run only when asked (a backfill, a clear or
    a trigger): the daily timetable exists so that backfills have dates, and the runs it
    schedules by itself — one per topic at midnight, and one for each new topic — skip here,
    in the triggerer, with the rest of their run."""
    if context["dag_run"].run_type == "scheduled":
        raise AirflowSkipException("rebuilds run only when asked (backfill, clear or trigger)")
    start = context.get("data_interval_start")
    day = start.in_timezone(cfg.timezone).date() if start is not None else None
    params = context["params"]
    dates = rebuild.run_dates(day, params.get("from_date"), params.get("to_date"))
    chosen = rebuild.select(storage(cfg), cfg, dates, context["run_id"])
    if chosen is None:
        raise AirflowSkipException(f"topic {cfg.topic} has nothing filed under {dates}")
    log.info("%s: %d backup files", chosen.claim.label, len(chosen.sources))
    return chosen.model_dump(mode="json")


class NoDate(PermanentError):
    """A seal run names no date to seal."""


def seal_date(context: Context) -> date:
    """The date a seal run seals: its `date` param, else its asset event's partition key."""
    given = context["params"].get("date") or context["dag_run"].partition_key
    if not given:
        raise NoDate("this run names no date: trigger it with the param date (YYYY-MM-DD)")
    try:
        return date.fromisoformat(given)
    except ValueError:
        raise NoDate(f"date {given!r} is not YYYY-MM-DD") from None


def seal_select(cfg: TopicConfig, context: Context) -> dict:
    """A seal's folders. Every date a run of the archive announces (late records amend dates
    at almost every run of a busy topic) starts a seal run, which mostly stops here: the date
    is not complete, or what is new in it is below `reseal_files` and `reseal_mb`; it skips
    the rest of the run."""
    from cairn.pipeline import seal  # pyiceberg: only where a seal is selected
    from cairn.table import iceberg

    day = seal_date(context)
    found = catalog()
    table = iceberg.target(found, cfg.topic) if found else None
    chosen = seal.select(storage(cfg), cfg, day, context["run_id"], table)
    if chosen is None:
        raise AirflowSkipException(f"topic {cfg.topic} {day}: not complete, or nothing new to seal")
    log.info("%s: %d folders", chosen.claim.label, len(chosen.folders))
    return chosen.model_dump(mode="json")


STEPS: dict[StepName, Callable[..., Any]] = {
    "plan": plan,
    "clean": clean,
    "verify": verify,
    "commit": commit,
    "complete": complete,
    "check_health": check_health,
    "announce": announce,
    "more_waiting": more_waiting,
    "select": select,
    "seal_select": seal_select,
}


def run(step: StepName, topic: str, context: Context, inputs: dict[str, Any]) -> Any:
    """`step` of `topic`'s run, on its upstream tasks' results `inputs` (by name)."""
    return STEPS[step](find_topic(topic), context, **inputs)
