"""The code a Spark job ships: the `cairn` and `spark_jobs` packages of this deployment as one
zip, named by a digest of their contents (`cairn-<hash>.zip`).

Nothing of Cairn is installed on a cluster by hand: each job brings this artifact (Spark
Connect's `addArtifacts`, spark-submit's `--py-files`), and its executors import Cairn from it
(`spark_jobs.executors` checks they do). It is built once per deployment and process, into
`CAIRN_ARTIFACT_DIR` (the temporary folder by default), and reused while the code is the same:
the same code always gives the same bytes and the same name, so two deployments of different
versions never share a name, and a Spark Connect session named by the digest
(`cairn_airflow.hooks.spark_connect`) holds one version's code only. No Airflow here: the
benchmarks ship jobs exactly as the operator does.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cairn
import spark_jobs

PACKAGES = (cairn, spark_jobs)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's first date: every entry gets it


@dataclass(frozen=True)
class Artifact:
    path: Path
    digest: str

    @property
    def name(self) -> str:
        return self.path.name


def sources(roots: Sequence[Path]) -> dict[str, bytes]:
    """The shipped files of the package folders `roots` by their path in the zip
    (`cairn/config.py`), sorted."""
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found[f"{root.name}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return dict(sorted(found.items()))


def build(roots: Sequence[Path], folder: Path) -> Artifact:
    """The artifact of the package folders `roots` in `folder`, built unless a file of its name
    is already there."""
    files = sources(roots)
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    hexdigest = digest.hexdigest()
    path = folder / f"cairn-{hexdigest[:20]}.zip"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{path.name}.{os.getpid()}"
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            for name, data in files.items():
                out.writestr(zipfile.ZipInfo(name, _EPOCH), data, zipfile.ZIP_DEFLATED)
        os.replace(partial, path)  # whole or not at all, whoever builds it at the same moment
    return Artifact(path, hexdigest)


@functools.cache
def code_artifact() -> Artifact:
    """This deployment's artifact: `cairn` and `spark_jobs` as installed here."""
    folder = os.environ.get("CAIRN_ARTIFACT_DIR") or Path(tempfile.gettempdir()) / "cairn-artifacts"
    return build([Path(p.__file__).parent for p in PACKAGES], Path(folder))
