"""Cairn's triggers log from a thread (`cairn_airflow.triggers.loop_logger`): a line the
triggerer's supervisor does not read yet must not stop the loop that reads what it sends."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading

import pytest

from cairn_airflow.triggers import shared_archive, step, waiting_records
from cairn_airflow.triggers.loop_logger import LoopLogger

TRIGGER = contextvars.ContextVar[str | None]("TRIGGER", default=None)


def test_a_blocked_log_line_does_not_stop_the_loop_and_keeps_the_callers_context():
    released = threading.Event()
    written: list[tuple[str, str | None]] = []

    class NotRead(logging.Handler):
        """The supervisor, busy sending: the write waits until it reads again."""

        def emit(self, record: logging.LogRecord) -> None:
            released.wait(5)
            written.append((record.getMessage(), TRIGGER.get()))

    logger = logging.getLogger("test.loop_logger")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = NotRead()
    logger.addHandler(handler)

    async def trigger() -> int:
        TRIGGER.set("trigger 7")
        said = asyncio.create_task(LoopLogger("test.loop_logger").info("fired %s", "t007"))
        turns = 0
        for _ in range(5):  # the loop goes on serving the supervisor's answers
            await asyncio.sleep(0.01)
            turns += 1
        assert not said.done()
        released.set()
        await said
        return turns

    try:
        assert asyncio.run(trigger()) == 5
    finally:
        logger.removeHandler(handler)
    assert written == [("fired t007", "trigger 7")]


@pytest.mark.parametrize("module", [step, shared_archive, waiting_records])
def test_cairns_triggers_log_through_the_loop_logger(module):
    assert isinstance(module.log, LoopLogger)
