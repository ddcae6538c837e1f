"""The topic DAG files are parsed again when what they build from changed, not only every
`min_file_process_interval` (`cairn_airflow.dag_parse`): a changed topics file, or a change in
the topics the pattern entries match, makes them newer than their last parse, and Airflow's DAG
processor parses such a file at once."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from cairn_airflow import dag_parse, dag_topics

OLD, NEWER = 1_700_000_000, 1_700_000_100


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A DAG folder whose topic DAG files were last made new at `OLD`."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in (*dag_parse.TOPIC_DAG_FILES, "unrelated.py"):
        (dags / name).write_text("")
        os.utime(dags / name, (OLD, OLD))
    return dags


def context(folder: Path) -> dict:
    """A task's context, as far as it is read here: its DAG file beside the topic DAG files."""
    return {"dag": SimpleNamespace(fileloc=str(folder / "cairn_config_watch.py"))}


def mtimes(folder: Path) -> set[float]:
    return {(folder / name).stat().st_mtime for name in dag_parse.TOPIC_DAG_FILES}


def test_a_topics_file_newer_than_the_dag_files_has_them_parsed_again(
    folder, tmp_path, monkeypatch
):
    topics = tmp_path / "topics.yaml"
    topics.write_text("topics: []\n")
    monkeypatch.setattr(dag_parse, "TOPICS_FILE", topics)
    os.utime(topics, (OLD - 10, OLD - 10))
    assert not dag_parse.parse_if_topics_changed(context(folder))  # parsed since: nothing to do
    assert mtimes(folder) == {OLD}

    os.utime(topics, (NEWER, NEWER))  # edited after the last parse
    assert dag_parse.parse_if_topics_changed(context(folder))
    assert min(mtimes(folder)) > NEWER  # each now newer than its last parse
    assert (folder / "unrelated.py").stat().st_mtime == OLD  # no other DAG file
    assert not dag_parse.parse_if_topics_changed(context(folder))  # once, not at every check


def test_a_file_added_to_or_removed_from_a_topics_folder_counts(folder, tmp_path, monkeypatch):
    topics = tmp_path / "topics.d"
    topics.mkdir()
    (topics / "a.yaml").write_text("topics: []\n")
    os.utime(topics / "a.yaml", (OLD - 10, OLD - 10))
    os.utime(topics, (OLD - 10, OLD - 10))
    monkeypatch.setattr(dag_parse, "TOPICS_FILE", topics)
    assert not dag_parse.parse_if_topics_changed(context(folder))

    (topics / "a.yaml").unlink()  # the folder's time moves, though no file left is newer
    os.utime(topics, (NEWER, NEWER))
    assert dag_parse.parse_if_topics_changed(context(folder))


def test_a_missing_topics_file_asks_for_nothing(folder, tmp_path, monkeypatch):
    monkeypatch.setattr(dag_parse, "TOPICS_FILE", tmp_path / "gone.yaml")
    assert not dag_parse.parse_if_topics_changed(context(folder))
    assert mtimes(folder) == {OLD}


def test_dag_files_that_cannot_be_touched_leave_the_change_to_the_interval(
    folder, monkeypatch, caplog
):
    def refused(path, *args):
        raise PermissionError(13, "Read-only file system", str(path))

    monkeypatch.setattr(dag_parse.os, "utime", refused)
    with caplog.at_level(logging.WARNING, logger=dag_parse.__name__):
        assert not dag_parse.parse_again(folder, "a topics file changed")
    (said,) = caplog.messages
    assert "a topics file changed" in said and "Read-only file system" in said
    assert "min_file_process_interval" in said and "airflow dags reserialize" in said


def test_discovery_has_the_dag_files_parsed_again_only_when_pattern_matches_change(
    folder, tmp_path, monkeypatch
):
    topics = tmp_path / "topics.yaml"
    topics.write_text(
        "topics:\n  - {pattern: 'clicks\\..*', format: raw}\n  - {topic: orders, format: raw}\n"
    )
    monkeypatch.setattr(dag_topics, "TOPICS_FILE", topics)
    variables: dict[str, str] = {}
    monkeypatch.setattr(
        dag_topics.Variable, "get", lambda key, default=None: variables.get(key, default)
    )
    monkeypatch.setattr(dag_topics.Variable, "set", variables.__setitem__)

    dag_topics.remember_topic_names(["clicks.eu", "orders"], folder)
    assert json.loads(variables[dag_topics.TOPICS_VARIABLE]) == ["clicks.eu", "orders"]
    first = mtimes(folder)
    assert min(first) > OLD  # a pattern gained a topic

    for path in (folder / n for n in dag_parse.TOPIC_DAG_FILES):
        os.utime(path, (OLD, OLD))
    dag_topics.remember_topic_names(["orders", "clicks.eu", "payments"], folder)
    assert mtimes(folder) == {OLD}  # no pattern matches a new topic: nothing to parse

    dag_topics.remember_topic_names(["orders"], folder)  # clicks.eu was deleted
    assert min(mtimes(folder)) > OLD


def test_airflow_parses_a_dag_file_newer_than_its_last_parse_before_the_interval(folder):
    """The Airflow 3.3 rule this relies on (`file_parsing_sort_mode = modified_time`, its
    default): a file parsed a minute ago waits for `min_file_process_interval`, unless it
    changed since."""
    from airflow.dag_processing.manager import DagFileInfo, DagFileProcessorManager, DagFileStat

    manager = DagFileProcessorManager(max_runs=-1)
    manager._file_process_interval = 1800
    assert manager._file_parsing_sort_mode == "modified_time"
    files = {
        name: DagFileInfo(rel_path=Path(name), bundle_name="dags-folder", bundle_path=folder)
        for name in ("cairn_archive.py", "unrelated.py")
    }
    parsed = datetime.now(UTC) - timedelta(minutes=1)  # after the files' last change (OLD)
    for info in files.values():
        manager._file_stats[info] = DagFileStat(last_finish_time=parsed)

    manager.prepare_file_queue(known_files={"dags-folder": set(files.values())})
    assert list(manager._file_queue) == []  # both parsed since their last change

    dag_parse.parse_again(folder, "a topics file changed")
    manager.prepare_file_queue(known_files={"dags-folder": set(files.values())})
    assert list(manager._file_queue) == [files["cairn_archive.py"]]
