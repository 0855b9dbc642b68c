"""The switch's CRL discipline: stale and older CRLs refused, fail closed after the grace."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from support.certs import Pki, pem
from workers.switch.server import Switch, SwitchConfig
from workers.switch.tls import client_context, read_crl


def _crl(pki: Pki, *, now: datetime, next_update: datetime, revoked: list[int]) -> bytes:
    return pki.crl([(serial, now) for serial in revoked], next_update=next_update, now=now)


class CrlFeed:
    """A CRL source the test controls: the next answer, or an outage."""

    def __init__(self, first: bytes) -> None:
        self.answer: bytes | None = first

    def __call__(self) -> bytes:
        if self.answer is None:
            raise ConnectionError("the control plane is unreachable")
        return self.answer


@pytest.fixture
def started(configure: Callable[..., SwitchConfig]) -> Iterator[Callable[..., Switch]]:
    switches: list[Switch] = []

    def start(**kw: object) -> Switch:
        switch = Switch(configure("cluster-a", **kw)).start()
        switches.append(switch)
        return switch

    yield start
    for switch in switches:
        switch.stop()


def _tls_accepted(switch: Switch, pki: Pki) -> bool:
    """Whether the switch's worker port completes a TLS handshake."""
    context = client_context(ca_path=pki.ca_path)
    raw = socket.create_connection(switch.worker_address, timeout=5)
    try:
        with context.wrap_socket(raw, server_hostname="cluster-a"):
            return True
    except OSError:
        return False
    finally:
        raw.close()


def test_a_crl_past_its_next_update_is_refused(pki: Pki) -> None:
    now = datetime.now(UTC)
    stale = _crl(
        pki, now=now - timedelta(hours=2), next_update=now - timedelta(hours=1), revoked=[]
    )
    with pytest.raises(ValueError, match="stale"):
        read_crl(stale, pem(pki.ca_cert))


def test_an_older_crl_cannot_take_back_a_revocation(
    pki: Pki, started: Callable[..., Switch]
) -> None:
    now = datetime.now(UTC)
    older = _crl(
        pki, now=now - timedelta(minutes=10), next_update=now + timedelta(hours=1), revoked=[]
    )
    newer = _crl(pki, now=now, next_update=now + timedelta(hours=1), revoked=[4242])
    feed = CrlFeed(newer)
    switch = started(crl_source=feed)
    assert 4242 in switch.revoked
    feed.answer = older  # replayed: it does not list the revocation
    switch.refresh_crl()
    assert 4242 in switch.revoked
    with pytest.raises(ValueError, match="older"):
        switch.refresh_crl(strict=True)


def test_without_a_fresh_crl_the_switch_fails_closed_after_the_grace_and_recovers(
    pki: Pki, started: Callable[..., Switch]
) -> None:
    now = datetime.now(UTC)
    feed = CrlFeed(_crl(pki, now=now, next_update=now + timedelta(hours=1), revoked=[]))
    switch = started(crl_source=feed, crl_grace_s=0.0)
    assert _tls_accepted(switch, pki)
    feed.answer = None  # the control plane goes away
    switch.refresh_crl()
    assert switch.failed_closed
    assert not _tls_accepted(switch, pki)
    feed.answer = _crl(pki, now=datetime.now(UTC), next_update=now + timedelta(hours=1), revoked=[])
    switch.refresh_crl()
    assert not switch.failed_closed
    assert _tls_accepted(switch, pki)


def test_within_the_grace_a_failed_refresh_keeps_serving(
    pki: Pki, started: Callable[..., Switch]
) -> None:
    now = datetime.now(UTC)
    feed = CrlFeed(_crl(pki, now=now, next_update=now + timedelta(hours=1), revoked=[]))
    switch = started(crl_source=feed, crl_grace_s=3600.0)
    feed.answer = None
    switch.refresh_crl()
    assert not switch.failed_closed
