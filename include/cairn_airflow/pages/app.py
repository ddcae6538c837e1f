"""Cairn's pages in the Airflow UI and its Prometheus endpoint: a FastAPI app the api-server
mounts at `/cairn`, and a nav entry that shows it inside the UI (`/plugin/cairn`).

- `/cairn/` lists every configured topic (`/cairn` redirects there), with the cause of its
  last archive run if that failed on an error a retry cannot heal (`cairn_airflow.failures`),
  and every mistake in the topics files (file, line, entry, field) as a misconfigured topic;
  `/cairn/topics/<topic>` shows one topic. Both render server-side HTML from
  `cairn.views.overview` (the archive's own records) plus the Airflow runs' states; nothing
  runs in the browser.
- `/cairn/metrics` serves `cairn.views.metrics.samples` of every topic, and the mistakes per
  topics file (`cairn_config_errors{file=...}`), in Prometheus' text format.

Access (nothing is served without it):
- pages: the UI's login, as Airflow's own API checks it (`get_user`: the `_token` cookie the UI
  sets, or an `Authorization: Bearer` JWT). No valid login: a 302 to Airflow's login page
  (which returns here), with no data. A topic is shown only to users who may read its archive
  DAG (the auth manager's `is_authorized_dag`), so Airflow's DAG permissions decide; so is a
  mistake in its entry, and a mistake that names no topic (a pattern, a file that does not
  parse) only to users who may read every DAG.
- metrics: the same login, or, since scrapers cannot log in, the static bearer token set in the
  api-server's `CAIRN_METRICS_TOKEN` environment variable (Prometheus `authorization:
  credentials_file`), compared in constant time. Unset: only logged-in users and clients
  with an Airflow JWT can scrape; either way an anonymous request gets a 401/403.
"""

from __future__ import annotations

import ast
import hmac
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy import select

from cairn.config import TopicConfig
from cairn.dag_ids import dag_id
from cairn.pipeline import run_record
from cairn.topics_file import TopicConfigError
from cairn.views import metrics, overview, prometheus
from cairn_airflow.dag_topics import (
    DISCOVERY_DELAY,
    configured_topics,
    patterns,
    topic_yaml,
    topics_loaded,
)
from cairn_airflow.failures import CAUSE_KEY
from cairn_airflow.hooks.connections import storage

log = logging.getLogger(__name__)

METRICS_TOKEN_VARIABLE = "CAIRN_METRICS_TOKEN"
PREFIX = "/cairn"
RUNS_SHOWN = 10

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


class LoginNeeded(Exception):
    """A page was asked for without a valid login: send the browser to Airflow's login."""


