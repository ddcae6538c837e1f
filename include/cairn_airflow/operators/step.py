"""`Step`: the task of one step of an archive, rebuild or seal run (`cairn_airflow.steps`).

It starts in the triggerer (`cairn_airflow.triggers.step`) and normally ends there; a worker
runs it only when that failed (`resume`), with the usual failure handling. The task stays one
box in the grid with its own log, retries and clearing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.definitions.xcom_arg import PlainXComArg
from airflow.triggers.base import StartTriggerArgs

from cairn_airflow.failures import fail_fast
from cairn_airflow.step_result import pulled
from cairn_airflow.triggers.step import StepTrigger

if TYPE_CHECKING:
    from cairn_airflow.steps import StepName

log = logging.getLogger(__name__)


class Step(BaseOperator):
    """`step` of `topic`'s archive, rebuild or seal run, on the results of the tasks in `inputs`
    (argument name → that task's output); its task id is the step's name unless given."""

    template_fields = ("inputs",)

    def __init__(
        self,
        *,
        step: StepName,
        topic: str,
        inputs: dict[str, PlainXComArg] | None = None,
        task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(task_id=task_id or step, **kwargs)
        self.step, self.topic = step, topic
        self.inputs: dict[str, Any] = dict(inputs or {})
        upstream = {name: arg.operator.task_id for name, arg in self.inputs.items()}
        path, trigger_kwargs = StepTrigger(step, topic, upstream).serialize()
        self.start_from_trigger = True
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=path, trigger_kwargs=trigger_kwargs, next_method="resume"
        )

    def execute(self, context: Any) -> Any:
        from cairn_airflow import steps  # Cairn's pipeline: not in the parse of a DAG file

        inputs = {name: pulled(value) for name, value in self.inputs.items()}
        with fail_fast():
            return steps.run(self.step, self.topic, context, inputs)

    def resume(self, context: Any, event: dict[str, Any]) -> Any:
        """The step failed in the triggerer: run it here, where a failure is handled."""
        log.info("%s runs on this worker: in the triggerer, %s", self.step, event["on_worker"])
        return self.execute(context)
