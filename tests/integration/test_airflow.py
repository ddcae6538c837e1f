"""Through the real Airflow 3 scheduler, with the Spark connection pointing at the Spark Connect
server and the archive on S3: a triggered run archives the topic, and a run stopped by the
per-run cap triggers the next one at once until the backlog is drained; the rebuild DAG runs
by backfill, by clearing, and by a REST trigger with no logical date; the docs' REST examples
and seal loop run as written; a root without its AWS connection fails at once, its
cause on the overview page."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

from cairn.protocol import tokens
from cairn.storage.objects import Storage
from cairn_airflow.priority import lag_variable
from cairn_stack import services
from cairn_stack.demo import create_topic, produce, sample_events
from tests.conftest import E2E_FIXED, E2E_PREFIX, E2E_TOPIC, e2e_topics
from tests.integration.conftest import coords, read_archive, stack_env
from tests.integration.test_archive import NOW, all_offsets, assert_exactly_once
from tests.integration.test_rebuild import NOON as REBUILD_NOON
from tests.integration.test_rebuild import folders_of, sent_late

DAG_ID = "archive__e2e.orders"
REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_triggered_run_drains_the_backlog_on_spark_connect_into_s3(
    airflow, kafka, s3, stack_settings
) -> None:
    create_topic(kafka, E2E_TOPIC, partitions=2)
    for p in range(2):
        produce(kafka, E2E_TOPIC, sample_events(100, NOW, seed=p), partition=p)
    airflow.wait_for_dag(DAG_ID)

    airflow.trigger(DAG_ID)
    runs = airflow.wait_for_runs(DAG_ID, timeout=900)

    assert all(r["state"] == "success" for r in runs), runs
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    committed = tokens.list_tokens(storage, E2E_TOPIC)
    # cap 60 per partition: 100 records each take two runs, the second triggered by the first
    assert [t.next_offsets for t in committed] == [{0: 60, 1: 60}, {0: 100, 1: 100}]
    contents = read_archive(storage, E2E_TOPIC)
    assert_exactly_once(contents, all_offsets({0: 100, 1: 100}))
    assert len(coords(contents.backup)) == 200
    # The stack's connection asks for SSE-S3: the Spark job's files, the manifests, the tokens
    # and the published copies all carry it.
    bucket = stack_settings.bucket
    for key in storage.list():
        head = storage.backend.fs.call_s3("head_object", Bucket=bucket, Key=f"{E2E_PREFIX}/{key}")
        assert head.get("ServerSideEncryption") == "AES256", key

    by_run = {t.run_id: t for t in committed}
    summaries = [
        airflow.xcom(DAG_ID, r["dag_run_id"], "commit") for r in runs if r["dag_run_id"] in by_run
    ]
    first = next(s for s in summaries if s["seq"] == 1)
    assert first["ranges"] == {"0": [0, 60], "1": [0, 60]}
    assert first["counts"]["backup"] == 120 and first["more_waiting"] is True
    assert first["offset_lag"] == {"0": 40, "1": 40} and first["time_lag_seconds"] > 0
    # task logs reach the UI from the shared log folder (the scheduler serves none itself)
    run_id = next(r["dag_run_id"] for r in runs if by_run.get(r["dag_run_id"]) == committed[0])
    assert "run summary" in airflow.task_log(DAG_ID, run_id, "commit")
    # The stack's Spark connection is a Spark Connect one: the task deferred to a job shared on
    # the long-lived server (the triggerer ran it), and nothing was spark-submitted.
    spark_log = airflow.task_log(DAG_ID, run_id, "archive")
    assert (
        f"archive job shared on the Spark Connect server sc://{stack_settings.host}:" in spark_log
    )
    assert re.search(r"wrote \d+ files for 120 records", spark_log), spark_log
    assert "spark-submit" not in spark_log.lower()
    # The archive tasks are in the pool the stack made (a retry would run its own job there).
    # Their runs share jobs from the triggerer and wait for no slot, so the commits record no
    # lag to order the pool by (cairn_airflow.steps._remember_lag): the run the first one
    # triggered keeps the plain weight, whatever the lag was.
    pool = airflow.call("GET", f"/api/v2/pools/{stack_settings.spark_pool}")
    assert pool["slots"] == stack_settings.spark_pool_slots
    second = next(r["dag_run_id"] for r in runs if r["triggered_by"] == "operator")
    archive = airflow.call(
        "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(second)}/taskInstances/archive"
    )
    assert archive["pool"] == stack_settings.spark_pool
    assert archive["priority_weight"] == 1
    recorded = airflow.call(
        "GET", f"/api/v2/variables?variable_key_pattern={quote(lag_variable(E2E_TOPIC))}"
    )
    assert recorded["total_entries"] == 0, recorded


def test_rebuild_dag_fixes_a_parser_bug_when_its_runs_are_cleared(
    airflow, kafka, s3, stack_settings
) -> None:
    """Archive with the wrong event-time field, backfill the rebuild DAG over the affected dates
    (same output: the parser is still wrong), fix the field, clear those runs: right output."""
    create_topic(kafka, E2E_FIXED, partitions=1)
    times = {f"e{i}": REBUILD_NOON + timedelta(minutes=37 * i) for i in range(20)}
    produce(kafka, E2E_FIXED, [sent_late(i, ts) for i, ts in enumerate(times.values())])
    archive_id = "archive__e2e.fixed"
    airflow.wait_for_dag(archive_id)
    airflow.trigger(archive_id)
    assert all(r["state"] == "success" for r in airflow.wait_for_runs(archive_id, timeout=600))
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    assert folders_of(read_archive(storage, E2E_FIXED)) != expected_folders(times)
    dag_id = "rebuild__e2e.fixed"
    airflow.wait_for_dag(dag_id)

    airflow.backfill(dag_id, "2024-05-01", "2024-05-02")
    runs = [r for r in airflow.wait_for_runs(dag_id, timeout=900) if r["run_type"] == "backfill"]
    assert sorted(r["logical_date"][:10] for r in runs) == ["2024-05-01", "2024-05-02"]
    assert folders_of(read_archive(storage, E2E_FIXED)) != expected_folders(times)

    (airflow.settings.topics_file / "e2e.yaml").write_text(
        e2e_topics(stack_settings, fixed_field="ts")
    )
    for r in runs:
        airflow.clear(dag_id, r["dag_run_id"])
    rerun = airflow.wait_for_runs(dag_id, timeout=900)

    assert all(r["state"] == "success" for r in rerun), rerun
    contents = read_archive(storage, E2E_FIXED)
    assert folders_of(contents) == expected_folders(times)
    assert_exactly_once(contents, all_offsets({0: 20}))
    summary = airflow.xcom(dag_id, runs[0]["dag_run_id"], "commit")
    assert summary["rebuilt"]["dates"] in (["2024-05-01"], ["2024-05-02"])
    assert summary["kind"] == "rebuild" and summary["files_written"] > 0

    # Unpaused, the DAG also got a run of its own for the latest day: it rebuilt nothing.
    scheduled = wait_for_scheduled_run(airflow, dag_id)
    assert scheduled["state"] == "success"
    rebuilds = [t for t in tokens.list_tokens(storage, E2E_FIXED) if t.kind == "rebuild"]
    assert len(rebuilds) == 4  # two backfill runs, each cleared once; none scheduled


def archive_fixed(airflow, kafka) -> str:
    """Archive a few more records of E2E_FIXED on 2024-05-01 (so the test also runs alone);
    the id of its rebuild DAG, ready."""
    create_topic(kafka, E2E_FIXED, partitions=1)
    produce(kafka, E2E_FIXED, [sent_late(i, REBUILD_NOON + timedelta(hours=i)) for i in range(4)])
    archive_id, dag_id = "archive__e2e.fixed", "rebuild__e2e.fixed"
    airflow.wait_for_dag(archive_id)
    airflow.trigger(archive_id)
    assert all(r["state"] == "success" for r in airflow.wait_for_runs(archive_id, timeout=600))
    airflow.wait_for_dag(dag_id)
    return dag_id


def test_rebuild_triggered_through_rest_without_a_logical_date(
    airflow, kafka, s3, stack_settings
) -> None:
    """`POST /api/v2/dags/rebuild__<topic>/dagRuns` with `logical_date: null` (no data interval)
    rebuilds the range its conf names as one operation; a reversed range fails at once, its
    cause in the log, with no retry."""
    dag_id = archive_fixed(airflow, kafka)
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)

    run_id = airflow.trigger(dag_id, {"from_date": "2024-05-01", "to_date": "2024-05-02"})
    runs = {r["dag_run_id"]: r for r in airflow.wait_for_runs(dag_id, timeout=900)}

    assert runs[run_id]["state"] == "success" and runs[run_id]["logical_date"] is None
    done = airflow.xcom(dag_id, run_id, "commit")
    assert done["kind"] == "rebuild" and done["rebuilt"]["dates"] == ["2024-05-01", "2024-05-02"]
    (token,) = [t for t in tokens.list_tokens(storage, E2E_FIXED) if t.run_id == run_id]
    assert token.kind == "rebuild" and token.adds

    reversed_id = airflow.trigger(dag_id, {"from_date": "2024-05-02", "to_date": "2024-05-01"})
    runs = {r["dag_run_id"]: r for r in airflow.wait_for_runs(dag_id, timeout=300)}

    assert runs[reversed_id]["state"] == "failed"
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(reversed_id)}/taskInstances/select"
    select = airflow.call("GET", path)
    assert select["state"] == "failed" and select["try_number"] == 1  # no up_for_retry
    log = airflow.task_log(dag_id, reversed_id, "select")
    assert "NoDates: to_date 2024-05-01 is before from_date 2024-05-02" in log
    assert all(t.run_id != reversed_id for t in tokens.list_tokens(storage, E2E_FIXED))


def test_the_documented_backfill_command_rebuilds_a_date_that_already_has_a_run(
    airflow, kafka, s3, stack_settings
) -> None:
    """docs/recovery.md's command (`airflow backfill create … --reprocess-behavior completed`,
    run as `cairn_stack airflow` runs it) rebuilds a date again; Airflow's default behavior skips
    it."""
    dag_id = archive_fixed(airflow, kafka)
    storage = Storage(f"s3://{stack_settings.bucket}/{E2E_PREFIX}", **s3)
    day = REBUILD_NOON.date().isoformat()

    def backfill(*behavior: str) -> int:
        """Run the command, wait for its runs; how many rebuilds of `day` are committed."""
        command = ["backfill", "create", "--dag-id", dag_id, "--from-date", day, "--to-date", day]
        subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), *command, *behavior],
            env={**os.environ, **services.airflow_env(airflow.settings)},
            check=True,
            timeout=300,
        )
        airflow.wait_for_runs(dag_id, timeout=900)
        airflow.wait_for_backfills(dag_id, timeout=120)
        rebuilt = [t.rebuilt for t in tokens.list_tokens(storage, E2E_FIXED) if t.rebuilt]
        return sum(r.dates == [REBUILD_NOON.date()] for r in rebuilt)

    first = backfill("--reprocess-behavior", "completed")  # the date has a run after this
    assert first >= 1
    assert backfill("--reprocess-behavior", "completed") == first + 1
    assert backfill() == first + 1  # `none`, the default: the date has a run, nothing happens


def test_the_documented_rest_examples_trigger_each_dag_kind(airflow, kafka, s3, stack_settings):
    """docs/operating.md "Triggering through the REST API", run by bash as written (the stack's
    address, and this stack's topic and dates in place of the demo's): an archive, a rebuild and
    a seal run, each with no logical date, all succeed."""
    airflow.wait_for_dag("seal__e2e.fixed")  # unpaused: Airflow drops asset events for paused DAGs
    dag_id = archive_fixed(airflow, kafka)
    airflow.wait_for_runs("seal__e2e.fixed", timeout=900)  # the seal the archive run started
    script = docs_block("trigger archive__").replace("http://127.0.0.1:8080", airflow.base)
    script = for_this_stack(script, airflow.settings)

    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    created = json_objects(done.stdout)
    assert [r["dag_id"] for r in created] == ["archive__e2e.fixed", dag_id, "seal__e2e.fixed"]
    for run in created:
        assert run["logical_date"] is None
        runs = {r["dag_run_id"]: r for r in airflow.wait_for_runs(run["dag_id"], timeout=900)}
        assert runs[run["dag_run_id"]]["state"] == "success", runs[run["dag_run_id"]]
    rebuilt = airflow.xcom(dag_id, created[1]["dag_run_id"], "commit")
    assert rebuilt["kind"] == "rebuild" and "2024-05-01" in rebuilt["rebuilt"]["dates"]


def test_the_documented_seal_loop_triggers_one_seal_run_per_date(
    airflow, kafka, s3, stack_settings
):
    """docs/table.md "Sealed dates": the loop of `cairn_stack airflow dags trigger seal__… -c …`,
    run by bash as written (this venv's Python, this stack's topic and dates), makes one run per
    date with that date as its param, and each succeeds."""
    dag_id = "seal__e2e.fixed"
    airflow.wait_for_dag(dag_id)  # unpaused before the archive run announces its date
    archive_fixed(airflow, kafka)
    before = {r["dag_run_id"] for r in airflow.wait_for_runs(dag_id, timeout=900)}
    script = docs_block("dags trigger seal__").replace(".venv/bin/python", sys.executable)
    script = for_this_stack(script, airflow.settings)

    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, **stack_env(airflow.settings)},
        timeout=300,
        check=True,
    )

    runs = [
        r
        for r in airflow.wait_for_runs(dag_id, timeout=900)
        if r["dag_run_id"] not in before and r["run_type"] == "manual"  # not by an asset event
    ]
    assert sorted(r["conf"]["date"] for r in runs) == ["2024-05-01", "2024-05-02", "2024-05-03"]
    assert all(r["state"] == "success" for r in runs), runs


def test_an_s3_root_without_its_connection_fails_at_once_its_cause_on_the_overview_page(
    airflow, stack_settings
) -> None:
    """An `s3://<conn>@…` root whose Airflow connection does not exist: `plan` fails on its
    first try (no up_for_retry), its log and the overview page naming the connection."""
    topic, conn_id = "e2e.noconn", "e2e_missing_s3"
    topics_file = airflow.settings.topics_file / "noconn.yaml"
    root = f"s3://{conn_id}@{stack_settings.bucket}/{E2E_PREFIX}-noconn"
    topics_file.write_text(
        f"topics:\n  - topic: {topic}\n    format: raw\n    archive_root: {root}\n"
    )
    try:
        dag_id = f"archive__{topic}"
        airflow.wait_for_dag(dag_id)
        run_id = airflow.trigger(dag_id)
        runs = {r["dag_run_id"]: r for r in airflow.wait_for_runs(dag_id, timeout=300)}

        assert runs[run_id]["state"] == "failed"
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/plan"
        plan = airflow.call("GET", path)
        assert plan["state"] == "failed" and plan["try_number"] == 1  # no up_for_retry
        cause = f"ConnectionMissing: topic '{topic}': no Airflow connection '{conn_id}'"
        assert cause in airflow.task_log(dag_id, run_id, "plan")
        page = overview_page(airflow)
        row = page[page.index(f'data-topic="{topic}"') :]
        assert "last failed run: " + cause in row
        assert f"airflow connections add {conn_id} --conn-type aws" in row
    finally:
        topics_file.unlink()


def docs_block(marker: str) -> str:
    """The one bash block of the README and docs/ that contains `marker`."""
    blocks = [
        block
        for doc in DOCS
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.DOTALL)
    ]
    (found,) = [b for b in blocks if marker in b]
    return found


def for_this_stack(script: str, settings) -> str:
    """A documented command for the demo stack, made to act on this stack's E2E_FIXED topic and the
    days it archived (2024-05-01 on) in place of the demo's, as this stack's user."""
    script = script.replace("cairn.demo.events", E2E_FIXED)
    for demo_day, day in (("11-19", "05-01"), ("11-20", "05-02"), ("11-21", "05-03")):
        script = script.replace(f"2026-{demo_day}", f"2024-{day}")
    login = json.dumps({"username": settings.airflow_user, "password": settings.airflow_password})
    return script.replace('{"username": "admin", "password": "admin"}', login)


def json_objects(text: str) -> list[dict]:
    """The JSON objects printed one after another (curl prints each reply without a newline)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return found


def overview_page(airflow) -> str:
    """`/cairn/` as the stack's user sees it (with an Airflow JWT, as the UI's cookie holds)."""
    login = {"username": airflow.user, "password": airflow.password}
    token = airflow.call("POST", "/auth/token", login)["access_token"]
    request = urllib.request.Request(
        airflow.base + "/cairn/", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return html.unescape(reply.read().decode())


def wait_for_scheduled_run(airflow, dag_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in airflow.runs(dag_id) if r["run_type"] == "scheduled"]
        if runs and runs[0]["state"] in ("success", "failed"):
            return runs[0]
        time.sleep(3)
    raise TimeoutError(f"no finished scheduled run of {dag_id} in {timeout}s")


def expected_folders(times: dict) -> dict[str, str]:
    return {e: ts.strftime("dt=%Y-%m-%d/hr=%H") for e, ts in times.items()}
