"""Start, watch and stop the stack's processes by pid, with errors that name the service.

Each service is one process group started here; its pid file and log live under the state
folder, so `down` stops exactly what `up` started and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class StackError(RuntimeError):
    """A service could not start; the message names the service, the cause and its log."""


@dataclass
class Service:
    name: str
    argv: Sequence[str]
    state_dir: Path
    ports: Sequence[int]
    healthy: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None
    """First-start chores (checks, formatting, migrations), run only when not yet running."""
    stop_signal: int = signal.SIGTERM

    @property
    def log(self) -> Path:
        return self.state_dir / "logs" / f"{self.name}.log"

    @property
    def workdir(self) -> Path:
        """Its working folder: what it writes relative to it (Spark Connect's session artifacts,
        a Spark driver's warehouse) stays in the state folder, out of the checkout."""
        return self.state_dir / "work" / self.name

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "pids" / f"{self.name}.pid"

    def pid(self) -> int | None:
        """The pid of our running process, or None (a stale pid file is removed).

        The pid file holds the pid and the process's start time, so a pid reused by another
        program after a reboot or crash is never taken for ours (nor signalled by `stop`).
        """
        try:
            pid_text, _, started = self.pidfile.read_text().partition(" ")
            pid = int(pid_text)
        except (FileNotFoundError, ValueError):
            return None
        if started and _start_time(pid) == started.strip():
            return pid
        self.pidfile.unlink(missing_ok=True)
        return None

    def start(self, timeout: float) -> None:
        """Start unless running, then wait until healthy; on failure leave nothing running."""
        if self.pid() is not None:
            self.wait_healthy(timeout)
            return
        for port in self.ports:
            if not port_free(port):
                raise StackError(
                    f"{self.name}: port {port} is already in use by another program; "
                    f"free it or set another port (see include/cairn_stack/settings.py)"
                )
        if self.prepare is not None:
            self.prepare()
        for folder in (self.log.parent, self.pidfile.parent, self.workdir):
            folder.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            try:
                proc = subprocess.Popen(
                    list(self.argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.env},
                    cwd=self.workdir,
                    start_new_session=True,
                )
            except FileNotFoundError as err:
                raise StackError(f"{self.name}: cannot run {self.argv[0]!r}: {err}") from None
        self.pidfile.write_text(f"{proc.pid} {_start_time(proc.pid)}")
        try:
            self.wait_healthy(timeout, proc)
        except BaseException:
            self.stop()
            _signal_group(proc.pid, signal.SIGKILL)  # children of a leader that already exited
            raise

    def wait_healthy(self, timeout: float, proc: subprocess.Popen | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise StackError(
                    f"{self.name}: exited with code {proc.returncode} during start; "
                    f"see {self.log}:\n{tail(self.log)}"
                )
            if self.healthy():
                return
            time.sleep(0.5)
        raise StackError(
            f"{self.name}: not healthy after {timeout:.0f}s; see {self.log}:\n{tail(self.log)}"
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop our process group (TERM, then KILL); True if something was running."""
        pid = self.pid()
        if pid is None:
            return False
        _signal_group(pid, self.stop_signal)
        deadline = time.monotonic() + timeout
        while _start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_group(pid, signal.SIGKILL)  # also children the leader left behind
        self.pidfile.unlink(missing_ok=True)
        return True


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # comm may hold spaces and ")"
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


_HANDED_OUT: set[int] = set()
"""Ports `free_port_block` gave this process: a block's service may start long after (a
session's fixtures start lazily), so they are never given again."""
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SHARE = (0, 1)


def share_ports(index: int, of: int) -> None:
    """Choose ports only from the `index`-th of `of` equal slices of the range: processes that
    choose side by side (the test suite's workers) then never hand out the same port, which
    `port_free` cannot promise before a service binds it."""
    global _SHARE
    if not 0 <= index < of:
        raise ValueError(f"port share {index} of {of}")
    _SHARE = (index, of)


def free_port_block(count: int, step: int = 1) -> list[int]:
    """`count` ports, each with its `step - 1` successors also free (for services that take
    `port + 1` as well). From below the kernel's ephemeral range, where it picks the ports of
    outgoing connections: a service started minutes after its ports were chosen would otherwise
    find a client's connection on one."""
    try:
        top = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        top = 32768  # Linux's default
    bottom = min(20000, top // 2)
    index, of = _SHARE
    width = (top - bottom) // of
    low, top = bottom + index * width, bottom + (index + 1) * width
    for _ in range(1000):
        base = random.randrange(low, top - count * step)
        ports = [base + i * step for i in range(count)]
        wanted = {p + j for p in ports for j in range(step)}
        if not wanted & _HANDED_OUT and all(port_free(p) for p in wanted):
            _HANDED_OUT.update(wanted)
            return ports
    raise StackError(f"no {count} free ports (step {step}) between {low} and {top}")
