"""`LoopLogger`: logging from a trigger's coroutines that never blocks the triggerer's loop.

A trigger runner writes its log lines to a socket its supervisor reads. The supervisor, one
loop, also sends the runner its new triggers and the answers to the steps' requests (XComs,
Variables, connections), with blocking writes, and it reads nothing while it sends. The
runner's event loop reads those answers. So a line logged on the loop when that socket is full
waits for the supervisor, while the supervisor waits for the loop. Both wait for good (Airflow
3.3.2).

This happened at a burst of a thousand watched topics: their firing lines filled the socket
while the supervisor sent 433 new triggers. A line written from a thread blocks only that
thread. It carries the coroutine's context, so it reaches the same log (a task's trigger log).
"""

from __future__ import annotations

import asyncio
import logging


class LoopLogger:
    """A logger whose calls are awaited: each line is written from a thread."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    async def info(self, msg: str, *args: object) -> None:
        await asyncio.to_thread(self._log.info, msg, *args)

    async def warning(self, msg: str, *args: object) -> None:
        await asyncio.to_thread(self._log.warning, msg, *args)

    async def error(self, msg: str, *args: object) -> None:
        await asyncio.to_thread(self._log.error, msg, *args)
