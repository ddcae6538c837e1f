"""An archive run's bookkeeping steps start in the triggerer (`cairn_airflow.triggers.step`):
each gets its upstream tasks' results, its result becomes the task's XCom as the triggerer ends
the task, and anything that goes wrong there sends the task to a worker to run the step again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException
from airflow.triggers.base import TaskSuccessEvent

from cairn.errors import PermanentError
from cairn_airflow import archive_steps
from cairn_airflow.operators.step import ArchiveStep
from cairn_airflow.triggers import step as step_trigger
from cairn_airflow.triggers.step import StepTrigger

RESULTS = {"plan": {"claim": "c"}, "verify": {"files": 2}}


class TI(SimpleNamespace):
    """What the triggerer gives a trigger: the task instance, to pull its upstream results."""

    def xcom_pull(self, task_ids: str, map_indexes: int) -> dict:
        assert map_indexes == -1  # the triggerer serves one XCom, not the all-indexes query
        return RESULTS[task_ids]


@pytest.fixture
def stored(monkeypatch) -> list:
    """The XComs the trigger stores (through the task SDK, as a worker's task does)."""
    stored = []

    def store(key, value, **where) -> None:
        stored.append((key, value, where))

    monkeypatch.setattr(step_trigger.XCom, "set", store)
    return stored


@pytest.fixture
def calls(monkeypatch) -> list:
    """The steps' calls (topic, run id, arguments); `commit` fails when told to."""
    calls = []

    def commit(cfg, run_id, planned, report):
        calls.append((cfg, run_id, planned, report))
        if report.get("fail"):
            raise report["fail"]
        return {"seq": 7}

    monkeypatch.setattr(archive_steps, "find_topic", lambda topic: f"<entry of {topic}>")
    monkeypatch.setitem(archive_steps.STEPS, "commit", commit)
    return calls


def events(trigger: StepTrigger) -> list:
    trigger.task_instance = TI(
        dag_id="archive__orders", task_id=trigger.step, run_id="manual__1", map_index=-1
    )

    async def run():
        return [event async for event in trigger.run()]

    return asyncio.run(run())


def test_a_step_runs_in_the_triggerer_on_its_upstream_results_and_ends_its_task(calls, stored):
    trigger = StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"})

    [done] = events(trigger)

    assert calls == [("<entry of orders>", "manual__1", {"claim": "c"}, {"files": 2})]
    assert isinstance(done, TaskSuccessEvent)  # no worker takes the task up
    # what its downstream tasks pull, stored as a worker's task stores it, not in the event
    where = {"dag_id": "archive__orders", "task_id": "commit", "run_id": "manual__1"}
    assert stored == [("return_value", {"seq": 7}, {**where, "map_index": -1})]
    assert not done.xcoms


def test_a_step_that_fails_in_the_triggerer_goes_to_a_worker_which_runs_it_again(calls, stored):
    RESULTS["verify"] = {"fail": ConnectionError("S3 hiccup")}
    try:
        [sent] = events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}))
    finally:
        RESULTS["verify"] = {"files": 2}
    assert not isinstance(sent, TaskSuccessEvent) and stored == []
    assert sent.payload == {"on_worker": "ConnectionError: S3 hiccup"}

    step = ArchiveStep(step="commit", topic="orders")
    step.inputs = {"planned": {"claim": "c"}, "report": {"files": 2}}  # as rendered there
    assert step.resume({"run_id": "manual__1"}, sent.payload) == {"seq": 7}
    assert len(calls) == 2

    step.inputs["report"] = {"fail": PermanentError("fenced")}  # on a worker: failed for good
    with pytest.raises(AirflowFailException, match="PermanentError: fenced"):
        step.resume({"run_id": "manual__1"}, sent.payload)


def test_the_trigger_serializes_with_no_secret_and_names_a_step_that_exists():
    kwargs = {"step": "verify", "topic": "orders", "upstream": {"planned": "plan"}}
    path, back = StepTrigger(**kwargs).serialize()
    assert path == "cairn_airflow.triggers.step.StepTrigger" and back == kwargs
    assert set(archive_steps.STEPS) == {"clean", "verify", "commit", "complete"}
