"""A step's result on its way from the step that returns it (`cairn_airflow.steps`) to the tasks
that use it.

A step the triggerer ends carries its result in its ending event (`ended`). The triggerer's
supervisor stores an event's XComs with the task's new state, in the pass that handles the
event; an XCom pushed from the trigger instead was one more request to that supervisor, which
serves one request per pass of its loop (Airflow 3.3), and at a burst each pass takes tenths of
a second (docs/performance.md). Airflow stores an event's XComs JSON-encoded (`XComModel.set`),
where a task's own push through the Execution API is stored as it is: such a result reaches the
tasks that pull it as a JSON string, and `pulled` decodes it. No step returns a bare string.

The steps downstream take a result from the same triggerer process without a request (`pull`):
each result a step ended with here is kept, by DAG, run, the run's clear number and task, for
`RESULT_SECONDS`. Clearing any task of a run gives the run a new clear number, so no step takes
a result from before a clear; a step that starts forgets what its task ended with here before
(`starting`); a result another triggerer or a worker returned is pulled as before. Pulls were
most of the supervisor's requests at a burst (seven of a run's eleven): the run's plan alone
was pulled four times. `complete`'s result is always pulled (`ALWAYS_PULLED`).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from airflow.sdk.execution_time.xcom import XCom
from airflow.triggers.base import TaskSuccessEvent
from cachetools import TTLCache

RESULT_SECONDS = 6 * 3600.0
"""How long a result stays kept for the steps after it (a run waiting longer pulls it)."""
RESULTS_KEPT = 8192
"""The most results kept (a few kilobytes each): eight runs' results for each of 1,000 topics."""

ALWAYS_PULLED = frozenset({"complete"})
"""Tasks whose result is never taken from this process. With two triggerers, the one that ran
`complete` may have lost the task to the other (a missed heartbeat), which ran it again and
ended it; a re-run returns every date its run marked before plus any it marked since
(`completeness.complete_run`), so the kept result could lack dates and `announce` skip them for
good. The stored result is the one Airflow accepted: one request per run, where the plan's
results are several."""

_kept: TTLCache[tuple[str, str, int, str], str] = TTLCache(RESULTS_KEPT, RESULT_SECONDS)
_lock = threading.Lock()


def _key(ti: Any, task_id: str) -> tuple[str, str, int, str]:
    run = ti.get_template_context().get("dag_run")
    return ti.dag_id, ti.run_id, getattr(run, "clear_number", None) or 0, task_id


def starting(ti: Any) -> None:
    """The step of `ti` starts in this triggerer: what its task ended with here before goes."""
    with _lock:
        _kept.pop(_key(ti, ti.task_id), None)


def ended(ti: Any, result: Any) -> TaskSuccessEvent:
    """The event that ends the step of `ti` as succeeded, its result the task's `return_value`,
    kept here for the steps after it (unless `ALWAYS_PULLED`)."""
    if ti.task_id not in ALWAYS_PULLED:
        encoded = json.dumps(result)
        with _lock:
            _kept[_key(ti, ti.task_id)] = encoded
    return TaskSuccessEvent(xcoms={XCom.XCOM_RETURN_KEY: result})


def pulled(value: Any) -> Any:
    """A step's result as a downstream task got it (rendered, or pulled): decoded if the
    triggerer stored it."""
    return json.loads(value) if isinstance(value, str) else value


def pull(ti: Any, task_id: str) -> Any:
    """The result of the step `task_id`, for a trigger of the same run: kept here, else pulled."""
    with _lock:
        kept = _kept.get(_key(ti, task_id))
    if kept is not None:
        return json.loads(kept)
    # one map index: the triggerer serves a single XCom, not the all-indexes query
    return pulled(ti.xcom_pull(task_ids=task_id, map_indexes=-1))
