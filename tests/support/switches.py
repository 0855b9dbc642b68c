"""Switches for a test: pairs on loopback with a throwaway PKI, a link-cutting proxy, a log waiter.

Nothing here imports the control plane: certificates come from support.certs. The fixtures
live here so that the switch tests and the security suite share them (their conftest.py
files import them by name).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from support.certs import Pki, make_pki
from workers.switch.client import SwitchLink
from workers.switch.server import Switch, SwitchConfig, crl_from_file
from workers.switch.shaper import ShaperConfig


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def other_pki(tmp_path: Path) -> Pki:
    """A second, unrelated CA."""
    return make_pki(tmp_path / "other-pki", "Other CA")


@pytest.fixture
def configure(pki: Pki) -> Callable[..., SwitchConfig]:
    """`configure(cluster, **overrides)`: a switch config with a fresh certificate."""
    return lambda cluster, **kw: switch_config(pki, cluster, **kw)


@dataclass
class Pair:
    """Two switches on loopback, each the other's peer."""

    pki: Pki
    a: Switch
    b: Switch

    def link(
        self,
        side: str,
        job: str,
        role: str,
        peer: str,
        *,
        via: tuple[str, int] | None = None,
        **kw: object,
    ) -> SwitchLink:
        """A role's link to the switch of `side` ("a" or "b"), dialling `via` (a proxy in
        front of that switch's worker door) when given."""
        switch = self.a if side == "a" else self.b
        return SwitchLink(
            via or switch.worker_address,
            ca_path=self.pki.ca_path,
            token=self.pki.token(job, role, switch.cluster),
            job_id=job,
            role=role,
            peer_role=peer,
            **kw,  # type: ignore[arg-type]
        )

    def link_pair(self, job: str, role_a: str, role_b: str) -> tuple[SwitchLink, SwitchLink]:
        """Role a's link to switch a and role b's to switch b, opened together (each end
        waits for its peer role)."""
        ends: dict[int, SwitchLink] = {}

        def open_end(side: int, role: str, peer: str) -> None:
            ends[side] = self.link("ab"[side], job, role, peer)

        threads = [
            threading.Thread(target=open_end, args=(0, role_a, role_b)),
            threading.Thread(target=open_end, args=(1, role_b, role_a)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return ends[0], ends[1]

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()


def switch_config(pki: Pki, cluster: str, **overrides: object) -> SwitchConfig:
    key_path, cert_path, _ = pki.issue(cluster)
    fields: dict[str, object] = {
        "cluster": cluster,
        "key_path": key_path,
        "cert_path": cert_path,
        "ca_path": pki.ca_path,
        "crl_source": crl_from_file(pki.crl_path),
        "job_token_public_key": pki.token_public_key_pem,
        "crl_refresh_s": 3600,  # tests refresh explicitly
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.2,
        "shaper": ShaperConfig(rate_mbit=None),
    }
    fields.update(overrides)
    return SwitchConfig(**fields)  # type: ignore[arg-type]


def start_pair(
    pki: Pki,
    *,
    a_peer_address: Callable[[Switch], tuple[str, int]] | None = None,
    b_peer_address: Callable[[Switch], tuple[str, int]] | None = None,
    **kw: object,
) -> Pair:
    """Switches a and b; `a_peer_address(b)` is where a dials b (b's peer door unless
    given: a proxy in front of it), `b_peer_address(a)` where b dials a."""
    a = Switch(switch_config(pki, "cluster-a", **kw)).start()
    b = Switch(switch_config(pki, "cluster-b", **kw)).start()
    b.add_peer("cluster-a", b_peer_address(a) if b_peer_address else a.peer_address)
    a.add_peer("cluster-b", a_peer_address(b) if a_peer_address else b.peer_address)
    return Pair(pki, a, b)


@pytest.fixture
def make_pair(pki: Pki) -> Iterator[Callable[..., Pair]]:
    """Start switch pairs that are stopped when the test ends."""
    started: list[Pair] = []

    def make(**kw: object) -> Pair:
        started.append(start_pair(pki, **kw))  # type: ignore[arg-type]
        return started[-1]

    yield make
    for p in started:
        p.stop()


@pytest.fixture
def pair(make_pair: Callable[..., Pair]) -> Pair:
    return make_pair()


@dataclass(eq=False)
class _Piped:
    """One connection through a `CuttingProxy`: the two sockets and how they are pumped."""

    client: socket.socket
    upstream: socket.socket | None  # None: blackholed before its target answered
    gate: threading.Event = field(default_factory=threading.Event)  # set: its pumps read
    dead: bool = False  # blackholed: what its pumps read is discarded, for good

    def __post_init__(self) -> None:
        self.gate.set()

    @property
    def socks(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class CuttingProxy:
    """A TCP forwarder whose connections a test can cut at will (a flaky WAN).

    A cut shuts the sockets down without closing them, as a wedged peer or a middlebox
    would: the far end gets an end of stream, and bytes that were not read stay unread.
    `down()` cuts and then refuses every new connection (reset as soon as it is
    accepted) until `up()`: the link is gone for a while. A connection whose target does
    not answer (a switch restarting behind the proxy) is refused the same way.
    `hold()` stops reading the open connections: their senders fill up and block.
    `blackhole()` makes the link fail silently until `up()`, as a dead path or a
    middlebox that drops traffic does: every byte of the open connections, and of those
    accepted meanwhile (connected to the target, or not if it does not answer), is read
    and thrown away, so that each sender's TCP sees its bytes taken, with no end of
    stream, no reset and no backpressure; an end closing its side is not passed on either.
    Only bytes already read when it starts may still arrive. A blackholed connection
    stays so after `up()` (what a dead path lost stays lost) until its ends close it or
    a cut; connections made after `up()` forward again.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._open: list[_Piped] = []  # what a cut drops
        self._all: list[_Piped] = []  # what `close()` releases
        self._mode: Literal["up", "down", "black"] = "up"
        self.cuts = 0
        self.accepted = 0  # connections forwarded
        self.refused = 0  # connections reset while down or without a target
        self.blackholed = 0  # connections that went silent, open or accepted while blackholed
        self.discarded = 0  # bytes read from blackholed connections and thrown away
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = None
            if self._mode != "down":
                with contextlib.suppress(OSError):
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)
            with self._lock:
                black = self._mode == "black"
                if self._mode == "down" or (upstream is None and not black):
                    self.refused += 1
                    _reset(client, upstream)
                    continue
                piped = _Piped(client, upstream, dead=black)
                if black:
                    self.blackholed += 1
                else:
                    self.accepted += 1
                self._open.append(piped)
                self._all.append(piped)
            for src, dst in ((client, upstream), (upstream, client)):
                if src is not None:
                    args = (piped, src, dst)
                    threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, piped: _Piped, src: socket.socket, dst: socket.socket | None) -> None:
        buf = bytearray(1 << 20)
        try:
            while piped.gate.wait() and (n := src.recv_into(buf)):
                if piped.dead or dst is None:
                    with self._lock:
                        self.discarded += n
                    continue
                dst.sendall(memoryview(buf)[:n])
        except OSError:
            pass
        # an end that closes a blackholed connection closes its own side only: the
        # other end hears nothing of it, as nothing else crosses a dead path
        for s in (src,) if piped.dead or dst is None else (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        """Stop reading the open connections (new ones still flow): their senders fill up."""
        with self._lock:
            for piped in self._open:
                piped.gate.clear()

    def blackhole(self) -> None:
        """Drop every byte of the open connections and of new ones, silently, until `up()`;
        the open ones (held ones too: they are read again) stay silent for good."""
        with self._lock:
            self._mode = "black"
            for piped in self._open:
                if not piped.dead:
                    piped.dead = True
                    self.blackholed += 1
                piped.gate.set()

    def cut(self) -> None:
        """Drop every open connection mid-stream."""
        with self._lock:
            dropped, self._open = self._open, []
            self.cuts += 1
        for piped in dropped:
            for s in piped.socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        """Drop every open connection and refuse new ones until `up()`."""
        with self._lock:
            self._mode = "down"
        self.cut()

    def up(self) -> None:
        """Forward new connections again (a blackholed connection stays silent)."""
        with self._lock:
            self._mode = "up"

    def close(self) -> None:
        self.listener.close()
        self.cut()
        with self._lock:
            for piped in self._all:
                piped.gate.set()


def _reset(*socks: socket.socket | None) -> None:
    """Close with a reset (linger 0), as a refusing middlebox does."""
    for s in socks:
        if s is None:
            continue
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


class LogWaiter(logging.Handler):
    """Collects switch log lines and lets a test wait for one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._cond:
            self.lines.append(record.getMessage())
            self._cond.notify_all()

    def wait_for(self, *parts: str, timeout: float = 10) -> str:
        """The first line holding every one of `parts`; fails after `timeout` seconds."""

        def found() -> str | None:
            return next((ln for ln in self.lines if all(p in ln for p in parts)), None)

        with self._cond:
            assert self._cond.wait_for(found, timeout), f"no log line with {parts}: {self.lines}"
            line = found()
            assert line is not None
            return line


@pytest.fixture
def switch_log() -> Iterator[LogWaiter]:
    waiter = LogWaiter()
    logger = logging.getLogger("nebula.switch")
    logger.addHandler(waiter)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield waiter
    logger.removeHandler(waiter)
    logger.setLevel(old)


@pytest.fixture
def cutting_proxy() -> Iterator[Callable[[tuple[str, int]], CuttingProxy]]:
    """Make proxies that are closed when the test ends."""
    proxies: list[CuttingProxy] = []

    def make(target: tuple[str, int]) -> CuttingProxy:
        proxies.append(CuttingProxy(target))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()
