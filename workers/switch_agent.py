"""`nebula switch`: enroll with the control plane, then run the cluster's switch.

On first start the switch makes its own key, sends only a CSR with a single-use
enrollment token, and stores key, certificate, the CA certificate and the control
plane's job-token public key with mode 0600. That key is pinned: it is never fetched
again, so nobody who can answer for the control plane later can make the switch
accept their tokens. Afterwards the switch fetches the CRL from the control plane
(refusing revoked peers within `crl_refresh_s`, failing closed without a fresh CRL)
and renews its certificate when a third of its life is left, proving possession of
the current key. The control plane is reached over https unless it is on loopback.

It joins the switch (workers/switch/, which knows nothing of the control plane) to the
control-plane client (workers/control_plane.py), so it lives beside both.
"""

from __future__ import annotations

import base64
import json
import logging
import signal
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from common.private_files import write_private_file
from contract import API_PREFIX
from workers.control_plane import ClusterClient, check_control_plane_url, tls_verify
from workers.presence import PresenceReporter
from workers.switch.server import Address, Switch, SwitchConfig, settle_process
from workers.switch.shaper import ShaperConfig
from workers.switch.tls import make_switch_key_and_csr

log = logging.getLogger("nebula.switch")


class _InFolder:
    """A file of the switch's folder, by name: `SwitchFiles.key` is `folder / "switch.key"`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, files: SwitchFiles, owner: type | None = None) -> Path:
        return files.folder / self.name


@dataclass(frozen=True)
class SwitchFiles:
    """Where a switch keeps its identity: one folder, files of mode 0600."""

    folder: Path

    key = _InFolder("switch.key")
    cert = _InFolder("switch.crt")
    ca = _InFolder("ca.pem")
    job_key = _InFolder("job-token-key.pem")
    state = _InFolder("switch.json")

    def enrolled(self) -> bool:
        return all(p.exists() for p in (self.key, self.cert, self.ca, self.job_key))


def enroll(
    files: SwitchFiles,
    *,
    cluster: str,
    control_plane: str,
    token: str,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Make a key here, send the CSR with the enrollment token, store what comes back."""
    key_pem, csr_pem = make_switch_key_and_csr(cluster)
    answer = httpx.post(
        f"{control_plane}{API_PREFIX}/pki/enroll",
        json={"token": token, "csr_pem": csr_pem.decode()},
        timeout=30,
        verify=verify,
    )
    if answer.status_code != 201:
        raise SystemExit(
            f"enrollment refused ({answer.status_code}): {answer.json().get('detail')}"
        )
    issued = answer.json()
    files.folder.mkdir(parents=True, exist_ok=True)
    write_private_file(files.key, key_pem)
    write_private_file(files.cert, issued["certificate_pem"].encode())
    write_private_file(files.ca, issued["ca_pem"].encode())
    write_private_file(files.job_key, issued["job_token_public_key_pem"].encode())
    log.info("switch %s enrolled: certificate serial %s", cluster, issued["serial"])


def fetch(control_plane: str, path: str, verify: ssl.SSLContext | bool = True) -> bytes:
    """GET a public PKI document from the control plane."""
    answer = httpx.get(f"{control_plane}{API_PREFIX}{path}", timeout=30, verify=verify)
    answer.raise_for_status()
    return answer.content


def renewer(files: SwitchFiles, control_plane: str, verify: ssl.SSLContext | bool = True) -> object:
    """renew(csr_pem) -> cert_pem, proving possession of the current key."""

    def renew(csr_pem: bytes) -> bytes:
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        signature = key.sign(csr_pem, ec.ECDSA(hashes.SHA256()))
        answer = httpx.post(
            f"{control_plane}{API_PREFIX}/pki/renew",
            json={
                "certificate_pem": files.cert.read_text(),
                "csr_pem": csr_pem.decode(),
                "signature": base64.b64encode(signature).decode(),
            },
            timeout=30,
            verify=verify,
        )
        answer.raise_for_status()
        return str(answer.json()["certificate_pem"]).encode()

    return renew


def run(
    *,
    cluster: str,
    folder: Path,
    control_plane: str,
    enroll_token: str | None,
    worker_address: Address,
    peer_address: Address,
    peers: dict[str, Address],
    shaper: ShaperConfig | None,
    metrics_address: Address | None,
    crl_refresh_s: float = 30.0,
    crl_grace_s: float = 300.0,
    control_plane_ca: Path | None = None,
    credential: str | None = None,
    max_connections: int = 1024,
    max_connections_per_source: int = 64,
    auth_timeout_s: float = 5.0,
    stop: threading.Event | None = None,
) -> None:
    """Enroll if needed, start the switch, write its state file, serve until stopped."""
    try:
        control_plane = check_control_plane_url(control_plane)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    verify = tls_verify(control_plane_ca)
    files = SwitchFiles(folder)
    if not files.enrolled():
        if not enroll_token:
            raise SystemExit(f"switch {cluster} is not enrolled: pass --enroll-token")
        enroll(
            files, cluster=cluster, control_plane=control_plane, token=enroll_token, verify=verify
        )
    renew = renewer(files, control_plane, verify)
    config = SwitchConfig(
        cluster=cluster,
        key_path=files.key,
        cert_path=files.cert,
        ca_path=files.ca,
        crl_source=lambda: fetch(control_plane, "/pki/crl.pem", verify),
        job_token_public_key=files.job_key.read_bytes(),
        worker_address=worker_address,
        peer_address=peer_address,
        peers=dict(peers),
        crl_refresh_s=crl_refresh_s,
        crl_grace_s=crl_grace_s,
        max_connections=max_connections,
        max_connections_per_source=max_connections_per_source,
        auth_timeout_s=auth_timeout_s,
        shaper=shaper,
        metrics_address=metrics_address,
        renew=renew,  # type: ignore[arg-type]
    )
    switch = Switch(config).start()
    settle_process()
    state = {
        "cluster": cluster,
        "worker_address": list(switch.worker_address),
        "peer_address": list(switch.peer_address),
        "ca_path": str(files.ca.resolve()),
    }
    # whole or not at all (a rename): a worker or a test polling for it never reads it half
    # written, as the bundle's other files are written
    write_private_file(files.state, json.dumps(state, indent=2).encode())
    log.info(
        "switch %s serving workers on %s, peers on %s",
        cluster,
        switch.worker_address,
        switch.peer_address,
    )
    reporter = None
    if credential:  # the cluster's worker credential: the switch reports in with it
        client = ClusterClient(control_plane, credential=credential, ca_path=control_plane_ca)
        reporter = PresenceReporter(client, kind="switch", cluster=cluster).start()
    stop = stop or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, lambda *_: stop.set())
        except ValueError:  # not the main thread (tests run switches in threads)
            break
    try:
        stop.wait()
    finally:
        if reporter is not None:
            reporter.stop()
        switch.stop()
