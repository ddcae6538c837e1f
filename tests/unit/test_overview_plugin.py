"""The overview plugin's pages render from a real local archive (Airflow's login and run history
stubbed here; tests/integration/test_overview_page.py has the real ones), and a topic whose
archive cannot be read shows its error without hiding the others."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cairn.pipeline import run_record
from cairn.storage.objects import Storage
from cairn.topics_file import TopicConfigError, load_topics
from cairn_airflow import dag_topics
from cairn_airflow.notifications import notifier
from cairn_airflow.pages import app as pages
from cairn_airflow.plugin import CairnPlugin
from tests.unit.conftest import archive_records
from tests.unit.test_overview import SCHEMA, order, rec
from tests.unit.test_run_record import record

REAL_READABLE_TOPICS = pages.readable_topics


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
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", tmp_path / "topics.yaml")
    topics = [t for t in load_topics(tmp_path / "topics.yaml").topics if t.topic]
    good = topics[0]
    archive = Storage(good.root.storage_url)
    records = [
        r._replace(topic="orders.eu")
        for r in (rec(0, 0, order(0, "2024-06-01T10:00:00Z")), rec(0, 1, b"{not json"))
    ]
    archive_records(archive, good, datetime.now(UTC), records)
    for seq, lag in ((1, 40), (2, 0)):
        run_record.save(archive, record(seq, topic="orders.eu", quarantined=1, offset_lag={0: lag}))

    def storage(cfg):
        if cfg.topic == "broken":
            raise PermissionError("no access to the bucket")
        return Storage(cfg.root.storage_url)

    monkeypatch.setattr(pages, "readable_topics", lambda user: topics)
    monkeypatch.setattr(pages, "may_read", lambda user, topic: True)
    monkeypatch.setattr(pages, "storage", storage)
    monkeypatch.setattr(pages, "recent_runs", lambda dag_id, limit: [])
    monkeypatch.setattr(pages, "last_failure", lambda dag_id: None)
    pages.app.dependency_overrides[pages.page_user] = lambda: object()
    yield TestClient(pages.app)
    pages.app.dependency_overrides.clear()


def test_index_lists_every_topic_and_isolates_a_broken_one(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    assert 'data-topic="orders.eu"' in page.text and "<svg" in page.text  # the lag trend
    assert "archive unreadable: PermissionError: no access to the bucket" in page.text
    assert 'href="/dags/archive__orders.eu"' in page.text
    assert 'href="/dags/rebuild__orders.eu"' in page.text
    assert 'href="/dags/seal__orders.eu">seal DAG</a>' in page.text
    assert "Pattern entries (<code>clicks\\..+</code>)" in page.text
    assert "up to 5 minutes after it is created" in page.text


def test_topic_page_shows_runs_and_configuration(client) -> None:
    page = client.get("/topics/orders.eu")
    assert page.status_code == 200
    assert "Recent runs" in page.text and "run2" in page.text
    assert "topic: orders.eu" in page.text  # the configuration as YAML
    assert 'href="/dags/seal__orders.eu">seal DAG</a>' in page.text
    assert client.get("/topics/unknown").status_code == 404


def test_the_prefix_without_its_slash_redirects_to_the_index():
    """Mounted as Airflow's api-server mounts plugins (`init_plugins`): app and root middleware."""
    root = FastAPI()
    plugin = CairnPlugin
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
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", folder)
    pages.app.dependency_overrides[pages.metrics_reader] = lambda: None

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
    variables = {dag_topics.TOPICS_VARIABLE: json.dumps(["clicks.eu", "clicks.us", "orders.us"])}
    monkeypatch.setattr(
        dag_topics.Variable, "get", lambda key, default=None: variables.get(key, default)
    )
    monkeypatch.setattr(dag_topics.Variable, "set", variables.__setitem__)
    pages.app.dependency_overrides[pages.metrics_reader] = lambda: None

    assert "clicks.us" not in [c.topic for c in dag_topics.configured_topics()]
    assert {"clicks.eu", "orders.us"} <= {c.topic for c in dag_topics.configured_topics()}
    page = client.get("/")
    assert page.status_code == 200
    assert "topic &#39;clicks.us&#39;" in page.text
    assert "matched by pattern &#39;clicks\\\\..+&#39;" in page.text
    assert f"pattern &#39;.+\\\\.us&#39; ({topics}, line 1)" in page.text
    scrape = client.get("/metrics")
    assert f'cairn_config_errors{{file="{topics}"}} 1.0' in scrape.text
    with pytest.raises(AirflowFailException, match=r"topic 'clicks.us': pattern: matched by"):
        notifier.check_config({})


