"""The cluster side of the cluster API: how a worker and its roles reach the control plane.

A worker holds its cluster's worker credential and the control plane's URL; a role adds
the job token its claim returned, renewed by every heartbeat. Nothing here knows a
database or a data key: inputs arrive decrypted over the connection, outputs leave the
same way.
"""

from __future__ import annotations

import base64
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from common.urls import http_url
from contract import API_PREFIX
from contract.cluster_api import (
    ClaimIn,
    ClaimOut,
    EndedJobsIn,
    EndedJobsOut,
    ErrorCode,
    FinishIn,
    FinishOut,
    HeartbeatOut,
    MetricBatchIn,
    MetricBatchOut,
    MetricPoint,
    PresenceAnswer,
    PresenceIn,
    Rendezvous,
)
from contract.devices import DeviceInfo

log = logging.getLogger("nebula.cluster")

API = f"{API_PREFIX}/cluster"
WORKER_HEADER = "X-Nebula-Worker"
UPLOAD_CHUNK = 1024 * 1024
T = TypeVar("T")


class ControlPlaneError(Exception):
    """The control plane answered with an error status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


class Fenced(ControlPlaneError):
    """409: the attempt was fenced out, or the job ended; the role must stop."""


class Refused(ControlPlaneError):
    """401 or 403: a credential or token was refused (revoked, expired, foreign)."""


def check_control_plane_url(url: str) -> str:
    """The URL without a trailing slash; plain http only to a loopback address."""
    http_url(url, why_https="the control plane must be reached over https unless it runs here")
    return url.rstrip("/")


def tls_verify(ca_path: Path | None) -> ssl.SSLContext | bool:
    """How to check the control plane's HTTPS certificate: this CA file, or the system's."""
    return ssl.create_default_context(cafile=str(ca_path)) if ca_path is not None else True


def _raise_for(answer: httpx.Response) -> None:
    if answer.status_code < 400:
        return
    try:
        detail = str(answer.json().get("detail", answer.text))
    except ValueError:
        detail = answer.text[:500]
    if answer.status_code == 409:
        raise Fenced(answer.status_code, detail)
    if answer.status_code in (401, 403):
        raise Refused(answer.status_code, detail)
    raise ControlPlaneError(answer.status_code, detail)


def retrying(call: Callable[[], T], *, within_s: float, what: str) -> T:
    """`call` again after network errors and 5xx answers, for up to `within_s` seconds.

    Only for calls that are safe to repeat: heartbeats, numbered metric batches, finish.
    """
    deadline = time.monotonic() + within_s
    delay = 0.25
    while True:
        try:
            return call()
        except (httpx.TransportError, ControlPlaneError) as exc:
            retry = isinstance(exc, httpx.TransportError) or (
                isinstance(exc, ControlPlaneError) and exc.status >= 500
            )
            if not retry or time.monotonic() + delay > deadline:
                raise
            log.warning("%s failed (%s); trying again in %.1f s", what, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 4.0)


class ClusterClient:
    """A worker's connection to the cluster API, authenticated by its worker credential."""

    def __init__(
        self, url: str, *, credential: str, ca_path: Path | None = None, timeout: float = 30.0
    ) -> None:
        self.url = check_control_plane_url(url)
        self.http = httpx.Client(
            base_url=f"{self.url}{API}",
            headers={WORKER_HEADER: credential},
            timeout=timeout,
            verify=tls_verify(ca_path),
        )

    def close(self) -> None:
        self.http.close()

    def whoami(self) -> str:
        """The cluster the credential belongs to; Refused if it is unknown or revoked."""
        answer = self.http.get("/whoami")
        _raise_for(answer)
        return str(answer.json()["cluster"])

    def report_presence(
        self,
        *,
        kind: str,
        instance: str,
        version: str,
        online: bool,
        device: DeviceInfo | None = None,
    ) -> float:
        """Report this switch or worker (with its device) in, or leaving; how long until the
        next report."""
        # built unvalidated from the contract's model: the server judges the body
        body = PresenceIn.model_construct(
            kind=kind,  # type: ignore[arg-type]
            instance=instance,
            version=version,
            online=online,
            device=device,
        )
        answer = self.http.post("/presence", json=body.model_dump())
        _raise_for(answer)
        return PresenceAnswer.model_validate(answer.json()).report_every_s

    def ended_jobs(self, job_ids: list[str]) -> list[str]:
        """Of `job_ids`, those this cluster has no live part in any more."""
        answer = self.http.post(
            "/jobs/ended", json=EndedJobsIn.model_construct(job_ids=job_ids).model_dump()
        )
        _raise_for(answer)
        return EndedJobsOut.model_validate(answer.json()).ended

    def claim(
        self, *, job_id: str, role: str, attempt: int, worker: str, device: str = "cpu"
    ) -> RoleSession:
        """Start the role's attempt on a worker that trains on `device`; Fenced if it is
        stale, final or held, or if the role needs a device the worker lacks."""
        body = ClaimIn.model_construct(attempt=attempt, worker=worker, device=device)  # type: ignore[arg-type]
        answer = self.http.post(f"/jobs/{job_id}/roles/{role}/claim", json=body.model_dump())
        _raise_for(answer)
        return RoleSession(self, ClaimOut.model_validate(answer.json()))


