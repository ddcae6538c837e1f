"""When the DAG processor parses the topic DAG files again: at once after what they build
from changed, else every `[dag_processor] min_file_process_interval`.

The archive, rebuild, seal and config-check DAG files build their DAGs from the topics files and
the topic names discovery caches, not from their own text. Each parse builds up to three DAGs a
topic, which Airflow then stores one by one: at 1,000 topics, most of what idle topics cost. So
the local stack and docker compose parse them every 30 minutes (`CAIRN_DAG_FILE_INTERVAL`), and
the tasks that see a change make those files newer than their last parse, which Airflow's DAG
processor parses at once (`[dag_processor] file_parsing_sort_mode = modified_time`, its
default): `cairn_config_watch` when a topics file changed (it looks every five minutes), and
`cairn_discover_topics` when a pattern entry gained or lost a topic.

Where a task cannot touch the files the DAG processor reads (its own copy on another machine, a
read-only bundle), a change waits for the interval; `airflow dags reserialize` applies it at
once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cairn.topics_file import TOPICS_FILE, topic_files

log = logging.getLogger(__name__)

TOPIC_DAG_FILES = ("cairn_archive.py", "cairn_rebuild.py", "cairn_seal.py", "cairn_config_check.py")
"""The DAG files that build their DAGs from the topics files."""


def dag_folder(context: Mapping[str, Any]) -> Path:
    """The folder of the running task's DAG file: the topic DAG files sit beside it."""
    return Path(context["dag"].fileloc).parent


def parse_if_topics_changed(context: Mapping[str, Any]) -> bool:
    """`cairn_config_watch`: have the topic DAG files parsed again if a topics file changed
    since they were last made new."""
    folder = dag_folder(context)
    try:
        sources = [TOPICS_FILE, *topic_files(TOPICS_FILE)]
    except FileNotFoundError:  # the config check names it; nothing to build from
        return False
    return changed_since_parse(folder, sources) and parse_again(folder, "a topics file changed")


def changed_since_parse(dag_folder: Path, sources: Iterable[Path]) -> bool:
    """One of `sources` (the topics files, and the folder holding them, whose time moves when
    a file is added or removed) is newer than one of the topic DAG files: their DAGs may not be
    built from it yet."""
    newest = max((p.stat().st_mtime for p in sources if p.exists()), default=0.0)
    return any(newest > p.stat().st_mtime for p in _topic_dag_files(dag_folder))


def parse_again(dag_folder: Path, why: str) -> bool:
    """Make the topic DAG files in `dag_folder` newer than their last parse. Best effort: where
    they cannot be touched, say so (the change then waits for the interval)."""
    try:
        for path in _topic_dag_files(dag_folder):
            os.utime(path)
    except OSError as err:
        log.warning(
            "%s, but the DAG files in %s cannot be marked for a parse (%s): the change shows at "
            "the DAG processor's next parse ([dag_processor] min_file_process_interval), or at "
            "once with `airflow dags reserialize`",
            why,
            dag_folder,
            err,
        )
        return False
    log.info("%s: the DAG processor parses the topic DAG files again now", why)
    return True


def _topic_dag_files(dag_folder: Path) -> list[Path]:
    return [p for name in TOPIC_DAG_FILES if (p := dag_folder / name).exists()]
