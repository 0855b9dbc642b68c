"""The switch server: the only door of a cluster, one per cluster.

Blocking TLS sockets, one thread per connection (measured faster than asyncio
TLS here, and OpenSSL releases the GIL while it encrypts). Two listeners:

- workers of this cluster connect over TLS and present a job token; a worker
  opens one connection to send and one to receive, so that no TLS socket is
  ever read and written by two threads at once. A role whose connections drop
  without its goodbye may come back within `resume_grace_s` with the same token
  (its `SwitchLink` resends what the far role has not acknowledged, end to end).
  The link pings on both connections; the switch answers each ping (and says it is
  there while it waits on the link beyond), and cuts a worker connection it has
  heard nothing on for `io_timeout_s`: a path gone silent;
- peer switches connect with mutual TLS; each switch dials every peer and
  sends its frames on the connection it dialled, and reads acknowledgements
  back on it. Unacknowledged frames stay in a bounded `ResendWindow` and go
  again, in order, after a reconnection; the peer hello says where they start,
  so the receiver drops what it already took. Frames of each job wait in their
  own queue, served in turn, and a receiving switch never waits on one job's
  mailbox: a job whose role reads slowly holds up no other job on the link.
  A peer that takes no bytes, or answers no ping, for `io_timeout_s` is
  reconnected; the pings also time the link's round trip, and the
  acknowledged bytes its rate (`LinkMeter`), reported on /metrics per job and
  to the roles.

A small frame that finds nothing queued is written on by the thread that has it, at
each hop (outlet.py): the worker connection's reader writes it to the peer, the peer
connection's reader to the role; the writer threads take over whenever frames queue
(large frames, a busy connection, a shaped link), so fairness and bounds are theirs.

A switch runs from plain files (key, certificate, CA certificate) plus a CRL
source (any callable returning CRL PEM) and the job-token public key.
"""

from __future__ import annotations

import gc
import secrets
import threading
from pathlib import Path

from prometheus_client import (
    generate_latest,
    start_http_server,
)

from contract.jobtoken import (
    load_job_token_public_key,
)
from workers.switch.core import (
    Address,
    Meters,
    SwitchConfig,
    crl_from_file,
    log,
)
from workers.switch.credentials import Credentials, Revocation
from workers.switch.doors import DoorState
from workers.switch.peers import FairQueue, Outbound, Peers, PeersIn
from workers.switch.roles import Jobs, Roles
from workers.switch.rules import UnclaimedMailboxes, admit_worker
from workers.switch.stream import cut
from workers.switch.tls import (
    validate_cluster_name,
)

__all__ = [
    "Address",
    "FairQueue",
    "Switch",
    "SwitchConfig",
    "admit_worker",
    "crl_from_file",
    "settle_process",
]


def settle_process() -> None:
    """For a process that runs a switch and little else (the switch agent), once it has
    started: what it loaded is never garbage, and the cyclic collector leaves it alone.

    Frames wait in resend windows and mailboxes long enough to outlive the collector's
    young generations, and bring full collections on, each of which walked every object
    of the process (bench/results/switch_profiles/NOTES.md). Not for a process that runs
    switches among other work (tests): what is frozen is never collected.
    """
    gc.collect()
    gc.freeze()


class Switch(Roles, Peers, Credentials):
    """A switch server run by threads in this process: `start()`, `stop()`, or `with`."""

    def __init__(self, config: SwitchConfig) -> None:
        validate_cluster_name(config.cluster)
        self.config = config
        self.cluster = config.cluster
        key = config.job_token_public_key
        self._token_key = load_job_token_public_key(key) if isinstance(key, bytes) else key
        self._ca_pem = Path(config.ca_path).read_bytes()
        self._session = secrets.token_hex(8)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: object | None = None
        # one lock for the state below; `_changed` tells waiters a role or connection went
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._doors = DoorState()
        self._revocation = Revocation()
        self._jobs = Jobs(
            UnclaimedMailboxes(
                per_peer=config.unclaimed_mailboxes_per_peer,
                expiry_s=config.unclaimed_mailbox_s,
            )
        )
        self._peers_in = PeersIn()
        self._outbound: dict[str, Outbound] = {}
        self._meters = Meters()
        self.registry = self._meters.registry
        self.reload_certificate()
        self.worker_address: Address = config.worker_address
        self.peer_address: Address = config.peer_address

    # life cycle

    def start(self) -> Switch:
        """Load the CRL (failing if it cannot), bind both listeners and start the threads."""
        self.refresh_crl(strict=True)
        worker_listener = self._listen(self.config.worker_address)
        peer_listener = self._listen(self.config.peer_address)
        self.worker_address = worker_listener.getsockname()[:2]
        self.peer_address = peer_listener.getsockname()[:2]
        self._spawn(self._accept_loop, worker_listener, self._serve_worker, name="workers")
        self._spawn(self._accept_loop, peer_listener, self._serve_peer, name="peers")
        self._spawn(self._crl_loop, name="crl")
        self._spawn(self._auth_watchdog, name="auth-watchdog")
        if self.config.renew is not None:
            self._spawn(self._renew_loop, name="renew")
        for cluster, address in self.config.peers.items():
            self.add_peer(cluster, address)
        if self.config.metrics_address is not None:
            host, port = self.config.metrics_address
            self._metrics_server, _ = start_http_server(port, host, registry=self.registry)
        log.info(
            "switch %s: workers on %s, peers on %s",
            self.cluster,
            self.worker_address,
            self.peer_address,
        )
        return self

    def stop(self) -> None:
        """Close every listener and connection and join the threads."""
        self._stop.set()
        for listener in self._doors.listeners:
            cut(listener)
        with self._lock:
            streams = [*self._doors.peers, *self._doors.workers]
            streams += [o.stream for o in self._outbound.values() if o.stream is not None]
        for stream in streams:
            cut(stream.sock)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()  # type: ignore[attr-defined]
        for thread in self._threads:
            thread.join(timeout=5)
        for listener in self._doors.listeners:
            listener.close()  # its port is free for a switch started in its place

    def __enter__(self) -> Switch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition of this switch's counters."""
        return generate_latest(self.registry)
