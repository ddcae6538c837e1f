"""Which topic's Spark job goes first when the Spark pool's slots are scarce: the most lagging.

Airflow orders the task instances waiting for a pool by their priority weight, which it computes
once, when it creates the task instance (with the DAG run, or when a run is cleared), by calling
the task's `weight_rule`. The archive task's rule, `TimeLagFirst`, runs there — in the scheduler
(or the api-server, for a run a task triggered) — so it must not query Kafka or S3. It reads one
row of Airflow's metadata database instead: the Variable `cairn_time_lag.<topic>`, in which each
archive run leaves the time lag it measured (`remember_lag`: after a commit, the age of the oldest
record not yet archived; 0 when planning finds nothing new). So a run is weighted by the lag its
topic's previous run left, the freshest figure that exists when the run is created; the weight is
`priority_weight` plus whole minutes of lag (`cairn.schedule.lag_weight`).

The rule must be registered by a plugin (`cairn_airflow.plugin.CairnPlugin`) in every Airflow
process that serializes or schedules DAGs; a DAG naming an unregistered rule fails to import.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow.sdk import Variable
from airflow.task.priority_strategy import PriorityWeightStrategy

from cairn.dag_ids import parse_dag_id
from cairn.schedule import lag_weight

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

log = logging.getLogger(__name__)

LAG_VARIABLE_PREFIX = "cairn_time_lag."


def lag_variable(topic: str) -> str:
    """The Airflow Variable holding the time lag (seconds) `topic`'s last archive run left."""
    return f"{LAG_VARIABLE_PREFIX}{topic}"


def remember_lag(topic: str, time_lag_seconds: float | None) -> None:
    """Record the lag a run measured for the next run's weight. Best effort: a run that
    committed must not fail here, and an unknown lag (Kafka did not answer) leaves the last."""
    if time_lag_seconds is None:
        return
    try:
        Variable.set(
            lag_variable(topic),
            str(round(time_lag_seconds, 3)),
            description="Written by Cairn's archive runs: the time lag (seconds) the topic's last "
            "run left; orders the topics' Spark jobs (docs/operating.md, Many topics).",
        )
    except Exception as err:
        log.warning(
            "topic %s: lag not recorded for priority: %s: %s", topic, type(err).__name__, err
        )


def stored_lag(topic: str) -> float | None:
    """The lag recorded for `topic`, read from the metadata database (no secrets backend,
    no Kafka, no S3); None if there is none or it is unreadable."""
    from airflow.models.variable import Variable as VariableRow
    from airflow.utils.session import create_session
    from sqlalchemy import select

    # Not the scoped session: that is the scheduler's own, in the middle of its transaction.
    with create_session(scoped=False) as session:
        row = session.scalar(select(VariableRow).where(VariableRow.key == lag_variable(topic)))
        value = None if row is None else row.val
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def dag_topic(dag_id: str) -> str | None:
    """The topic of an `archive__<topic>` DAG (`cairn.dag_ids`); None for any other DAG."""
    parsed = parse_dag_id(dag_id)
    return parsed[1] if parsed and parsed[0] == "archive" else None


class TimeLagFirst(PriorityWeightStrategy):
    """The task's `priority_weight` plus the whole minutes of time lag its topic's last archive
    run left. Any failure to read the lag gives the plain weight: ordering is an optimisation and
    must never stop a run from being created."""

    def get_weight(self, ti: TaskInstance) -> int:
        base = ti.task.priority_weight if ti.task is not None else 1
        topic = dag_topic(ti.dag_id)
        if topic is None:
            return base
        try:
            lag = stored_lag(topic)
        except Exception as err:
            log.warning(
                "topic %s: lag not read for priority: %s: %s", topic, type(err).__name__, err
            )
            return base
        return base + lag_weight(lag)


LAG_FIRST = f"{TimeLagFirst.__module__}.{TimeLagFirst.__qualname__}"
"""The rule as DAG files name it (`weight_rule=LAG_FIRST`): the path the plugin registers."""
