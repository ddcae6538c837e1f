"""An archive run's steps start in the triggerer (`cairn_airflow.triggers.step`): each gets its
upstream tasks' results, its result travels in the event that ends its task (or it skips the
task there), a failure it decided fails the task there, and anything else that goes wrong
there, or that only a worker can do (emit asset events), sends the task to a worker to run the
step again."""

from __future__ import annotations

import asyncio
import threading
import typing
from datetime import date
from types import SimpleNamespace

import pytest
from airflow.models.xcom import XComModel
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from airflow.triggers.base import TaskFailedEvent, TaskSkippedEvent, TaskSuccessEvent

from cairn.errors import PermanentError
from cairn.pipeline import seal
from cairn_airflow import assets, step_result, steps
from cairn_airflow.failures import CAUSE_KEY
from cairn_airflow.operators.step import Step
from cairn_airflow.triggers.step import StepTrigger

RESULTS: dict = {"plan": {"claim": "c"}, "verify": {"files": 2}}
FAILURES = {"hiccup": ConnectionError("S3 hiccup"), "fenced": PermanentError("fenced")}
"""What `commit` raises for a report naming one (a result is JSON: it names the error)."""


class TI(SimpleNamespace):
    """What the triggerer gives a trigger: the task instance, to pull its upstream results and
    render its context."""

    def xcom_pull(self, task_ids: str, map_indexes: int) -> str:
        assert map_indexes == -1  # the triggerer serves one XCom, not the all-indexes query
        return stored(RESULTS[task_ids])

    def get_template_context(self) -> dict:
        run = SimpleNamespace(
            run_type=self.run_type,
            partition_key=self.partition_key,
            clear_number=getattr(self, "clear_number", 0),
        )
        return {"run_id": self.run_id, "dag_run": run, "params": {}}


@pytest.fixture(autouse=True)
def nothing_kept():
    """Each test starts, and leaves the next module, with no result kept in this process."""
    step_result._kept.clear()
    yield
    step_result._kept.clear()


def stored(result: object) -> str:
    """A step's result as Airflow stores an ending event's XCom, and so as the tasks downstream
    of a step the triggerer ended pull it (the XCom table's raw value)."""
    return XComModel.serialize_value(result)


def result(event: TaskSuccessEvent) -> object:
    """What the tasks downstream of the step pull, once Airflow stored the event's XCom."""
    assert event.xcoms is not None and set(event.xcoms) == {"return_value"}
    return step_result.pulled(stored(event.xcoms["return_value"]))


@pytest.fixture
def calls(monkeypatch) -> list:
    """The steps' calls (topic, run id, arguments); `commit` fails when told to."""
    calls = []

    def commit(cfg, context, planned, report):
        calls.append((cfg, context["run_id"], planned, report))
        if report.get("fail"):
            raise FAILURES[report["fail"]]
        return {"seq": 7}

    monkeypatch.setattr(steps, "find_topic", lambda topic: f"<entry of {topic}>")
    monkeypatch.setitem(steps.STEPS, "commit", commit)
    return calls


def events(
    trigger: StepTrigger, run_type: str = "manual", partition_key: str = "", clear_number: int = 0
) -> list:
    trigger.task_instance = TI(
        dag_id="archive__orders",
        task_id=trigger.step,
        run_id="manual__1",
        map_index=-1,
        run_type=run_type,
        partition_key=partition_key,
        clear_number=clear_number,
    )

    async def run():
        return [event async for event in trigger.run()]

    return asyncio.run(run())


def test_a_step_runs_in_the_triggerer_on_its_upstream_results_and_ends_its_task(calls):
    trigger = StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"})

    [done] = events(trigger)

    # the upstream results, stored JSON-encoded by their ending events, arrive decoded
    assert calls == [("<entry of orders>", "manual__1", {"claim": "c"}, {"files": 2})]
    assert isinstance(done, TaskSuccessEvent)  # no worker takes the task up
    # its result goes with the event: stored by the supervisor with the task's state, not
    # pushed by a request of its own (the trigger has no XCom to push with)
    assert result(done) == {"seq": 7}


def test_a_result_is_pulled_as_pushed_from_a_worker_or_the_triggerer():
    """A worker's task pushes its result through the Execution API, stored as it is; an ending
    event's is stored JSON-encoded. The tasks downstream get the same value either way."""
    for value in ({"claim": {"seq": 3}}, ["s3://a/b"], True, None):
        assert step_result.pulled(value) == value  # pushed from a worker
        assert step_result.pulled(stored(value)) == value  # ended in the triggerer


