"""`StepTrigger`: a step of an archive or rebuild run (`cairn_airflow.steps`) run in the
triggerer, where its task starts (Airflow's `start_from_trigger`).

A worker would fork a task process and parse the topic's DAG file for each of these steps, a
few hundred milliseconds of plain Python and a few object-storage requests: under load the
start, not the step, took most of a run's time. Here the step runs in a thread of the
triggerer, with the task's context and the results of its upstream tasks; the trigger ends the
task from here, as succeeded, its result in the ending event (`cairn_airflow.step_result`),
skipped, or failed on a failure the step decided (`AirflowFailException`: *check_health*'s
breach, a task without retries; Airflow would retry one with retries left), its cause kept as
the task's `CAUSE_KEY` XCom for the notifier and the overview page; no worker takes any of
these up. Whatever else goes wrong here, and a step only a worker can
finish (`NeedsWorker`), sends the task to a worker, which runs the step again (each is
idempotent) with the usual failure handling: a permanent error fails it at once, anything else
is retried.

A restarted triggerer starts the trigger again from the database, so the step runs again. The
arguments name the step, the topic and the upstream tasks, no secret.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.triggers.base import BaseTrigger, TaskFailedEvent, TaskSkippedEvent, TriggerEvent

from cairn_airflow.failures import CAUSE_KEY, NeedsWorker, one_line
from cairn_airflow.step_result import ended, pull, starting
from cairn_airflow.triggers.loop_logger import LoopLogger

if TYPE_CHECKING:
    from cairn_airflow.steps import StepName

log = LoopLogger(__name__)

STEP_THREADS = 32
"""Steps running at once in a triggerer process. A step mostly waits: on object storage, on
Kafka, and on the triggerer's supervisor, which answers every pending request (an XCom, a
connection, a Variable) once per pass of its loop. asyncio's default pool, the CPU count plus
four threads, let a burst's steps queue for a thread instead, while the loop had room."""
_THREADS = ThreadPoolExecutor(STEP_THREADS, thread_name_prefix="cairn-step")


class StepTrigger(BaseTrigger):
    """Runs one step and ends its task, or sends the task to a worker."""

    def __init__(self, step: StepName, topic: str, upstream: dict[str, str]) -> None:
        """`upstream`: the step's argument name → the upstream task whose result it is."""
        super().__init__()
        self.step, self.topic, self.upstream = step, topic, upstream

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{__name__}.{type(self).__name__}", {
            "step": self.step,
            "topic": self.topic,
            "upstream": self.upstream,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            # as asyncio.to_thread, in Cairn's pool: the step logs to its task's trigger log
            call = functools.partial(contextvars.copy_context().run, self._run)
            result = await asyncio.get_running_loop().run_in_executor(_THREADS, call)
        except AirflowSkipException as skipped:
            await log.info("topic %s: %s skipped: %s", self.topic, self.step, skipped)
            yield TaskSkippedEvent()
            return
        except AirflowFailException as failed:
            # Airflow sends the failure callback (the notifier) to the DAG processor, which
            # finds the cause in the XCom this event stores (`notifier.Alert`)
            await log.warning("topic %s: %s failed: %s", self.topic, self.step, failed)
            yield TaskFailedEvent(xcoms={CAUSE_KEY: one_line(str(failed))})
            return
        except Exception as err:
            said = log.info if isinstance(err, NeedsWorker) else log.warning  # planned, or not
            await said("topic %s: %s goes to a worker: %s", self.topic, self.step, err)
            yield TriggerEvent({"on_worker": f"{type(err).__name__}: {err}"})
            return
        yield ended(self.task_instance, result)

    def _run(self) -> Any:
        from cairn_airflow import steps  # Cairn's pipeline: not in the parse of a DAG file

        ti: Any = self.task_instance
        starting(ti)
        inputs = {name: pull(ti, task_id) for name, task_id in self.upstream.items()}
        return steps.run(self.step, self.topic, ti.get_template_context(), inputs)