async def page_user(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> BaseUser:
    try:
        return await get_user(request, None, bearer)
    except HTTPException as err:
        raise LoginNeeded from err


async def metrics_reader(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> BaseUser | None:
    """None for the scrape token (every topic), else the logged-in user (their topics)."""
    expected = os.environ.get(METRICS_TOKEN_VARIABLE, "")
    if expected and bearer and hmac.compare_digest(bearer.credentials.encode(), expected.encode()):
        return None
    return await get_user(request, None, bearer)


def may_read(user: BaseUser | None, topic: str | None) -> bool:
    """Whether `user` may read `topic`'s archive DAG, or every DAG when `topic` is None (the
    auth manager's `is_authorized_dag` without details); the scrape token (None) reads all."""
    if user is None:
        return True
    details = None if topic is None else DagDetails(id=dag_id("archive", topic))
    return get_auth_manager().is_authorized_dag(method="GET", user=user, details=details)


def readable_topics(user: BaseUser | None) -> list[TopicConfig]:
    """The configured topics whose archive DAG `user` may read (all for the scrape token)."""
    return [cfg for cfg in configured_topics() if may_read(user, cfg.topic)]


def readable_errors(
    user: BaseUser | None, errors: list[TopicConfigError]
) -> list[TopicConfigError]:
    """The topics files' mistakes `user` may see: one in a topic's entry to whoever may read
    that topic's archive DAG (as its row would show); any other (a pattern, an entry without a
    topic, `defaults`, a file that does not parse) may describe any topic, so only to whoever
    may read every DAG."""
    return [e for e in errors if may_read(user, entry_topic(e))]


def entry_topic(error: TopicConfigError) -> str | None:
    """The topic an error's entry names (`topic 'orders.eu'`); None for any other entry."""
    kind, _, name = error.entry.partition(" ")
    if kind != "topic":
        return None
    try:
        topic = ast.literal_eval(name)
    except (ValueError, SyntaxError):
        return None
    return topic if isinstance(topic, str) else None


app = FastAPI(title="Cairn", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(LoginNeeded)
def to_login(request: Request, _err: LoginNeeded) -> Response:
    next_url = str(request.url)
    return RedirectResponse(get_auth_manager().get_url_login(next_url=next_url), status_code=302)


@app.get("/", response_class=HTMLResponse)
def index(user: Annotated[BaseUser, Depends(page_user)]) -> HTMLResponse:
    rows = []
    topics = readable_topics(user)
    last_runs = latest_runs([dag_id("archive", cfg.topic) for cfg in topics])
    for cfg in topics:
        row: dict[str, Any] = {"cfg": cfg, "links": links(cfg)}
        row["airflow_run"] = last_runs.get(dag_id("archive", cfg.topic))
        row["failure"] = last_failure(dag_id("archive", cfg.topic))
        try:
            row["view"] = overview.topic_overview(storage(cfg), cfg)
        except Exception as err:  # one unreadable archive must not hide the others
            log.warning("overview of topic %s failed", cfg.topic, exc_info=True)
            row["error"] = f"{type(err).__name__}: {err}"
        rows.append(row)
    return render(
        "index.html",
        rows=rows,
        misconfigured=readable_errors(user, topics_loaded().errors),
        now=datetime.now(UTC),
        patterns=patterns(),
        discovery_delay=DISCOVERY_DELAY,
    )


@app.get("/topics/{topic}", response_class=HTMLResponse)
def topic_page(topic: str, user: Annotated[BaseUser, Depends(page_user)]) -> HTMLResponse:
    cfg = next((c for c in readable_topics(user) if c.topic == topic), None)
    if cfg is None:
        raise HTTPException(404, f"no configured topic {topic!r} that you may read")
    detail = overview.topic_detail(storage(cfg), cfg)
    airflow_runs = recent_runs(dag_id("archive", topic), RUNS_SHOWN)
    return render(
        "topic.html",
        cfg=cfg,
        d=detail,
        view=detail.overview,
        links=links(cfg),
        airflow_runs=airflow_runs,
        config_yaml=topic_yaml(cfg),
        now=datetime.now(UTC),
    )


@app.get("/metrics")
def prometheus_metrics(reader: Annotated[BaseUser | None, Depends(metrics_reader)]) -> Response:
    found = metrics.config_samples(topics_loaded())
    for cfg in readable_topics(reader):
        try:
            found += metrics.samples(run_record.topic_status(storage(cfg), cfg.topic))
        except Exception:  # a scrape still serves the other topics
            log.warning("metrics of topic %s unavailable", cfg.topic, exc_info=True)
    return Response(prometheus.exposition(found), media_type=prometheus.CONTENT_TYPE)


def latest_runs(dag_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The newest Airflow run of each DAG (by creation), as the UI's grid lists them."""
    found: dict[str, dict[str, Any]] = {}
    for each in dag_ids:
        runs = recent_runs(each, 1)
        if runs:
            found[each] = runs[0]
    return found


def last_failure(dag_id: str) -> str | None:
    """Why the DAG's newest finished run failed, if it failed on an error a retry cannot heal
    or a breach (the cause `cairn_airflow.failures.fail_fast`, or the triggerer ending a failed
    *check_health*, kept); None once a later run succeeded."""
    finished = DagRun.state.in_((DagRunState.SUCCESS, DagRunState.FAILED))
    newest = select(DagRun.id, DagRun.state).where(DagRun.dag_id == dag_id, finished)
    with create_session() as session:
        run = session.execute(newest.order_by(DagRun.id.desc()).limit(1)).first()
        if run is None or run.state != DagRunState.FAILED:
            return None
        cause = select(XComModel.value).where(
            XComModel.dag_run_id == run.id, XComModel.key == CAUSE_KEY
        )
        found = session.execute(cause.limit(1)).first()
        return None if found is None else str(XComModel.deserialize_value(found))


def recent_runs(dag_id: str, limit: int) -> list[dict[str, Any]]:
    """The DAG's newest Airflow runs: id, type, state, start and end."""
    columns = (DagRun.run_id, DagRun.run_type, DagRun.state, DagRun.start_date, DagRun.end_date)
    query = select(*columns).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc())
    with create_session() as session:
        return [dict(row._mapping) for row in session.execute(query.limit(limit))]


def links(cfg: TopicConfig) -> dict[str, str | None]:
    return {
        "archive_dag": f"/dags/{dag_id('archive', cfg.topic)}",
        "rebuild_dag": f"/dags/{dag_id('rebuild', cfg.topic)}" if cfg.parses else None,
        "seal_dag": f"/dags/{dag_id('seal', cfg.topic)}" if cfg.seals else None,
        "root": f"{cfg.root.storage_url}/partitioned/{cfg.topic}/",
    }


def render(template: str, **context: Any) -> HTMLResponse:
    page = _templates.get_template(template).render(**context)
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


def sparkline(values: list[float], width: int = 96, height: int = 22) -> Markup:
    """An inline SVG line of `values` (oldest left), scaled to their own maximum."""
    if len(values) < 2:
        return Markup("")
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values)
    )
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<polyline points="{points}" fill="none" stroke="currentColor" stroke-width="1.5"/>'
        "</svg>"
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def ago(when: datetime | None, now: datetime) -> str:
    return "—" if when is None else f"{duration((now - when).total_seconds())} ago"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:,}"


def percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2%}"


_templates.globals.update(sparkline=sparkline)
_templates.filters.update(duration=duration, number=number, percent=percent)
_templates.globals.update(ago=ago)


class PrefixSlash:
    """Redirect `/cairn` to `/cairn/` (query kept): the api-server's mount serves only paths
    below its prefix, so the address people type was a 404."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == PREFIX:
            query = scope.get("query_string", b"").decode()
            target = f"{PREFIX}/" + (f"?{query}" if query else "")
            await RedirectResponse(target, status_code=307)(scope, receive, send)
            return
        await self.app(scope, receive, send)