def test_a_step_takes_a_result_its_triggerer_ended_without_a_request(calls, monkeypatch):
    """The supervisor serves one request per pass: the steps after `plan` and `verify` take
    their results from this process, as they ended, and pull nothing."""
    monkeypatch.setitem(steps.STEPS, "plan", lambda cfg, context: {"claim": "here"})
    monkeypatch.setitem(steps.STEPS, "verify", lambda cfg, context, planned: {"of": planned})
    [planned] = events(StepTrigger("plan", "orders", {}))
    [verified] = events(StepTrigger("verify", "orders", {"planned": "plan"}))
    assert result(verified) == {"of": {"claim": "here"}}

    monkeypatch.setattr(TI, "xcom_pull", lambda *args, **kwargs: pytest.fail("a request"))
    [done] = events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}))

    assert result(done) == {"seq": 7}
    assert calls[-1][2:] == ({"claim": "here"}, {"of": {"claim": "here"}})
    assert result(planned) == {"claim": "here"}  # and the same result went with the event


def test_announce_pulls_the_completion_airflow_accepted_even_if_it_ended_here(monkeypatch):
    """With two triggerers, this one's `complete` may have lost its task to the other, whose
    re-run marked more dates: `announce` takes the stored result, never this process's."""
    monkeypatch.setattr(steps, "find_topic", lambda topic: f"<entry of {topic}>")
    monkeypatch.setitem(steps.STEPS, "complete", lambda cfg, context: {"dates": ["2026-11-01"]})
    announced = []
    monkeypatch.setitem(
        steps.STEPS, "announce", lambda cfg, context, done: announced.append(done) or done
    )
    accepted = {"dates": ["2026-11-01", "2026-11-02"]}  # the other triggerer's, stored
    pulls = []

    def xcom_pull(self, task_ids, map_indexes):
        pulls.append(task_ids)
        return stored(accepted)

    monkeypatch.setattr(TI, "xcom_pull", xcom_pull)
    [ended_here] = events(StepTrigger("complete", "orders", {}))
    assert result(ended_here) == {"dates": ["2026-11-01"]}  # its event still carries it
    events(StepTrigger("announce", "orders", {"done": "complete"}))
    assert (pulls, announced) == (["complete"], [accepted])


def test_after_a_clear_or_a_step_that_started_again_the_result_is_pulled(calls, monkeypatch):
    """Clearing any task of a run gives the run a new clear number: no step takes a result
    kept from before. A step that starts again forgets its result, so one that then goes to a
    worker leaves its downstream steps to pull the worker's."""
    monkeypatch.setitem(steps.STEPS, "plan", lambda cfg, context: {"claim": "first"})
    events(StepTrigger("plan", "orders", {}))
    events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}), clear_number=1)
    assert calls[-1][2] == {"claim": "c"}  # RESULTS: pulled, as a worker's plan would be

    events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}))
    assert calls[-1][2] == {"claim": "first"}  # the same clear number: kept

    def fails(cfg, context):
        raise ConnectionError("S3 hiccup")

    monkeypatch.setitem(steps.STEPS, "plan", fails)
    [sent] = events(StepTrigger("plan", "orders", {}))  # started again: to a worker
    assert "on_worker" in sent.payload
    events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}))
    assert calls[-1][2] == {"claim": "c"}  # the worker's result, pulled


def test_a_bursts_steps_wait_at_once_not_a_few_at_a_time(monkeypatch):
    """Steps mostly wait (on storage, Kafka and the triggerer's supervisor): twenty of them
    wait together, where asyncio's default pool (the CPU count plus four) would have run a
    few and queued the rest."""
    together = threading.Barrier(20, timeout=10)

    def commit(cfg, context, planned, report):
        together.wait()  # returns only once all twenty are waiting at the same moment
        return {"seq": 7}

    monkeypatch.setattr(steps, "find_topic", lambda topic: f"<entry of {topic}>")
    monkeypatch.setitem(steps.STEPS, "commit", commit)

    async def burst() -> list:
        triggers = [
            StepTrigger("commit", f"t{i}", {"planned": "plan", "report": "verify"})
            for i in range(20)
        ]
        for trigger in triggers:
            trigger.task_instance = TI(
                dag_id="archive__t",
                task_id="commit",
                run_id="r",
                map_index=-1,
                run_type="x",
                partition_key="",
            )

        async def ended(trigger: StepTrigger) -> list:
            return [event async for event in trigger.run()]

        return await asyncio.gather(*map(ended, triggers))

    ended = asyncio.run(burst())
    assert [result(done) for [done] in ended] == [{"seq": 7}] * 20


