"""What every per-topic DAG file shares: which topics get DAGs, each DAG's docs, and the
stand-in DAG a run of a topic misconfigured since it started fails with (`misconfigured_run_dags`).

A topic's DAG of each kind is named by `cairn.dag_ids.dag_id` (`archive__orders.eu`). Pattern
entries become topics against the topic names `cairn_discover_topics` caches in an Airflow
Variable, so parsing a DAG file never calls Kafka.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Variable, get_parsing_context
from airflow.sdk.exceptions import AirflowFailException

from cairn.config import TopicConfig
from cairn.dag_ids import Kind, dag_id, parse_dag_id
from cairn.topics_file import (
    TOPICS_FILE,
    LoadResult,
    TopicConfigError,
    TopicNotConfigured,
    find_topic,
    load_topics,
)
from cairn_airflow.dag_parse import parse_again

log = logging.getLogger(__name__)

TOPICS_VARIABLE = "cairn_kafka_topics"
"""Airflow Variable holding Kafka's topic names (JSON), refreshed by `cairn_discover_topics`."""
DISCOVERY_SCHEDULE = "*/5 * * * *"
DISCOVERY_DELAY = "5 minutes"
"""How long a new topic that matches a pattern entry may wait for discovery (its schedule)."""
_PARSER = "/airflow/dag_processing/processor.py"
"""Where Airflow's DAG processor parses a file (`_parse_file`, whose `msg` is the request)."""


def topics_written() -> LoadResult:
    """The topics file (or folder of them) as it reads now: valid entries, errors, files. A
    missing one is an error of its own (no topics), so the pages, metrics and alerts say so
    instead of failing."""
    try:
        return load_topics(TOPICS_FILE)
    except FileNotFoundError:
        missing = "no such file or folder; create it, or point CAIRN_TOPICS_FILE at the topics"
        error = TopicConfigError("file", "", missing, str(TOPICS_FILE))
        return LoadResult([], [error], [TOPICS_FILE])


def topics_loaded() -> LoadResult:
    """The topics to build DAGs for and every mistake: exact entries, and pattern entries
    matched against the topic names `cairn_discover_topics` cached (never a Kafka call while
    parsing DAG files); a topic two patterns match is a mistake (`LoadResult.resolve`)."""
    written = topics_written()
    known = []
    if any(entry.pattern for entry in written.topics):
        known = json.loads(Variable.get(TOPICS_VARIABLE, default="[]"))
    return written.resolve(known)


def patterns() -> list[str]:
    """The pattern entries of the topics file (they wait for discovery; exact entries do not)."""
    return [e.pattern for e in topics_written().topics if e.pattern]


def pattern_topics(kafka_topic_names: list[str]) -> list[str]:
    """The topics that pattern entries, and no exact entry, give DAGs among these names."""
    written = topics_written()
    exact = {e.topic for e in written.topics if e.topic}
    return [c.topic for c in written.resolve(kafka_topic_names).topics if c.topic not in exact]


def remember_topic_names(names: list[str], dag_folder: Path) -> None:
    """Cache Kafka's topic `names` for the pattern entries (`cairn_discover_topics`); when the
    topics they match changed, have the DAG processor parse the topic DAG files again."""
    before = set(pattern_topics(json.loads(Variable.get(TOPICS_VARIABLE, default="[]"))))
    Variable.set(TOPICS_VARIABLE, json.dumps(names))
    matched = set(pattern_topics(names))
    if new := sorted(matched - before):
        log.info(
            "new topics matching a pattern entry: %s (a topic matching a pattern waits up to %s "
            "for discovery)",
            ", ".join(new),
            DISCOVERY_DELAY,
        )
    if matched != before:
        parse_again(dag_folder, "the topics the pattern entries match changed")


def configured_topics() -> list[TopicConfig]:
    """The topics to build DAGs for (`topics_loaded`)."""
    return topics_loaded().topics


def topics_to_build(kind: Kind) -> list[TopicConfig]:
    """The topics a DAG file builds its DAGs of `kind` for: all of them for the DAG processor's
    parse, only the one whose DAG is running when a task process parses the file (Airflow's
    parsing context), and only those with callbacks to run when the DAG processor parses it for
    them (`callback_dag_ids`). Building every topic's DAG at each task start made a task's start
    grow with the fleet: ~17 s a task at 100 topics on two cores, past the import timeout."""
    running = get_parsing_context().dag_id
    wanted = {running} if running is not None else callback_dag_ids()
    if wanted is not None and not wanted:
        return []  # callbacks that need no DAG: not even the topics file is read
    topics = configured_topics()
    return topics if wanted is None else [c for c in topics if dag_id(kind, c.topic) in wanted]


