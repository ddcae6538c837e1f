"""A check run in a forked child: what a process forked after its parent set something up
(a pool, a client, an event loop) still gets to do."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest


def in_fork(check: Callable[[], bool], timeout: float, hung: str) -> bool:
    """Whether `check`, run in a forked child, returned true; the test fails with `hung` when
    the child has not ended within `timeout` seconds. The child exits whatever happens in it,
    so it never goes on running the parent's tests."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit code
        code = 1
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while (ended := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail(hung)
    return os.waitstatus_to_exitcode(ended[1]) == 0
