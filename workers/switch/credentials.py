"""Credentials and revocation: the switch's certificate, its renewal, the CRL."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from common.private_files import write_private_file
from workers.switch.core import (
    SwitchCore,
    log,
)
from workers.switch.stream import cut
from workers.switch.tls import (
    CrlInfo,
    client_context,
    make_switch_key_and_csr,
    needs_renewal,
    read_crl,
    server_context,
)


@dataclass
class Revocation:
    """The CRL held, and whether the switch fails closed for want of a fresh one."""

    crl: CrlInfo | None = None
    revoked: frozenset[int] = frozenset()
    fresh_at: float = 0.0  # monotonic time of the last good refresh
    failed_closed: bool = False


class Credentials(SwitchCore):
    """The switch's certificate, its renewal, and the CRL it checks peers against."""

    def reload_certificate(self) -> None:
        """Re-read key and certificate; new connections use them, open ones go on."""
        cfg = self.config
        worker_ctx = server_context(cert_path=cfg.cert_path, key_path=cfg.key_path, ca_path=None)
        peer_server_ctx = server_context(
            cert_path=cfg.cert_path, key_path=cfg.key_path, ca_path=str(cfg.ca_path)
        )
        peer_client_ctx = client_context(
            ca_path=cfg.ca_path, cert_path=cfg.cert_path, key_path=cfg.key_path
        )
        with self._lock:
            self._worker_ctx, self._peer_server_ctx = worker_ctx, peer_server_ctx
            self._peer_client_ctx = peer_client_ctx

    def renew_if_due(self, renew: Callable[[bytes], bytes], now: datetime | None = None) -> bool:
        """Renew the certificate through `renew(csr_pem) -> cert_pem` when a third is left."""
        if not needs_renewal(Path(self.config.cert_path).read_bytes(), now):
            return False
        key_pem, csr_pem = make_switch_key_and_csr(self.cluster)
        cert_pem = renew(csr_pem)
        write_private_file(self.config.key_path, key_pem)
        write_private_file(self.config.cert_path, cert_pem)
        self.reload_certificate()
        log.info("switch %s: certificate renewed", self.cluster)
        return True

    def refresh_crl(self, *, strict: bool = False) -> None:
        """Fetch and verify the CRL; cut open peer connections whose certificate is now revoked.

        A CRL past its nextUpdate, or older (a lower CRL number) than the one held, is
        refused. When no good CRL came for `crl_grace_s`, or the held one went stale, the
        switch fails closed: it cuts every connection and refuses new ones until a good
        CRL arrives.
        """
        try:
            info = read_crl(self.config.crl_source(), self._ca_pem)
            if self._revocation.crl is not None and info.number < self._revocation.crl.number:
                raise ValueError(
                    f"CRL number {info.number} is older than the held {self._revocation.crl.number}"
                )
        except Exception as exc:
            if strict:
                raise
            log.warning(
                "switch %s: CRL refresh failed, keeping the last one: %s", self.cluster, exc
            )
            self._fail_closed_if_stale()
            return
        with self._lock:
            held = self._revocation
            held.crl, held.revoked, held.fresh_at = info, info.revoked, time.monotonic()
            if held.failed_closed:
                log.warning("switch %s: a good CRL came; serving again", self.cluster)
            held.failed_closed = False
            peers = self._doors.peers
            doomed = [(s, i.serial) for s, i in peers.items() if i.serial in info.revoked]
            for stream, _ in doomed:
                peers.pop(stream, None)
        for stream, serial in doomed:
            log.warning(
                "switch %s: closing a connection of revoked certificate serial %s",
                self.cluster,
                serial,
            )
            self._meters.refused.labels("revoked").inc()
            cut(stream.sock)

    @property
    def revoked(self) -> frozenset[int]:
        """Serials of the certificates the held CRL revokes."""
        return self._revocation.revoked

    @property
    def failed_closed(self) -> bool:
        """Whether the switch refuses everything for want of a fresh CRL."""
        return self._revocation.failed_closed

    def _fail_closed_if_stale(self) -> None:
        held = self._revocation
        stale = held.crl is None or held.crl.next_update <= datetime.now(UTC)
        if not stale and time.monotonic() - held.fresh_at <= self.config.crl_grace_s:
            return
        with self._lock:
            if held.failed_closed:
                return
            held.failed_closed = True
            doomed = list(self._doors.peers) + list(self._doors.workers)
            self._doors.peers.clear()
        log.error("switch %s: no fresh CRL within the grace period; failing closed", self.cluster)
        for stream in doomed:
            cut(stream.sock)

    def _crl_loop(self) -> None:
        while not self._stop.wait(self.config.crl_refresh_s):
            self.refresh_crl()

    def _renew_loop(self) -> None:
        assert self.config.renew is not None
        while not self._stop.is_set():
            try:
                self.renew_if_due(self.config.renew)
            except Exception as exc:
                log.warning("switch %s: certificate renewal failed: %s", self.cluster, exc)
            if self._stop.wait(self.config.renew_check_s):
                return
