"""The one error class the edges need to know: failures that a retry would only repeat.

A retention gap, a fenced-out attempt, a failed verification, a recreated or missing topic, or a
reversed date range fail the same way however often they are retried, and every retry delays
the person who has to act. Airflow tasks turn these into failures without retries
(`cairn_airflow.failures.fail_fast`); anything else (a broker or S3 hiccup) is retried as usual.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

PERMANENT_EXIT = 3
"""Exit status of a Spark job stopped by a PermanentError, so its task fails without retries."""


class PermanentError(Exception):
    """A retry cannot succeed: a person (or a newer attempt) has to act first."""


@contextlib.contextmanager
def permanent_exit() -> Iterator[None]:
    """In a job's main: exit with PERMANENT_EXIT (and the reason on stderr) on a PermanentError."""
    try:
        yield
    except PermanentError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(PERMANENT_EXIT) from err
