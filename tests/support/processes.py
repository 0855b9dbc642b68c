"""What a test runs beside itself: start it, poll until it serves, stop it; written once.

`wait_until` is the one poll loop (a deadline, a tick, a check, and the thing it waits on
still alive), `stop_all` the one shutdown (a polite signal, a grace period, then SIGKILL
to the whole session where the child has one of its own), and `serving` joins them around
a child process that logs to a file: every server, switch and provider of the tests starts
and stops through these.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Process = subprocess.Popen[bytes]


def wait_until(
    check: Callable[[], Any],
    what: str | Callable[[], str],
    timeout: float = 180.0,
    *,
    interval: float = 0.25,
    alive: Callable[[], bool] | None = None,
) -> Any:
    """Poll `check` until it returns something truthy and return that; fail with `what`
    after `timeout` seconds, or as soon as `alive` (what is waited on is still running)
    says no."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if alive is not None and not alive():
            raise AssertionError(f"stopped while waiting for {_described(what)}")
        tick.wait(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {_described(what)}")


def _described(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def running(process: Process) -> Callable[[], bool]:
    """`alive` for `wait_until`: whether `process` has not exited."""
    return lambda: process.poll() is None


def spawn(
    argv: list[str],
    log_path: Path,
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    own_session: bool = False,
    append: bool = True,
) -> Process:
    """`argv` started with its output in `log_path` (after what is there when `append`); in
    a session of its own when `own_session` (so that `stop_all` can kill what it started)."""
    with log_path.open("ab" if append else "wb") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=own_session,
        )


def stop_all(
    processes: Iterable[Process], *, sig: signal.Signals = signal.SIGTERM, timeout: float = 30
) -> None:
    """Send `sig` to every process still running, then give each `timeout` seconds to exit
    before SIGKILL (to its whole session when it leads one)."""
    alive = [process for process in processes if process.poll() is None]
    for process in alive:
        process.send_signal(sig)
    for process in alive:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill(process)


def kill(process: Process) -> None:
    """SIGKILL: no goodbye to anyone (its whole session, when it leads one)."""
    try:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=20)


@contextmanager
def serving(
    argv: list[str],
    log_path: Path,
    *,
    env: Mapping[str, str],
    ready: Callable[[Path], Any],
    what: str,
    timeout: float,
    cwd: Path | None = None,
    stop_signal: signal.Signals = signal.SIGINT,
    stop_timeout: float = 30,
) -> Iterator[Process]:
    """`argv` in a session of its own, logging to `log_path`, yielded once `ready(log_path)`
    holds; stopped with `stop_signal` (then SIGKILL) when the block ends."""
    process = spawn(argv, log_path, env=env, cwd=cwd, own_session=True, append=False)
    try:
        wait_until(
            lambda: ready(log_path),
            lambda: f"{what}; its log:\n{log_path.read_text(errors='replace')}",
            timeout,
            interval=0.2,
            alive=running(process),
        )
        yield process
    finally:
        stop_all([process], sig=stop_signal, timeout=stop_timeout)


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without any NEBULA_* setting, plus `settings`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("NEBULA_")}
    env.update(settings)
    return env