def test_the_cause_of_a_topics_last_failed_run_shows_beside_it(client, monkeypatch) -> None:
    cause = "ConnectionMissing: topic 'broken': no Airflow connection 'archive_s3'"
    causes = {"archive__broken": cause}
    monkeypatch.setattr(pages, "last_failure", causes.get)

    page = client.get("/")

    row = page.text[page.text.index('data-topic="broken"') :]  # its archive unreadable too
    assert "last failed run: ConnectionMissing: topic &#39;broken&#39;: no Airflow" in row
    assert page.text.count("last failed run:") == 1  # the other topic's last run did not fail


def test_a_missing_topics_file_shows_as_misconfigured_and_in_the_metrics(
    client, tmp_path, monkeypatch
) -> None:
    """`CAIRN_TOPICS_FILE` naming nothing: the pages still render and say so."""
    missing = tmp_path / "no-such-topics.d"
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", missing)
    monkeypatch.setattr(pages, "readable_topics", REAL_READABLE_TOPICS)
    anyone = SimpleNamespace(is_authorized_dag=lambda **_: True)
    monkeypatch.setattr(pages, "get_auth_manager", lambda: anyone)
    pages.app.dependency_overrides[pages.metrics_reader] = lambda: None

    page = client.get("/")
    assert page.status_code == 200
    assert f"<code>{missing}</code>" in page.text
    assert "no such file or folder; create it, or point CAIRN_TOPICS_FILE" in page.text
    assert "No topics configured" in page.text

    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert f'cairn_config_errors{{file="{missing}"}} 1.0' in scrape.text


def test_misconfigured_entries_show_only_to_users_who_may_read_what_they_describe(
    monkeypatch,
) -> None:
    """A topic's entry follows its archive DAG's permission; an error that names no topic
    (pattern, unnamed entry, defaults, a broken file) needs permission on every DAG."""
    errors = [
        TopicConfigError("topic 'orders.eu'", "seal", "bad", "a.yaml", 3),
        TopicConfigError("topic 'clicks'", "", "also defined at b.yaml", "a.yaml", 9),
        TopicConfigError("pattern 'orders\\..+'", "format", "bad", "a.yaml", 12),
        TopicConfigError("entry #4", "", "needs topic or pattern", "a.yaml", 15),
        TopicConfigError("file", "", "not valid YAML", "b.yaml", 2),
    ]

    class AuthManager:
        def __init__(self, dags: set[str] | None) -> None:
            self.dags = dags  # None: every DAG

        def is_authorized_dag(self, *, method, user, details=None) -> bool:
            assert method == "GET" and user == "someone"
            if details is None:
                return self.dags is None
            return self.dags is None or details.id in self.dags

    def seen(dags: set[str] | None) -> list[str]:
        monkeypatch.setattr(pages, "get_auth_manager", lambda: AuthManager(dags))
        return [e.entry for e in pages.readable_errors("someone", errors)]

    assert seen({"archive__orders.eu"}) == ["topic 'orders.eu'"]
    assert seen({"archive__clicks", "rebuild__orders.eu"}) == ["topic 'clicks'"]
    assert seen(set()) == []
    assert seen(None) == [e.entry for e in errors]
    assert pages.readable_errors(None, errors) == errors  # the scrape token