def test_a_step_that_fails_in_the_triggerer_goes_to_a_worker_which_runs_it_again(calls):
    RESULTS["verify"] = {"fail": "hiccup"}
    try:
        [sent] = events(StepTrigger("commit", "orders", {"planned": "plan", "report": "verify"}))
    finally:
        RESULTS["verify"] = {"files": 2}
    assert not isinstance(sent, TaskSuccessEvent)
    assert sent.payload == {"on_worker": "ConnectionError: S3 hiccup"}

    step = Step(step="commit", topic="orders")
    # as rendered there: one upstream result pushed by the triggerer, one by a worker
    step.inputs = {"planned": stored({"claim": "c"}), "report": {"files": 2}}
    assert step.resume({"run_id": "manual__1"}, sent.payload) == {"seq": 7}
    assert len(calls) == 2

    step.inputs["report"] = {"fail": "fenced"}  # on a worker: failed for good
    with pytest.raises(AirflowFailException, match="PermanentError: fenced"):
        step.resume({"run_id": "manual__1"}, sent.payload)


def test_a_breach_fails_check_health_in_the_triggerer_keeping_its_cause(calls, monkeypatch):
    """A failure the step decided needs no worker to decide it again: the task ends failed,
    its cause stored with it for the notifier (run by the DAG processor) and the overview."""

    def breached(cfg):
        raise AirflowFailException("topic 'orders': time lag is 90,\n over its limit 60")

    monkeypatch.setattr(steps.notifier, "check_health", breached)

    [failed] = events(StepTrigger("check_health", "orders", {}))

    assert isinstance(failed, TaskFailedEvent)  # no `on_worker` resume
    assert failed.xcoms == {CAUSE_KEY: "topic 'orders': time lag is 90, over its limit 60"}


def test_a_plan_with_nothing_new_skips_its_task_from_the_triggerer_and_on_a_worker(
    calls, monkeypatch
):
    """The tasks that need a plan are then skipped by their trigger rule; `complete` runs."""
    lags = []
    monkeypatch.setattr(steps, "storage", lambda cfg: "<storage>")
    monkeypatch.setattr(steps, "kafka_conf", lambda: "<kafka>")
    monkeypatch.setattr(steps, "remember_lag", lambda topic, lag: lags.append(lag))
    monkeypatch.setattr(steps.archive_run, "plan_run", lambda *args: None)
    monkeypatch.setattr(steps, "find_topic", lambda topic: SimpleNamespace(topic=topic))

    [skipped] = events(StepTrigger("plan", "orders", {}))

    assert isinstance(skipped, TaskSkippedEvent) and lags == [0.0]
    with pytest.raises(AirflowSkipException, match="orders: nothing new in Kafka"):
        Step(step="plan", topic="orders").execute({"run_id": "manual__1"})


@pytest.mark.parametrize(("own", "recorded"), [("share_spark_job is false", [0.0]), (None, [])])
def test_only_a_topic_whose_runs_queue_for_the_spark_pool_records_its_lag(
    calls, monkeypatch, own, recorded
):
    """The lag orders the pool's queue; a topic whose runs share Spark jobs from the triggerer
    never waits there, and a write would be one more request to the triggerer's supervisor."""
    lags = []
    monkeypatch.setattr(steps, "own_job", lambda cfg, conn_id: own)
    monkeypatch.setattr(steps, "remember_lag", lambda topic, lag: lags.append(lag))
    monkeypatch.setattr(steps, "storage", lambda cfg: "<storage>")
    monkeypatch.setattr(steps, "kafka_conf", lambda: "<kafka>")
    monkeypatch.setattr(steps.archive_run, "plan_run", lambda *args: None)
    monkeypatch.setattr(
        steps, "find_topic", lambda topic: SimpleNamespace(topic=topic, spark_connection=None)
    )
    [skipped] = events(StepTrigger("plan", "orders", {}))
    assert isinstance(skipped, TaskSkippedEvent) and lags == recorded


@pytest.mark.parametrize(("more", "ends"), [(True, TaskSuccessEvent), (False, TaskSkippedEvent)])
def test_more_waiting_starts_the_next_run_only_at_the_cap(calls, more, ends):
    RESULTS["commit"] = {"more_waiting": more}
    try:
        [ended] = events(StepTrigger("more_waiting", "orders", {"summary": "commit"}))
    finally:
        del RESULTS["commit"]
    assert isinstance(ended, ends)
    assert not more or result(ended) is True


