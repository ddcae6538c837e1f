"""The overview page and the Prometheus endpoint in the running Airflow 3 api-server, seen as a
user sees them: a real headless Chromium logged in with the UI's `_token` cookie, after one
archive run of a topic with a few unparseable records. Screenshots go to tests/output/overview/.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from cairn_stack.demo import create_topic, produce, sample_events
from tests.conftest import E2E_OVERVIEW, ROOT
from tests.integration import chromium

DAG_ID = "archive__e2e.overview"
OUTPUT = ROOT / "output" / "overview"
GOOD = {0: 120, 1: 80}
BAD = 6  # on partition 0, after its good records


@pytest.fixture(scope="module", autouse=True)
def browser() -> None:
    """A missing browser fails these tests: `make test` installs it, skipping would hide that."""
    if chromium.binary() is None:
        pytest.fail("the overview page's tests need Debian's chromium: `make chromium` as root")


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) without following redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=60) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


@pytest.fixture(scope="module")
def archived(airflow, kafka) -> dict:
    """E2E_OVERVIEW archived: 200 good records and 6 unparseable ones, in two runs (the cap is
    110 records per partition), so the lag has a trend."""
    create_topic(kafka, E2E_OVERVIEW, partitions=2)
    now = datetime.now(UTC) - timedelta(minutes=5)
    for p, count in GOOD.items():
        produce(kafka, E2E_OVERVIEW, sample_events(count, now, seed=p), partition=p)
    bad = [b"not json at all"] * (BAD - 2) + [b'{"event_id": 7}', b"[1, 2]"]
    produce(kafka, E2E_OVERVIEW, bad, partition=0)
    airflow.wait_for_dag(DAG_ID)
    airflow.trigger(DAG_ID)
    runs = airflow.wait_for_runs(DAG_ID, timeout=900)
    assert all(r["state"] == "success" for r in runs), runs
    return {"position": {0: GOOD[0] + BAD, 1: GOOD[1]}}


def test_the_address_without_its_slash_redirects_to_the_page(airflow) -> None:
    code, headers, _ = fetch(airflow.base + "/cairn")
    assert (code, headers["location"]) == (307, "/cairn/")


def test_no_data_without_login(airflow, archived) -> None:
    base = airflow.base
    for path in ("/cairn/", f"/cairn/topics/{E2E_OVERVIEW}", "/cairn/metrics"):
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Cookie": "_token=forged"}):
            code, reply_headers, body = fetch(base + path, headers)
            assert code in (302, 307, 401, 403), (path, headers, code)
            assert E2E_OVERVIEW not in body and "cairn_" not in body, (path, headers)
            if code in (302, 307):  # a browser is sent to Airflow's login, and back after it
                assert "login" in reply_headers["location"], reply_headers


def test_prometheus_endpoint_with_the_scrape_token(airflow, archived, stack_settings) -> None:
    token = (stack_settings.state_dir / "airflow" / "metrics_token").read_text()
    code, headers, body = fetch(
        airflow.base + "/cairn/metrics", {"Authorization": f"Bearer {token}"}
    )
    assert code == 200, body
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {}
    for line in body.splitlines():
        if not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            values[series] = float(value)
    topic = f'topic="{E2E_OVERVIEW}"'
    archived_total = {
        p: values[f'cairn_records_archived_total{{partition="{p}",{topic}}}'] for p in (0, 1)
    }
    assert archived_total == {0: GOOD[0] + BAD, 1: GOOD[1]}
    assert values[f'cairn_records_quarantined_total{{partition="0",{topic}}}'] == BAD
    assert values[f'cairn_offset_lag{{partition="1",{topic}}}'] == 0
    assert "# TYPE cairn_records_archived_total counter" in body
    assert "# TYPE cairn_offset_lag gauge" in body


def test_dags_read_as_the_topic(airflow, archived) -> None:
    dag = airflow.call("GET", f"/api/v2/dags/{DAG_ID}/details")
    assert dag["dag_display_name"] == f"{E2E_OVERVIEW} · archive"
    assert f"topic: {E2E_OVERVIEW}" in dag["doc_md"] and "```yaml" in dag["doc_md"]
    assert f"/cairn/topics/{E2E_OVERVIEW}" in dag["doc_md"]
    rebuild = airflow.call("GET", "/api/v2/dags/rebuild__e2e.overview/details")
    assert rebuild["dag_display_name"] == f"{E2E_OVERVIEW} · rebuild"


def test_overview_in_chromium(airflow, archived, tmp_path) -> None:
    token = airflow.call(
        "POST", "/auth/token", {"username": airflow.user, "password": airflow.password}
    )["access_token"]
    position = sum(archived["position"].values())
    with chromium.Chromium(tmp_path / "chromium", width=1500, height=760) as browser:
        browser.set_cookie(airflow.base + "/", "_token", token)

        assert browser.open(f"{airflow.base}/cairn/") == 200
        cells = browser.evaluate(
            f"[...document.querySelector('tr[data-topic=\"{E2E_OVERVIEW}\"]').cells]"
            ".map(c => c.innerText.trim())"
        )
        topic, position_cell, archived_cell, offset_lag, _time_lag, fresh, last_run = cells[:7]
        assert topic == E2E_OVERVIEW
        assert position_cell.split()[0] == f"{position:,}" and "2 partitions" in position_cell
        assert archived_cell == f"{position:,}"
        assert offset_lag == "0" and last_run.startswith("success")
        # p50 / p95 of how long its records waited; a run_on: schedule topic has no limit
        assert re.fullmatch(r"\d[\w ]* / \d[\w ]*", fresh), fresh  # e.g. "1m 16s / 1m 58s"
        quarantined = cells[8].split()
        assert quarantined[0] == str(BAD) and quarantined[1] == f"{BAD / position:.2%}"
        assert "archive DAG" in cells[-1] and "rebuild DAG" in cells[-1]
        trend = f"document.querySelectorAll('tr[data-topic=\"{E2E_OVERVIEW}\"] svg.spark').length"
        assert browser.evaluate(trend) >= 1  # the lag over the two runs
        browser.screenshot(OUTPUT / "overview.png")

        assert browser.open(f"{airflow.base}/cairn/topics/{E2E_OVERVIEW}") == 200
        text = browser.text()
        assert "Recent runs" in text and "Files per date" in text
        assert f"{position:,}" in text
        reasons = text.split("Quarantine reasons", 1)[1]
        assert re.search(r"^4\s", reasons, re.M), reasons  # "not json at all", four times
        assert f"topic: {E2E_OVERVIEW}" in text  # the configuration
        browser.screenshot(OUTPUT / "topic.png")

        # Inside the Airflow UI: the nav entry's page embeds the overview.
        assert browser.open(f"{airflow.base}/plugin/cairn") == 200
        embedded = (
            "(() => { const f = document.querySelector('iframe');"
            " return f && f.contentDocument && f.contentDocument.body"
            " ? f.contentDocument.body.innerText : ''; })()"
        )
        assert E2E_OVERVIEW in browser.wait_for(embedded, timeout=90)
        browser.screenshot(OUTPUT / "airflow_ui.png", full_page=False)
    print(json.dumps({"screenshots": sorted(str(p) for p in OUTPUT.glob("*.png"))}))


def import_errors(airflow) -> str:
    found = airflow.call("GET", "/api/v2/importErrors")["import_errors"]
    return "\n".join(e["stack_trace"] for e in found if e["filename"].endswith("config_check.py"))


def wait_until(check, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(3)
    return found


def test_a_broken_topics_file_shows_everywhere_and_stops_only_its_topics(
    airflow, archived, tmp_path
):
    """A file that is not YAML and a bad entry in another, added to the running stack's topics
    folder: the Airflow UI's import errors, the page, the metrics and an alert name file, line
    and field; the other topics' DAGs still run; removed, every trace is gone."""
    folder = airflow.settings.topics_file
    broken, bad = folder / "team-b.yaml", folder / "team-c.yaml"
    broken.write_text("topics:\n  - topic: e2e.b\n    format: raw\n   seal: x\n")
    bad.write_text("topics:\n  - topic: e2e.c\n    format: raw\n    codec: lz4\n")
    token = (airflow.settings.state_dir / "airflow" / "metrics_token").read_text()
    auth = {"Authorization": f"Bearer {token}"}
    try:
        errors = wait_until(
            lambda: "team-c.yaml" in import_errors(airflow) and import_errors(airflow)
        )
        assert f"{broken}, line 4: not valid YAML at column 4" in errors
        assert f"{bad}, line 4: topic 'e2e.c': codec: Input should be" in errors

        metrics = fetch(airflow.base + "/cairn/metrics", auth)[2]
        assert f'cairn_config_errors{{file="{broken}"}} 1.0' in metrics
        assert f'cairn_config_errors{{file="{folder / "e2e.yaml"}"}} 0.0' in metrics
        user = airflow.call(
            "POST", "/auth/token", {"username": airflow.user, "password": airflow.password}
        )["access_token"]
        with chromium.Chromium(tmp_path / "chromium", width=1500, height=760) as browser:
            browser.set_cookie(airflow.base + "/", "_token", user)
            assert browser.open(f"{airflow.base}/cairn/") == 200
            rows = browser.evaluate(
                "[...document.querySelectorAll('#misconfigured tbody tr')]"
                ".map(r => [...r.cells].map(c => c.innerText.trim()))"
            )
            assert [f"{bad}, line 4", "topic 'e2e.c'", "codec"] in [r[:3] for r in rows]
            assert [f"{broken}, line 4", "file", "—"] in [r[:3] for r in rows]
            assert E2E_OVERVIEW in browser.text()  # the other topics are still listed
            browser.screenshot(OUTPUT / "misconfigured.png")

        airflow.wait_for_dag("cairn_config_watch")
        airflow.trigger("cairn_config_watch")
        (run,) = airflow.wait_for_runs("cairn_config_watch", timeout=300)[-1:]
        assert run["state"] == "failed"
        alerts = airflow.settings.alerts_file.read_text().splitlines()
        reasons = [json.loads(a)["reason"] for a in alerts if "cairn_config_watch" in a]
        assert any(f"{bad}, line 4: topic 'e2e.c': codec" in r for r in reasons), reasons

        airflow.trigger(DAG_ID)  # the other topics still archive
        assert airflow.wait_for_runs(DAG_ID, timeout=600)[-1]["state"] == "success"
    finally:
        broken.unlink()
        bad.unlink()
    wait_until(lambda: import_errors(airflow) == "")
    assert "cairn_config_errors" in fetch(airflow.base + "/cairn/metrics", auth)[2]
    assert "team-b.yaml" not in fetch(airflow.base + "/cairn/metrics", auth)[2]
