"""The control plane served for a test: uvicorn in a thread (`LiveServer`), `nebula up` in a
folder of its own (`NebulaUp`), and `nebula serve` over a var folder (`nebula_serve`)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.settings import Settings
from support.processes import Process, environment, serving, wait_until
from workers.ports import free_port

# the password hashing of every test platform: cheap, as in tests/conftest.py's settings
CHEAP_ARGON2 = {"NEBULA_ARGON2_TIME_COST": "1", "NEBULA_ARGON2_MEMORY_KIB": "1024"}


def nebula(*args: str) -> list[str]:
    """argv of a `nebula` subcommand with this interpreter."""
    return [sys.executable, "-m", "cli", *args]


class LiveServer:
    """The control plane served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, settings: Settings) -> None:
        import uvicorn

        from app.main import create_app

        self.port = free_port()
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(
            lambda: self.server.started,
            "the control plane to start",
            30,
            interval=0.05,
            alive=self.thread.is_alive,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.app.state.engine.dispose()


class NebulaUp:
    """`nebula up` in a folder of its own, as a user runs it: SQLite, the embedded broker."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = environment(**CHEAP_ARGON2)
        self._stack = ExitStack()

    def command(self, *args: str) -> list[str]:
        """argv of a `nebula` subcommand with this interpreter."""
        return nebula(*args)

    def __enter__(self) -> NebulaUp:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process: Process = self._stack.enter_context(
            serving(
                self.command("up", "--port", str(self.port)),
                self.folder / "up.log",
                env=self.env,
                cwd=self.folder,
                ready=self._is_up,
                what="nebula up",
                timeout=120,
                stop_timeout=40,
            )
        )
        return self

    def _is_up(self, log: Path) -> bool:
        return b"Nebula is up" in log.read_bytes() and (self.folder / "var" / "logs").exists()

    @property
    def admin(self) -> dict[str, str]:
        """The demo admin's login that `nebula up` wrote."""
        login: dict[str, str] = json.loads((self.folder / "var" / "demo-admin.json").read_text())
        return login

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


@dataclass
class ServeProcess:
    """A `nebula serve` process of a test, on its port, logging to `log_path`."""

    process: Process
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def is_listening(log: str, workers: int) -> bool:
    """uvicorn's log says that all `workers` started and that the socket is bound: with one
    worker, uvicorn runs the app's startup before it binds, so "startup complete" alone
    comes before the port accepts connections."""
    return log.count("Application startup complete") >= workers and "Uvicorn running on" in log


@contextmanager
def nebula_serve(
    var: Path, log_path: Path, *, workers: int = 1, env_extra: dict[str, str] | None = None
) -> Iterator[ServeProcess]:
    """`nebula serve` on a free port over the (migrated) var folder `var`, its own process
    (session) with the test's argon2 costs and `env_extra` (more NEBULA_* settings); yields
    once every worker has started."""
    port = free_port()
    env = environment(**{"NEBULA_VAR_DIR": str(var), **CHEAP_ARGON2, **(env_extra or {})})
    argv = nebula("serve", "--port", str(port), "--workers", str(workers))
    with serving(
        argv,
        log_path,
        env=env,
        ready=lambda log: is_listening(log.read_text(), workers),
        what=f"nebula serve with {workers} worker(s)",
        timeout=90,
    ) as process:
        yield ServeProcess(process, port, log_path)
