"""The code a Spark job ships, and which Spark Connect session a run joins: the shared one of its
code version (the server-side behaviour is in tests/integration/test_spark_connect.py)."""

from __future__ import annotations

import subprocess
import sys
import uuid
import zipfile

import pytest

from cairn_airflow.hooks.spark_connect import (
    CONNECT_MODE,
    connect_session,
    session_id,
    with_session_id,
)
from cairn_airflow.spark_artifact import build, code_artifact


def test_the_artifact_and_its_session_are_named_by_the_code_so_an_upgrade_gets_new_ones(
    tmp_path,
):
    package, jobs, out = tmp_path / "cairn", tmp_path / "spark_jobs", tmp_path / "out"
    (package / "formats").mkdir(parents=True)
    jobs.mkdir()
    (package / "__init__.py").write_text("")
    (package / "writer.py").write_text("BLOCK = 1\n")
    (package / "formats" / "json.py").write_text("")
    (jobs / "main.py").write_text("")
    first = build([package, jobs], out)

    assert first.name == f"cairn-{first.digest[:20]}.zip"
    assert uuid.UUID(session_id(first)).version == 5  # the server takes only UUIDs as ids
    again = build([package, jobs], tmp_path / "elsewhere")  # every worker of one deployment
    assert again.name == first.name and again.path.read_bytes() == first.path.read_bytes()
    (package / "writer.py").write_text("BLOCK = 2\n")
    changed = build([package, jobs], out)
    assert changed.name != first.name and session_id(changed) != session_id(first)
    assert first.path.exists()  # the other version's artifact is left to it
    (package / "formats" / "json.py").rename(package / "json.py")  # a moved module counts too
    assert build([package, jobs], out).name not in (first.name, changed.name)
    (jobs / "main.py").write_text("x = 1\n")  # so does a job's code
    assert build([package, jobs], out).digest != changed.digest


def test_the_deployments_artifact_holds_cairn_and_the_jobs_and_imports_from_the_zip(tmp_path):
    artifact = code_artifact()
    with zipfile.ZipFile(artifact.path) as zipped:
        names = set(zipped.namelist())
    assert {"cairn/__init__.py", "cairn/jobs.py", "spark_jobs/main.py"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    code = "import cairn.jobs, spark_jobs.executors; print(cairn.jobs.__file__)"

    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(artifact.path)!r}); {code}",
        ],
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip().startswith(str(artifact.path)), done.stderr


def test_the_session_id_joins_whatever_parameters_the_url_has():
    sid = "5f2c6f0e-4f7a-4d59-9a8e-0c2b9d6c1a47"
    assert with_session_id("sc://h:15002", sid) == f"sc://h:15002/;session_id={sid}"
    assert with_session_id("sc://h:15002/", sid) == f"sc://h:15002/;session_id={sid}"
    assert (
        with_session_id("sc://h:15002/;token=t;use_ssl=true", sid)
        == f"sc://h:15002/;token=t;use_ssl=true;session_id={sid}"
    )
    old = "sc://h:15002/;session_id=0b7e1c52-8d7e-4c55-9d55-3d1f0c1d2a77;user_id=u"
    assert with_session_id(old, sid) == f"sc://h:15002/;user_id=u;session_id={sid}"


def test_an_unreachable_server_fails_the_run_and_puts_the_connect_mark_back(monkeypatch):
    import os

    import pyspark.sql

    class Unreachable:
        release_session_on_close = True

        def __init__(self) -> None:
            os.environ[CONNECT_MODE] = "1"  # as PySpark does for every remote session

        @property
        def version(self) -> str:
            raise ConnectionError("Spark Connect server not reachable")

        def stop(self) -> None:
            pass

    class Builder:
        def remote(self, url: str) -> Builder:
            return self

        def create(self) -> Unreachable:
            return Unreachable()

    monkeypatch.delenv(CONNECT_MODE, raising=False)
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", Builder())
    with pytest.raises(ConnectionError), connect_session("sc://nowhere:15002", code_artifact()):
        pass
    assert CONNECT_MODE not in os.environ
