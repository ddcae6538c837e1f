"""How Cairn is packaged for a deployment: the wheel an existing Airflow installs holds the Airflow
side, the Spark jobs and the pages; `plugins/` only registers what Airflow must discover; and the
cluster's Python needs exactly this deployment's pins (requirements-cluster.txt)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from spark_jobs.executors import PACKAGES

REPO = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file, names normalized, extras dropped."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def test_the_clusters_python_needs_exactly_this_deployments_pins_of_what_executors_import():
    cluster, deployment = pins(REPO / "requirements-cluster.txt"), pins(REPO / "requirements.txt")
    assert set(cluster) == set(PACKAGES)
    assert {name: deployment[name] for name in cluster} == cluster


def test_the_wheel_a_deployment_installs_holds_the_airflow_side_the_jobs_and_the_pages(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools leaves its build folder in the source
    source.mkdir()
    for part in ("pyproject.toml", "include", "spark_jobs"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, source / part)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("cairn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "cairn/jobs.py",
        "cairn_airflow/plugin.py",
        "cairn_airflow/operators/spark.py",
        "cairn_airflow/pages/templates/index.html",
        "spark_jobs/main.py",
    ):
        assert module in names, module


def test_the_plugins_folder_only_registers_the_plugin():
    files = sorted(p.name for p in (REPO / "plugins").iterdir() if p.suffix == ".py")
    assert files == ["cairn_plugin.py"]  # never `cairn.py`: it would hide the cairn package
    tree = ast.parse((REPO / "plugins" / "cairn_plugin.py").read_text())
    body = [n for n in tree.body if not isinstance(n, ast.Expr)]  # the docstring
    assert [type(n) for n in body] == [ast.ImportFrom, ast.Assign]
    assert body[0].module == "cairn_airflow.plugin"
