"""The overview plugin's pages render from a real local archive (Airflow's login and run history
stubbed here; tests/integration/test_overview_page.py has the real ones), and a topic whose
archive cannot be read shows its error without hiding the others."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException
from fastapi import FastAPI
from fastapi.testclient import TestClient

import cairn_dags
import cairn_notifier
import cairn_overview
from cairn.storage.objects import Storage
from cairn.topics_file import load_topics
from cairn.views import status
from tests.unit.conftest import archive_records
from tests.unit.test_overview import SCHEMA, order, rec
from tests.unit.test_status import record


@pytest.fixture
def client(tmp_path, monkeypatch) -> TestClient:
    entries = [
        {"topic": t, "format": "json", "schema": "order.avsc", "archive_root": root}
        | {"event_time": {"field": "ts", "encoding": "iso8601"}}
        for t, root in (("orders.eu", f"file://{tmp_path}/archive"), ("broken", "file:///nope"))
    ]
    entries.append({"pattern": r"clicks\..+", "format": "raw"})  # no topic matches yet
    (tmp_path / "order.avsc").write_text(json.dumps(SCHEMA))
    (tmp_path / "topics.yaml").write_text(json.dumps({"topics": entries}))
    monkeypatch.setattr(cairn_dags, "TOPICS_FILE", tmp_path / "topics.yaml")
    topics = [t for t in load_topics(tmp_path / "topics.yaml").topics if t.topic]
    good = topics[0]
    archive = Storage(good.root.storage_url)
    records = [
        r._replace(topic="orders.eu")
        for r in (rec(0, 0, order(0, "2024-06-01T10:00:00Z")), rec(0, 1, b"{not json"))
    ]
    archive_records(archive, good, datetime.now(UTC), records)
    for seq, lag in ((1, 40), (2, 0)):
        status.save(archive, record(seq, topic="orders.eu", quarantined=1, offset_lag={0: lag}))

    def storage(cfg):
        if cfg.topic == "broken":
            raise PermissionError("no access to the bucket")
        return Storage(cfg.root.storage_url)

    monkeypatch.setattr(cairn_overview, "readable_topics", lambda user: topics)
    monkeypatch.setattr(cairn_overview, "storage", storage)
    monkeypatch.setattr(cairn_overview, "recent_runs", lambda dag_id, limit: [])
    cairn_overview.app.dependency_overrides[cairn_overview.page_user] = lambda: object()
    yield TestClient(cairn_overview.app)
    cairn_overview.app.dependency_overrides.clear()


def test_index_lists_every_topic_and_isolates_a_broken_one(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    assert 'data-topic="orders.eu"' in page.text and "<svg" in page.text  # the lag trend
    assert "archive unreadable: PermissionError: no access to the bucket" in page.text
    assert 'href="/dags/archive__orders.eu"' in page.text
    assert "Pattern entries (<code>clicks\\..+</code>)" in page.text
    assert "up to 5 minutes after it is created" in page.text


def test_topic_page_shows_runs_and_configuration(client) -> None:
    page = client.get("/topics/orders.eu")
    assert page.status_code == 200
    assert "Recent runs" in page.text and "run2" in page.text
    assert "topic: orders.eu" in page.text  # the configuration as YAML
    assert client.get("/topics/unknown").status_code == 404


def test_the_prefix_without_its_slash_redirects_to_the_index():
    """Mounted as Airflow's api-server mounts plugins (`init_plugins`): app and root middleware."""
    root = FastAPI()
    plugin = cairn_overview.CairnOverviewPlugin
    for mounted in plugin.fastapi_apps:
        root.mount(mounted["url_prefix"], mounted["app"])
    for middleware in plugin.fastapi_root_middlewares:
        root.add_middleware(middleware["middleware"])
    browser = TestClient(root, follow_redirects=False)

    assert browser.get("/cairn").headers["location"] == "/cairn/"
    assert browser.get("/cairn?x=1").headers["location"] == "/cairn/?x=1"
    assert browser.get("/cairn").status_code == 307
    assert browser.get("/cairnx").status_code == 404


def test_a_broken_topics_file_shows_as_misconfigured_and_in_the_metrics(
    client, tmp_path, monkeypatch
) -> None:
    folder = tmp_path / "topics.d"
    folder.mkdir()
    (tmp_path / "topics.yaml").rename(folder / "shop.yaml")
    (tmp_path / "order.avsc").rename(folder / "order.avsc")
    (folder / "team-b.yaml").write_text("topics:\n  - topic: b\n    format: raw\n   seal: x\n")
    monkeypatch.setattr(cairn_dags, "TOPICS_FILE", folder)
    cairn_overview.app.dependency_overrides[cairn_overview.metrics_reader] = lambda: None

    page = client.get("/")
    assert page.status_code == 200
    assert 'data-topic="orders.eu"' in page.text  # the other file's topics still show
    assert f"<code>{folder / 'team-b.yaml'}, line 4</code>" in page.text
    assert "not valid YAML at column 4: expected &lt;block end&gt;" in page.text

    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert f'cairn_config_errors{{file="{folder / "team-b.yaml"}"}} 1.0' in scrape.text
    assert f'cairn_config_errors{{file="{folder / "shop.yaml"}"}} 0.0' in scrape.text
    assert 'cairn_offset_lag{partition="0",topic="orders.eu"}' in scrape.text


def test_a_topic_two_patterns_match_shows_as_misconfigured_in_the_page_metrics_and_alert(
    client, tmp_path, monkeypatch
) -> None:
    """Patterns resolve against the topic names discovery cached; the overlap is named with
    both patterns wherever mistakes show, and the patterns' other topics still get DAGs."""
    topics = tmp_path / "topics.yaml"
    entries = json.loads(topics.read_text())["topics"]
    entries.append({"pattern": r".+\.us", "format": "raw"})  # overlaps clicks\..+ on clicks.us
    topics.write_text(json.dumps({"topics": entries}))
    variables = {cairn_dags.TOPICS_VARIABLE: json.dumps(["clicks.eu", "clicks.us", "orders.us"])}
    monkeypatch.setattr(
        cairn_dags.Variable, "get", lambda key, default=None: variables.get(key, default)
    )
    monkeypatch.setattr(cairn_dags.Variable, "set", variables.__setitem__)
    cairn_overview.app.dependency_overrides[cairn_overview.metrics_reader] = lambda: None

    assert "clicks.us" not in [c.topic for c in cairn_dags.configured_topics()]
    assert {"clicks.eu", "orders.us"} <= {c.topic for c in cairn_dags.configured_topics()}
    page = client.get("/")
    assert page.status_code == 200
    assert "topic &#39;clicks.us&#39;" in page.text
    assert "matched by pattern &#39;clicks\\\\..+&#39;" in page.text
    assert f"pattern &#39;.+\\\\.us&#39; ({topics}, line 1)" in page.text
    scrape = client.get("/metrics")
    assert f'cairn_config_errors{{file="{topics}"}} 1.0' in scrape.text
    with pytest.raises(AirflowFailException, match=r"topic 'clicks.us': pattern: matched by"):
        cairn_notifier.check_config({})