def callback_dag_ids() -> set[str] | None:
    """When the DAG processor parses this file only to run callbacks: the DAGs they need.

    Airflow 3.3 sends one for every task a trigger ends as succeeded, and parses the DAG file
    for each batch of them only to ignore them (it runs a task's failure callbacks alone, and
    looks for no DAG before it ignores the rest): with every step of a run ending in the
    triggerer, the DAG processor built every topic's DAGs every few seconds, ~2.5 s of a core
    each time at 100 topics. So a batch of such callbacks alone builds no DAG at all. Airflow
    does not tell a DAG file why it is parsed, so this reads the request from the parse's
    frame; anywhere else, or should Airflow change it, None (build all, as before)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_parse_file" and code.co_filename.endswith(_PARSER):
            requests = getattr(frame.f_locals.get("msg"), "callback_requests", None)
            if not requests:
                return None
            return {
                r.ti.dag_id if hasattr(r, "ti") else r.dag_id
                for r in requests
                if not _ignored_by_airflow(r)
            }
        frame = frame.f_back
    return None


def _ignored_by_airflow(request: Any) -> bool:
    """A task callback that is not a failure's: Airflow 3.3 logs it and runs nothing."""
    return hasattr(request, "task_callback_type") and not request.is_failure_callback


def misconfigured_run_dags(kind: Kind) -> dict[str, DAG]:
    """In a task process of a `kind` DAG whose topic no longer loads (its entry broke, was
    removed, or a second pattern matches it, after the run started): a stand-in DAG of the
    running DAG's id whose running task fails at once, without retries, with the mistake (file,
    line, field). Without it the task finds no DAG, and Airflow puts it back to
    up_for_reschedule for minutes (`[workers] missing_dag_retries`) before failing it with "Dag
    not found", which names no cause. Nothing anywhere else: the DAG processor never builds it,
    so a misconfigured topic's DAGs still leave Airflow until it is fixed."""
    context = get_parsing_context()
    running = parse_dag_id(context.dag_id or "")
    if running is None or running[0] != kind or context.task_id is None:
        return {}
    try:
        find_topic(running[1], TOPICS_FILE)
    except TopicNotConfigured as err:
        reason = f"{type(err).__name__}: {err}"
    else:
        return {}  # configured, but no longer with a DAG of this kind: Airflow's own handling

    def fail() -> None:
        raise AirflowFailException(reason)

    with DAG(dag_id=context.dag_id, schedule=None, tags=["cairn", "misconfigured"]) as dag:
        PythonOperator(task_id=context.task_id, python_callable=fail, retries=0)
    return {dag.dag_id: dag}


def topic_yaml(cfg: TopicConfig) -> str:
    """The topic's effective configuration (defaults merged in) as YAML, as topics.yaml reads.

    libyaml's emitter where PyYAML has it: each parse of the DAG files writes this for every
    topic's DAGs, and PyYAML's own took 0.9 s of a 1,000-topic file's parse (the same text)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(cfg.model_dump(mode="json", exclude_none=True), Dumper=dumper, sort_keys=False)


def topic_doc(cfg: TopicConfig, role: str, about: str) -> str:
    """A DAG's `doc_md`: what the DAG does (`about`, its module docstring), the topic's
    configuration and links to the topic's overview page, DAGs and archive root."""
    topic = cfg.topic
    links = [
        f"[overview](/cairn/topics/{topic})",
        f"[archive DAG](/dags/{dag_id('archive', topic)})",
    ]
    if cfg.parses:
        links.append(f"[rebuild DAG](/dags/{dag_id('rebuild', topic)})")
    if cfg.seals:
        links.append(f"[seal DAG](/dags/{dag_id('seal', topic)})")
    return (
        f"# {topic} · {role}\n\n{' · '.join(links)} · archive root "
        f"`{cfg.root.storage_url}`\n\n{about.strip()}\n\n"
        f"## Configuration of `{topic}`\n\n```yaml\n{topic_yaml(cfg)}```\n"
    )