class RoleSession:
    """The calls of one claimed role; every one carries its current job token."""

    def __init__(self, client: ClusterClient, claim: ClaimOut) -> None:
        self.client, self.claim = client, claim
        self.token = claim.token
        # seals what the role leaves on the cluster's disk
        self.checkpoint_key = base64.b64decode(claim.checkpoint_key)
        self._path = f"/jobs/{claim.job_id}/roles/{claim.role}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _post(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.client.http.post(f"{self._path}/{what}", json=body, headers=self._headers())
        _raise_for(answer)
        result: dict[str, Any] = answer.json()
        return result

    def heartbeat(self) -> None:
        """Beat and take the renewed token; Fenced once the attempt is over."""
        self.token = HeartbeatOut.model_validate(self._post("heartbeat", {})).token

    def post_metrics(
        self, *, seq: int, points: list[tuple[int, dict[str, float]]], checkpoint_step: int | None
    ) -> bool:
        """Send batch number `seq` (applied once however often it is sent)."""
        # unvalidated here: the server refuses a NaN or an oversized batch, as it always did
        body = MetricBatchIn.model_construct(
            seq=seq,
            points=[
                MetricPoint.model_construct(step=step, values=values) for step, values in points
            ],
            checkpoint_step=checkpoint_step,
        )
        return MetricBatchOut.model_validate(self._post("metrics", body.model_dump())).applied

    def read_input(self, name: str) -> Iterator[bytes]:
        """The input's decrypted bytes as they stream in."""
        with self.client.http.stream(
            "GET", f"{self._path}/inputs/{name}", headers=self._headers()
        ) as answer:
            if answer.status_code >= 400:
                answer.read()
                _raise_for(answer)
            yield from answer.iter_bytes(UPLOAD_CHUNK)

    def upload_artifact(self, data: bytes) -> dict[str, Any]:
        """Send the role's artifact to the control plane, which encrypts and stores it."""

        def chunks() -> Iterator[bytes]:
            view = memoryview(data)
            for start in range(0, len(view), UPLOAD_CHUNK):
                yield bytes(view[start : start + UPLOAD_CHUNK])

        answer = self.client.http.put(
            f"{self._path}/artifact",
            content=chunks(),
            headers={
                **self._headers(),
                "Content-Type": "application/octet-stream",
                "Content-Length": str(len(data)),
            },
        )
        _raise_for(answer)
        result: dict[str, Any] = answer.json()
        return result

    def publish_rendezvous(self, rendezvous: Rendezvous) -> None:
        """Tell this attempt's replicas where to join (the root discriminator)."""
        self._post("rendezvous", rendezvous.model_dump())

    def read_rendezvous(self) -> Rendezvous | None:
        """Where to join the discriminator's group (a replica); None until it is published."""
        answer = self.client.http.get(f"{self._path}/rendezvous", headers=self._headers())
        if answer.status_code == 404:
            return None
        _raise_for(answer)
        return Rendezvous.model_validate(answer.json())

    def finish(
        self,
        outcome: str,
        *,
        error_code: ErrorCode | None = None,
        error: str | None = None,
        report: dict[str, Any] | None = None,
    ) -> str:
        """Report how the role ended; returns the job's status."""
        body = FinishIn.model_validate(
            {
                "outcome": outcome,
                "error_code": None if error_code is None else error_code.value,
                "error": error,
                "report": report or {},
            }
        )
        return FinishOut.model_validate(
            self._post("finish", body.model_dump(mode="json"))
        ).job_status
