"""Which task failures are retried: only those that waiting can heal.

A retention gap, a fenced-out attempt, a failed verification, a recreated or missing topic, or a
run that names no dates or a reversed range (`cairn.errors.PermanentError`) fail the same way on
every retry, and every retry delays the person who has to act; a broker or S3 hiccup is retried
as usual.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from airflow.sdk.exceptions import AirflowFailException

from cairn.errors import PermanentError


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Fail the task without retries on errors a retry would only repeat (`PermanentError`),
    the error's class and message as the task's failure, so its log says why."""
    try:
        yield
    except PermanentError as err:
        raise AirflowFailException(f"{type(err).__name__}: {err}") from err
