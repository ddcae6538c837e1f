"""A callback-only run of a DAG file keeps the file's last parse time in Airflow's DAG
processor (`cairn_airflow.dag_processor_fix`), so the callbacks a burst's steps send do not
have every topic's DAGs parsed again back to back."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.dag_processing import manager as airflow_manager
from airflow.dag_processing.manager import DagFileInfo, DagFileProcessorManager, DagFileStat

from cairn_airflow import dag_processor_fix

PARSED = datetime.now(UTC) - timedelta(minutes=1)


@pytest.fixture
def unfixed(monkeypatch):
    """Airflow's own result handling, whatever an earlier test installed."""
    handle = DagFileProcessorManager.handle_parsing_result
    original = getattr(handle, "__wrapped__", handle)
    monkeypatch.setattr(DagFileProcessorManager, "handle_parsing_result", original)
    return original


def parsed_manager(folder: Path) -> tuple[DagFileProcessorManager, DagFileInfo]:
    """A DAG processor whose one file was parsed a minute ago into 1,001 DAGs; its interval is
    half an hour."""
    manager = DagFileProcessorManager(max_runs=-1)
    manager._file_process_interval = 1800
    file = DagFileInfo(rel_path=Path("cairn_archive.py"), bundle_name="dags", bundle_path=folder)
    (folder / file.rel_path).write_text("")
    unchanged = (PARSED - timedelta(hours=1)).timestamp()  # written before that parse
    os.utime(folder / file.rel_path, (unchanged, unchanged))
    manager._file_stats[file] = DagFileStat(num_dags=1001, last_finish_time=PARSED, run_count=1)
    return manager, file


def run_callbacks_only(manager: DagFileProcessorManager, file: DagFileInfo) -> None:
    """What the DAG processor does once a process ran only the file's callbacks."""
    done = SimpleNamespace(had_callbacks=True, parsing_result=None, start_time=time.monotonic())
    manager.handle_parsing_result(file, done)


def queued_after_callbacks(manager: DagFileProcessorManager, file: DagFileInfo) -> list:
    run_callbacks_only(manager, file)
    manager.prepare_file_queue(known_files={file.bundle_name: {file}})
    return list(manager._file_queue)


def test_airflow_alone_parses_a_file_again_right_after_its_callbacks(tmp_path, unfixed):
    """The Airflow 3.3 bug (apache/airflow#73432) the fix is for; should this fail, Airflow
    fixed it, and `dag_processor_fix` can go."""
    manager, file = parsed_manager(tmp_path)
    assert queued_after_callbacks(manager, file) == [file]  # a minute after its parse
    assert manager._file_stats[file].last_finish_time is None


def test_with_the_fix_callbacks_leave_the_file_to_its_interval(tmp_path, unfixed):
    assert dag_processor_fix.install()
    manager, file = parsed_manager(tmp_path)

    assert queued_after_callbacks(manager, file) == []
    stat = manager._file_stats[file]
    assert (stat.last_finish_time, stat.num_dags) == (PARSED, 1001)
    assert stat.last_duration is not None  # the callback run's own duration still shows

    # a real parse still records its own time and DAGs
    parse = SimpleNamespace(had_callbacks=False, parsing_result=None, start_time=time.monotonic())
    manager.handle_parsing_result(file, parse)
    assert manager._file_stats[file].last_finish_time > PARSED


def test_installing_twice_wraps_once_and_only_where_a_dag_processor_runs(monkeypatch, unfixed):
    assert dag_processor_fix.install() and dag_processor_fix.install()
    installed = DagFileProcessorManager.handle_parsing_result
    assert installed.__wrapped__ is unfixed

    monkeypatch.delitem(sys.modules, airflow_manager.__name__)  # a process without one
    assert not dag_processor_fix.install()
