"""How a run holds a Spark Connect session: it joins the server's session of its code
version, ships that code to it, tags its work, and leaves the session open for the next run.

The server needs nothing of Cairn: each run adds this deployment's code artifact
(`cairn_airflow.spark_artifact`) to its session (`addArtifacts`, a Python file of the
session: its executors' Python workers import `cairn` from it). The session's id is derived from
the artifact's digest, so runs of one version share a session, and two deployments of different
versions on one server never mix their code: each has its own session and artifacts. Adding the
same artifact to a session again is a no-op on the server (one small upload).

A session per run cost every run about a second: Spark 4.0 starts a Python worker daemon per
session, whose workers import `cairn` again, and never stops it (SPARK-54055). Runs of one
shared session reuse its warm workers; after an upgrade runs join a new session and the old one
idles out. Each run tags its work (`addTag`), so a killed task interrupts its own work only,
never another run's. Runs also share the session's SQL settings: a job may set only settings
every run wants alike (the archive job's Arrow batch limits).

A session the server has closed (released, or idle for longer than the server's
`spark.connect.session.manager.defaultSessionTimeout`) is refused until the server restarts.
A run then gets a session of its own, as before: it is released at the end and its daemon
stopped. No Airflow here: the benchmarks run jobs exactly as the operator does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cairn_airflow.spark_artifact import Artifact

log = logging.getLogger(__name__)

CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
"""PySpark's mark of a whole process as Spark Connect, set by every remote session it starts."""

SESSION_CLOSED = "INVALID_HANDLE.SESSION_CLOSED"
_NAMESPACE = uuid.UUID("5f2c6f0e-4f7a-4d59-9a8e-0c2b9d6c1a47")


def session_id(artifact: Artifact) -> str:
    """The id of the session that runs `artifact`'s code."""
    return str(uuid.uuid5(_NAMESPACE, artifact.digest))


def with_session_id(url: str, session_id: str) -> str:
    """`url` (`sc://host:port`, maybe with `/;key=value` parameters) naming this session."""
    base, _, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return f"{base.rstrip('/')}/;{';'.join([*kept, f'session_id={session_id}'])}"


@dataclass
class Connected:
    """A run's hold on a Spark Connect session: the session, the tag of the run's work on it,
    and whether the session is the shared one (else the run's own)."""

    session: Any
    tag: str
    shared: bool

    def interrupt(self) -> None:
        """Interrupt this run's work, and no other run's."""
        self.session.interruptTag(self.tag)

    def end(self) -> None:
        """Interrupt what still runs of this run (a failed or timed-out task) and let go of the
        session: the shared one stays open for the next run; a session of its own is released
        and its Python worker daemon stopped. Best effort: nothing here fails the run."""
        try:
            self.interrupt()
            if not self.shared:
                stop_daemon(self.session)
        except Exception as err:
            log.warning("Spark Connect: the run's work was not cleaned up: %s", err)
        self.session.release_session_on_close = not self.shared
        self.session.stop()


def stop_daemon(spark: Any) -> None:
    """Stop the Python worker daemon the server started for this session (Spark 4.0 keys a
    server's Python workers by session and never stops them, SPARK-54055: each session would
    leave a daemon, ~50 MB, behind for as long as the server runs). A task of the session asks
    its daemon (its parent, checked to be the daemon that forked it: the same command line,
    whichever `spark.python.daemon.module` the server runs) to exit shortly after the task has
    returned; the daemon then stops its idle workers."""

    def ask_to_exit(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        import subprocess
        import sys

        def cmdline(pid: int) -> bytes | None:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return f.read()
            except OSError:
                return None

        parent, own = os.getppid(), cmdline(os.getpid())
        if own is not None and cmdline(parent) == own:  # forked by its daemon
            # later, from outside the daemon's process group, once this task is done
            later = f"import os, time; time.sleep(3); os.kill({parent}, 15)"
            subprocess.Popen([sys.executable, "-c", later], start_new_session=True)
        yield from batches

    spark.range(0, 1, 1, 1).mapInArrow(ask_to_exit, "id long").collect()


def _join(url: str, artifact: Artifact) -> tuple[Any, bool]:
    """The version's shared session if the server still has it open, else a session of its
    own; either way with the version's code added."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    shared_id = session_id(artifact)
    session = SparkSession.builder.remote(with_session_id(url, shared_id)).create()
    try:
        # the first call to the server: a closed session is refused here
        log.info("Spark Connect: Spark %s, session %s", session.version, shared_id)
    except PySparkException as err:
        if err.getCondition() != SESSION_CLOSED:
            raise
        session.release_session_on_close = False
        session.stop()
        log.warning(
            "Spark Connect: the shared session %s is closed (idle past the server's "
            "spark.connect.session.manager.defaultSessionTimeout?); this run uses a session "
            "of its own, as every run will until the server restarts",
            shared_id,
        )
        session = SparkSession.builder.remote(url).create()
        session.addArtifacts(str(artifact.path), pyfile=True)
        return session, False
    session.addArtifacts(str(artifact.path), pyfile=True)
    return session, True


@contextlib.contextmanager
def connect_mark_kept() -> Iterator[None]:
    """PySpark's Connect mark put back as it was after the block.

    PySpark marks the process as Connect mode when it starts a remote session and never removes
    the mark; a classic session used later in the same process (or a spark-submit it starts)
    would then be sent to Connect and fail.
    """
    before = os.environ.get(CONNECT_MODE)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CONNECT_MODE, None)
        else:
            os.environ[CONNECT_MODE] = before


@contextlib.contextmanager
def connect_session(url: str, artifact: Artifact, tag: str | None = None) -> Iterator[Connected]:
    """A session of the Spark Connect server at `url` for one run (or one shared job) of
    `artifact`'s code, its work tagged `tag` (by default a new one), let go (`Connected.end`)
    after the block, with the process's Connect mark put back (`connect_mark_kept`)."""
    with connect_mark_kept():
        session, shared = _join(url, artifact)
        connected = Connected(session, tag or f"cairn-run-{uuid.uuid4().hex}", shared)
        session.addTag(connected.tag)
        try:
            yield connected
        finally:
            connected.end()
