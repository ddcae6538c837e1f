"""What a Spark job's executors must have, checked where the job's Python code runs.

A cluster's executors run the cluster's own Python: nothing of Cairn is installed there. Each
job ships its code (the `cairn-<hash>.zip` artifact), and the third-party packages that code
imports must be on the cluster's Python at the versions this deployment runs
(`requirements-cluster.txt`, `python -m spark_jobs.executors` prints them). `guarded` wraps each
function a job runs on the executors: before the function is even unpickled (which imports
Cairn and those packages), the task checks the Python version, each package and where `cairn`
comes from, and fails with one line naming everything that is missing or mismatched. A
worker process checks once; later tasks in it skip the check. `translated` turns that line,
or a plain `No module named ...` from PySpark's own worker, into `ExecutorsUnfit` on the
driver: a permanent failure, since a retry would meet the same executors.

This module's functions travel to the executors by value, and use only the standard library
there.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import cloudpickle

from cairn.errors import PermanentError

PACKAGES = (
    "confluent-kafka",
    "fastavro",
    "fsspec",
    "numpy",
    "pyarrow",
    "pydantic",
    "pyiceberg",
    "s3fs",
    "zlib-ng",
)
"""The third-party distributions Cairn's code imports on the executors (pyspark itself comes
with Spark). Their versions must be this deployment's: Arrow batches, Avro bytes and pickled
models cross between driver and executors."""

MARK = "CAIRN-EXECUTORS:"
_CHECKED = "CAIRN_EXECUTORS_CHECKED"

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ExecutorsUnfit(PermanentError):
    """The executors' Python cannot run the job: a package or the job's code is missing."""


def requirements(artifact: str | None) -> dict[str, Any]:
    """What the executors must have: this Python's version, each of `PACKAGES` at the version
    installed here, and `cairn` imported from `artifact` (when the job ships one)."""
    packages = {name: importlib.metadata.version(name) for name in PACKAGES}
    wanted = {"python": list(sys.version_info[:2]), "packages": packages, "artifact": artifact}
    wanted["digest"] = hashlib.sha256(repr(sorted(wanted.items())).encode()).hexdigest()
    return wanted


def guarded(function: Callable[..., Any], wanted: dict[str, Any]) -> Callable[..., Any]:
    """`function` for `mapInArrow`, run only on executors that meet `wanted`."""
    payload = cloudpickle.dumps(function)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        check(wanted)
        return cloudpickle.loads(payload)(batches)

    return run


def check(wanted: dict[str, Any]) -> None:
    """Raise RuntimeError (marked `MARK`) naming every way this Python falls short of `wanted`."""
    import importlib.metadata
    import os
    import socket
    import sys

    if os.environ.get(_CHECKED) == wanted["digest"]:
        return
    problems = []
    have = list(sys.version_info[:2])
    if have != wanted["python"]:
        need = ".".join(map(str, wanted["python"]))
        problems.append(f"Python {need} (this is {'.'.join(map(str, have))})")
    for name, version in sorted(wanted["packages"].items()):
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name}=={version} (missing)")
            continue
        if found != version:
            problems.append(f"{name}=={version} (has {found})")
    if wanted["artifact"] is not None:
        try:
            import cairn

            where = cairn.__file__ or ""
        except ImportError:
            where = "nowhere"
        if wanted["artifact"] not in where:
            problems.append(f"cairn from the job's {wanted['artifact']} (imports it from {where})")
    if problems:
        raise RuntimeError(
            f"{MARK} the executors' Python ({sys.executable} on {socket.gethostname()}) needs "
            f"{', '.join(problems)}; install requirements-cluster.txt into the cluster's Python "
            "(docs/operating.md, Running on your cluster)"
        )
    os.environ[_CHECKED] = wanted["digest"]


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Around a Spark action: executors unfit for the job fail it as `ExecutorsUnfit`, with the
    one line `check` wrote (or the module PySpark's worker could not import)."""
    try:
        yield
    except Exception as err:
        text = str(err)
        if MARK in text:
            line = text[text.index(MARK) + len(MARK) :].splitlines()[0].strip()
            raise ExecutorsUnfit(line) from None
        missing = _MISSING.search(text)
        if missing and missing[1].split(".")[0] in ("cairn", "spark_jobs"):
            raise ExecutorsUnfit(
                f"the executors cannot import {missing[1]!r}: the job's code artifact did not "
                "reach them"
            ) from None
        if missing:
            raise ExecutorsUnfit(
                f"the executors' Python cannot import {missing[1]!r}; install "
                "requirements-cluster.txt into the cluster's Python (docs/operating.md, "
                "Running on your cluster)"
            ) from None
        raise


def main() -> None:
    """Print the requirements of the cluster's Python for this deployment."""
    for name in PACKAGES:
        print(f"{name}=={importlib.metadata.version(name)}")


if __name__ == "__main__":
    main()