def test_only_a_run_that_completed_dates_sends_announce_to_a_worker_to_emit_their_events(
    calls, monkeypatch
):
    monkeypatch.setattr(steps, "find_topic", lambda topic: SimpleNamespace(topic=topic))
    RESULTS["complete"] = {"topic": "orders", "through": "2024-06-01"}
    try:
        [idle] = events(StepTrigger("announce", "orders", {"done": "complete"}))
        RESULTS["complete"]["completed"] = ["2024-06-01"]
        [handed] = events(StepTrigger("announce", "orders", {"done": "complete"}))
    finally:
        del RESULTS["complete"]
    assert isinstance(idle, TaskSkippedEvent)  # no date: no worker, no event
    assert handed.payload == {"on_worker": "NeedsWorker: 1 date(s) to announce as asset events"}

    outlet = SimpleNamespace(extra=None, keys=[])
    outlet.add_partitions = outlet.keys.extend
    asset = assets.topic_asset("orders")
    monkeypatch.setattr(assets, "get_current_context", lambda: {"outlet_events": {asset: outlet}})
    step = Step(step="announce", topic="orders", outlets=[asset])
    step.inputs = {
        "done": stored({"topic": "orders", "through": "2024-06-01", "completed": ["2024-06-01"]})
    }
    assert step.resume({"run_id": "manual__1"}, handed.payload) == ["2024-06-01"]
    assert outlet.keys == ["2024-06-01"] and outlet.extra["topic"] == "orders"


def test_a_rebuild_runs_only_when_asked_its_scheduled_runs_skip_in_the_triggerer(
    calls, monkeypatch
):
    """The daily timetable gives backfills their dates; the runs it schedules by itself (one
    per topic a day, one per new topic) start no worker process."""
    selected = []
    monkeypatch.setattr(steps, "find_topic", lambda topic: SimpleNamespace(topic=topic))
    monkeypatch.setattr(steps, "storage", lambda cfg: "<storage>")
    monkeypatch.setattr(steps.rebuild, "select", lambda *args: selected.append(args))

    [skipped] = events(StepTrigger("select", "orders", {}), run_type="scheduled")

    assert isinstance(skipped, TaskSkippedEvent) and selected == []
    with pytest.raises(AirflowSkipException, match="only when asked"):
        Step(step="select", topic="orders").execute(
            {"run_id": "scheduled__1", "dag_run": SimpleNamespace(run_type="scheduled")}
        )
    context = {
        "run_id": "manual__2",
        "dag_run": SimpleNamespace(run_type="manual"),
        "params": {"from_date": "2024-06-01", "to_date": "2024-06-02"},
    }
    with pytest.raises(AirflowSkipException, match="nothing filed under"):
        Step(step="select", topic="orders").execute(context)  # asked, but nothing to rebuild
    [(_, _, dates, run_id)] = selected
    assert [d.isoformat() for d in dates] == ["2024-06-01", "2024-06-02"]
    assert run_id == "manual__2"


def test_a_seal_run_with_nothing_to_seal_stops_at_select_in_the_triggerer(monkeypatch):
    """Each date an archive run announces starts a seal run, and late records amend dates at
    almost every run of a busy topic: most of those runs find nothing to seal, and skip from
    the triggerer, with no worker process. A run that names no date fails at once."""
    chosen = []
    monkeypatch.setattr(steps, "find_topic", lambda topic: SimpleNamespace(topic=topic))
    monkeypatch.setattr(steps, "storage", lambda cfg: "<storage>")
    monkeypatch.setattr(steps, "catalog", lambda: None)
    monkeypatch.setattr(seal, "select", lambda *args: chosen.append(args))

    [skipped] = events(StepTrigger("seal_select", "orders", {}), partition_key="2024-06-01")

    assert isinstance(skipped, TaskSkippedEvent)
    assert chosen == [
        ("<storage>", SimpleNamespace(topic="orders"), date(2024, 6, 1), "manual__1", None)
    ]
    [handed] = events(StepTrigger("seal_select", "orders", {}))
    assert handed.payload["on_worker"].startswith("NoDate: this run names no date")
    context = {"run_id": "manual__2", "params": {}, "dag_run": SimpleNamespace(partition_key="")}
    with pytest.raises(AirflowFailException, match="names no date"):
        Step(step="seal_select", topic="orders", task_id="select").resume(context, handed.payload)


def test_the_trigger_serializes_with_no_secret_and_names_a_step_that_exists():
    kwargs = {"step": "verify", "topic": "orders", "upstream": {"planned": "plan"}}
    path, back = StepTrigger(**kwargs).serialize()
    assert path == "cairn_airflow.triggers.step.StepTrigger" and back == kwargs
    assert set(steps.STEPS) == set(steps.StepName.__args__)
    assert "verify" in steps.STEPS


def test_no_step_returns_a_bare_string():
    """A result the triggerer stored arrives as a JSON string and is decoded
    (`step_result.pulled`): a step returning a string would be decoded as JSON by mistake."""
    for name, step in steps.STEPS.items():
        returns = typing.get_type_hints(step)["return"]
        assert returns in (dict, bool) or typing.get_origin(returns) is list, (name, returns)
