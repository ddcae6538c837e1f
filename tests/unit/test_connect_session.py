"""Which Spark Connect session a run joins: the shared one, named by the code its Python workers
import (the server-side behaviour is in tests/integration/test_spark_connect.py)."""

from __future__ import annotations

import uuid

import pytest

from cairn_airflow.hooks.spark_connect import (
    CONNECT_MODE,
    code_session_id,
    connect_session,
    with_session_id,
)


def test_the_shared_session_is_named_by_the_code_so_an_upgrade_gets_new_workers(tmp_path):
    package = tmp_path / "cairn"
    (package / "formats").mkdir(parents=True)
    (package / "writer.py").write_text("BLOCK = 1\n")
    (package / "formats" / "json.py").write_text("")
    first = code_session_id(package)

    assert uuid.UUID(first).version == 5  # the server takes only UUIDs as session ids
    assert code_session_id(package) == first  # every task of one deployment joins the same
    (package / "writer.py").write_text("BLOCK = 2\n")
    changed = code_session_id(package)
    assert changed != first
    (package / "formats" / "json.py").rename(package / "json.py")  # a moved module counts too
    assert code_session_id(package) not in (first, changed)


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
    with pytest.raises(ConnectionError), connect_session("sc://nowhere:15002"):
        pass
    assert CONNECT_MODE not in os.environ
