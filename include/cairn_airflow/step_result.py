"""A step's result on its way from the step that returns it (`cairn_airflow.steps`) to the tasks
that use it.

A step the triggerer ends carries its result in its ending event (`ended`). The triggerer's
supervisor stores an event's XComs with the task's new state, in the pass that handles the
event; an XCom pushed from the trigger instead was one more request to that supervisor, which
serves one request per pass of its loop (Airflow 3.3), and at a burst each pass takes tenths of
a second (docs/performance.md). Airflow stores an event's XComs JSON-encoded (`XComModel.set`),
where a task's own push through the Execution API is stored as it is: such a result reaches the
tasks that pull it as a JSON string, and `pulled` decodes it. No step returns a bare string.
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk.execution_time.xcom import XCom
from airflow.triggers.base import TaskSuccessEvent


def ended(result: Any) -> TaskSuccessEvent:
    """The event that ends a step's task as succeeded, its result the task's `return_value`."""
    return TaskSuccessEvent(xcoms={XCom.XCOM_RETURN_KEY: result})


def pulled(value: Any) -> Any:
    """A step's result as a downstream task got it (rendered, or pulled): decoded if the
    triggerer stored it."""
    return json.loads(value) if isinstance(value, str) else value


def pull(ti: Any, task_id: str) -> Any:
    """The result of the step `task_id`, pulled by a trigger of the same run."""
    # one map index: the triggerer serves a single XCom, not the all-indexes query
    return pulled(ti.xcom_pull(task_ids=task_id, map_indexes=-1))
