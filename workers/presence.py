"""Switches and workers report in to the control plane, so that its cluster health is true."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
from importlib import metadata
from pathlib import Path

import httpx

from contract.devices import DeviceInfo
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


MAX_SWEEP = 500


def sweep_scratch(client: ClusterClient, scratch_dir: Path) -> list[str]:
    """Remove the scratch folders of jobs that ended (a role that finished before its peer,
    or died, leaves one behind); returns the job ids removed."""
    jobs = scratch_dir / "jobs"
    folders = sorted(p.name for p in jobs.iterdir() if p.is_dir()) if jobs.is_dir() else []
    removed = []
    for start in range(0, len(folders), MAX_SWEEP):
        for job_id in client.ended_jobs(folders[start : start + MAX_SWEEP]):
            shutil.rmtree(jobs / job_id, ignore_errors=True)
            removed.append(job_id)
    return removed


class PresenceReporter:
    """A thread that reports this process in every few seconds, and says goodbye at stop.

    A worker's reporter also tells its device, and sweeps its scratch folder of jobs that
    ended.
    """

    def __init__(
        self,
        client: ClusterClient,
        *,
        kind: str,
        cluster: str,
        scratch_dir: Path | None = None,
        device: DeviceInfo | None = None,
    ) -> None:
        self.client, self.kind, self.scratch_dir = client, kind, scratch_dir
        self.device = device
        self.instance = instance_name(cluster)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"presence-{kind}", daemon=True)

    def start(self) -> PresenceReporter:
        self._thread.start()
        return self

    def _report(self, online: bool) -> float:
        return self.client.report_presence(
            kind=self.kind,
            instance=self.instance,
            version=version(),
            online=online,
            device=self.device,
        )

    def _run(self) -> None:
        every = 10.0
        while not self._stop.is_set():
            try:
                every = self._report(True)
                if self.scratch_dir is not None:
                    for job_id in sweep_scratch(self.client, self.scratch_dir):
                        log.info("removed the scratch folder of ended job %s", job_id)
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
