"""The Spark Connect servers' Python worker daemon: zip archives re-read only when changed."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
import zipimport
from pathlib import Path

import pytest

from cairn_stack import pyspark_daemon as daemon
from cairn_stack.services import PYTHON_DAEMON


@pytest.fixture
def rereads(monkeypatch) -> list[str]:
    """The archives re-read through Python's own `invalidate_caches`, in order."""
    seen: list[str] = []
    original = daemon._REREAD

    def counting(importer: zipimport.zipimporter) -> None:
        seen.append(importer.archive)
        original(importer)

    monkeypatch.setattr(daemon, "_REREAD", counting)
    return seen


def write_zip(path: Path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, source in modules.items():
            z.writestr(f"{name}.py", source)


def test_an_unchanged_archive_is_read_once_and_a_changed_one_again(tmp_path, rereads):
    archive = tmp_path / "lib.zip"
    write_zip(archive, {"first": "X = 1\n"})
    importer = zipimport.zipimporter(str(archive))

    for _ in range(3):  # a worker's tasks, one after another
        daemon.invalidate_caches(importer)
    assert rereads == [str(archive)]

    write_zip(archive, {"first": "X = 1\n", "second": "Y = 2\n"})  # a job replaced it
    assert importer.find_spec("second") is None  # not seen before the caches are invalidated
    daemon.invalidate_caches(importer)
    assert rereads == [str(archive)] * 2
    assert importer.find_spec("second") is not None


def test_install_puts_it_in_every_zip_importer(tmp_path, monkeypatch, rereads):
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", daemon._REREAD)  # restored
    archive = tmp_path / "lib.zip"
    write_zip(archive, {"first": "X = 1\n"})

    daemon.install()
    importer = zipimport.zipimporter(str(archive))
    importer.invalidate_caches()
    importer.invalidate_caches()
    # Python 3.12 reads archives lazily itself, and install leaves it alone
    assert rereads == ([str(archive)] if sys.version_info < (3, 12) else [])


def test_the_local_server_runs_this_daemon():
    """The module the local stack's server names is this one, which its Python workers (this
    venv's Python) import; a cluster's server names none (nothing of Cairn is installed there)."""
    spec = importlib.util.find_spec(PYTHON_DAEMON["spark.python.daemon.module"])
    assert spec is not None and spec.origin == daemon.__file__
