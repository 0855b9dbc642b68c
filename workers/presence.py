"""Switches and workers report in to the control plane, so that its cluster health is true."""

from __future__ import annotations

import logging
import os
import socket
import threading
from importlib import metadata

import httpx

from workers.control_plane import ClusterClient, ControlPlaneError

log = logging.getLogger("nebula.presence")


def version() -> str:
    """This installation's version."""
    try:
        return metadata.version("nebula")
    except metadata.PackageNotFoundError:
        return "unknown"


def instance_name(cluster: str, pid: int | None = None) -> str:
    """How a process of a cluster names itself: host:cluster:pid."""
    return f"{socket.gethostname()}:{cluster}:{pid if pid is not None else os.getpid()}"


class PresenceReporter:
    """A thread that reports this process in every few seconds, and says goodbye at stop."""

    def __init__(self, client: ClusterClient, *, kind: str, cluster: str) -> None:
        self.client, self.kind = client, kind
        self.instance = instance_name(cluster)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"presence-{kind}", daemon=True)

    def start(self) -> PresenceReporter:
        self._thread.start()
        return self

    def _report(self, online: bool) -> float:
        return self.client.report_presence(
            kind=self.kind, instance=self.instance, version=version(), online=online
        )

    def _run(self) -> None:
        every = 10.0
        while not self._stop.is_set():
            try:
                every = self._report(True)
            except (httpx.TransportError, ControlPlaneError) as exc:
                log.warning("could not report in: %s", exc)
            self._stop.wait(every)

    def stop(self) -> None:
        """Stop reporting and tell the control plane this process is leaving."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            self._report(False)
        except (httpx.TransportError, ControlPlaneError) as exc:
            log.warning("could not report leaving: %s", exc)
