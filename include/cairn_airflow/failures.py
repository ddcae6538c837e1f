"""Which task failures are retried: only those that waiting can heal.

A retention gap, a fenced-out attempt, a failed verification, a recreated or missing topic, a
missing connection, or a run that names no dates or a reversed range
(`cairn.errors.PermanentError`) fail the same way on every retry, and every retry delays the
person who has to act; a broker or S3 hiccup is retried as usual.

The cause is also kept as the task's `CAUSE_KEY` XCom, so the overview page can say why a
topic's last run failed without anyone opening its log.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import NoReturn

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException

from cairn.errors import PermanentError

log = logging.getLogger(__name__)

CAUSE_KEY = "cairn_failure"
"""XCom key of a permanent failure's one-line cause (`ErrorClass: message`)."""


class NeedsWorker(Exception):
    """A task started in the triggerer that only a worker can finish (it emits asset events):
    the triggerer hands it over, as planned, not as a fault."""


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Fail the task without retries on errors a retry would only repeat (`PermanentError`),
    the error's class and message as the task's failure, so its log says why."""
    try:
        yield
    except PermanentError as err:
        fail(f"{type(err).__name__}: {err}")


def fail(cause: str) -> NoReturn:
    """Fail the task without retries, keeping `cause` for the overview page."""
    _keep(cause)
    raise AirflowFailException(cause)


def one_line(cause: str) -> str:
    """`cause` as the one line the overview page shows."""
    return " ".join(cause.split())


def _keep(cause: str) -> None:
    """Store `cause`, on one line, as the running task's XCom; best effort (outside a task
    there is none)."""
    try:
        get_current_context()["ti"].xcom_push(CAUSE_KEY, one_line(cause))
    except Exception:  # the failure itself must still be raised as it is
        log.warning("the failure's cause was not kept for the overview page", exc_info=True)
