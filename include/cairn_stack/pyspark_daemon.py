"""PySpark's Python worker daemon as the local stack's Spark Connect server runs it
(`spark.python.daemon.module`, set by `cairn_stack.services`): the same
daemon and workers, except that a worker re-reads a zip archive on its path only when it changed.

A worker calls `importlib.invalidate_caches()` as each task starts, for files a job may have
added. On Python 3.10 and 3.11 every zip importer then re-reads its archive's whole directory
(CPython gh-103200, fixed in 3.12), and Spark puts pyspark.zip (one importer per package
imported from it) and spark-core's jar (5,000 entries) on the workers' path: ~100 ms at the
start of every archive task on a busy 2-core machine, with the task's JVM side waiting.
"""

from __future__ import annotations

import os
import runpy
import sys
import zipimport

_REREAD = zipimport.zipimporter.invalidate_caches


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def invalidate_caches(importer: zipimport.zipimporter) -> None:
    """Re-read the archive's directory as Python 3.11 does, unless this importer already read
    it at the archive's present size and modification time."""
    stamp = _stamp(importer.archive)
    if stamp is None or getattr(importer, "_cairn_read_at", None) != stamp:
        _REREAD(importer)
        importer._cairn_read_at = stamp  # type: ignore[attr-defined]


def install() -> None:
    """Make every zip importer of this process re-read only changed archives (3.10, 3.11)."""
    if sys.version_info < (3, 12):
        zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
