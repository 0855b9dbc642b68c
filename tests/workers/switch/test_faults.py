"""Faults under a running stream, at the switch level: a switch restarts, a role's
connections drop, a peer stops reading, the link between the switches goes silent, one
job's role reads slowly; and the link measured under the shaper. Real TLS on loopback;
every wait has a deadline."""

from __future__ import annotations

import hashlib
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest

from support.switches import CuttingProxy, Pair
from workers.switch.client import SwitchLink
from workers.switch.server import Switch
from workers.switch.shaper import ShaperConfig

KIB = 1024


def _stream(
    link: SwitchLink, frames: int, size: int, before: Callable[[int], None] = lambda i: None
) -> str:
    """Send `frames` numbered frames of `size` bytes, calling `before(i)` ahead of frame
    `i`; the digest of what was sent."""
    digest = hashlib.sha256()
    for i in range(frames):
        before(i)
        body = i.to_bytes(4, "big") + bytes([i % 251]) * (size - 4)
        digest.update(body)
        link.send("s", body)
    return digest.hexdigest()


def _receive(link: SwitchLink, frames: int, on_frame: Callable[[int], None]) -> str:
    """Take `frames` frames, checking each is the next one; nothing more may follow."""
    digest = hashlib.sha256()
    for i in range(frames):
        got = link.recv("s", timeout=60)
        assert isinstance(got, bytes) and int.from_bytes(got[:4], "big") == i, "order or twice"
        digest.update(got)
        on_frame(i)
    with pytest.raises(TimeoutError):
        link.recv("s", timeout=0.5)  # nothing extra arrives
    return digest.hexdigest()


def _transfer(
    g: SwitchLink,
    d: SwitchLink,
    frames: int,
    size: int,
    *,
    before: Callable[[int], None] = lambda i: None,
    on_frame: Callable[[int], None] = lambda i: None,
) -> Callable[[], None]:
    """Stream `frames` frames from `g` to `d` on threads of their own, `before(i)` called
    ahead of sending frame `i` and `on_frame(i)` once it arrived; the returned `finish()`
    waits for both ends and checks that `d` took exactly what `g` sent, in order, once each."""
    sent: list[str] = []
    received: list[str] = []
    threads = [
        threading.Thread(target=lambda: sent.append(_stream(g, frames, size, before))),
        threading.Thread(target=lambda: received.append(_receive(d, frames, on_frame))),
    ]
    for thread in threads:
        thread.start()

    def finish() -> None:
        for thread in threads:
            thread.join(timeout=60)
        assert received and sent and received == sent

    return finish


def _restart(switch: Switch) -> Switch:
    """Stop a switch (every connection cut, everything it held gone) and start a new one
    on the same ports, as a supervisor does after a crash."""
    switch.config.worker_address = switch.worker_address
    switch.config.peer_address = switch.peer_address
    switch.stop()
    return Switch(switch.config).start()


def _wait(check: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        threading.Event().wait(0.02)


@pytest.mark.parametrize("which", ["sender's", "receiver's"])
def test_a_switch_restart_mid_stream_loses_nothing_and_repeats_nothing(
    make_pair: Callable[..., Pair], switch_log, which: str
) -> None:  # type: ignore[no-untyped-def]
    pair = make_pair()
    frames, size = 120, 64 * KIB
    restarted: list[Switch] = []

    def restart(i: int) -> None:
        if i == 40:
            if which == "sender's":
                pair.a = _restart(pair.a)
                restarted.append(pair.a)
            else:
                pair.b = _restart(pair.b)
                restarted.append(pair.b)

    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        _transfer(g, d, frames, size, on_frame=restart)()
        _wait(lambda: g.unacknowledged() == 0, "the last receipt to come back")
    assert restarted
    switch_log.wait_for("connection resumed")


def test_a_dropped_worker_connection_resumes_with_its_token(
    pair: Pair, cutting_proxy, switch_log
) -> None:  # type: ignore[no-untyped-def]
    proxy = cutting_proxy(pair.a.worker_address)
    g = pair.link("a", "j", "G", "D", via=proxy.address, cluster="cluster-a")
    frames, size = 150, 64 * KIB
    with g, pair.link("b", "j", "D", "G") as d:
        _transfer(g, d, frames, size, on_frame=lambda i: proxy.cut() if i in (30, 90) else None)()
        # and the other way, through the connection that came back
        d.send("back", b"ok")
        assert g.recv("back", timeout=30) == b"ok"
    assert proxy.cuts == 2
    switch_log.wait_for("link j/G: send connection resumed")


def test_a_silent_path_to_the_workers_switch_is_noticed_within_seconds_and_the_link_resumes(
    make_pair: Callable[..., Pair], cutting_proxy, switch_log
) -> None:  # type: ignore[no-untyped-def]
    """Both connections of a role to its switch go black mid-stream (bytes taken and
    lost, no end of stream, no reset, no backpressure): only pings left unanswered tell.
    The link drops each connection within the io timeout, dials again into the silence,
    the switch cuts its ends of the dead ones, and once the path is back the stream goes
    on: nothing lost, nothing twice."""
    io_timeout, ping_interval = 2.0, 0.5
    pair = make_pair(io_timeout_s=io_timeout, ping_interval_s=ping_interval)
    proxy: CuttingProxy = cutting_proxy(pair.a.worker_address)
    g = pair.link(
        "a",
        "j",
        "G",
        "D",
        via=proxy.address,
        cluster="cluster-a",
        timeout=2.0,  # a dial into the silence gives up this soon
        io_timeout_s=io_timeout,
        ping_interval_s=ping_interval,
    )
    frames, size = 120, 64 * KIB
    went_black = threading.Event()

    def blackhole(i: int) -> None:
        if i == 60:  # the frames from here on, and the receipts back, go into the silence
            proxy.blackhole()
            went_black.set()

    with g, pair.link("b", "j", "D", "G") as d:
        finish = _transfer(g, d, frames, size, before=blackhole)
        assert went_black.wait(30)
        black_at = time.monotonic()
        for direction in ("send", "recv"):
            switch_log.wait_for(f"link j/G: {direction} connection lost", "no answer to a ping")
            noticed = time.monotonic() - black_at
            assert noticed < io_timeout + ping_interval + 2.0, f"{direction}: {noticed:.1f} s"
        # the switch gives up its ends of the dead connections too
        switch_log.wait_for("worker connection", "the worker sent nothing")
        assert proxy.discarded > 0 and proxy.accepted == 2
        proxy.up()
        finish()
        _wait(lambda: g.unacknowledged() == 0, "the last receipt to come back")
        d.send("back", b"ok")  # and the other way, through the connection that came back
        assert g.recv("back", timeout=30) == b"ok"
    assert proxy.accepted >= 4
    switch_log.wait_for("link j/G: send connection resumed")
    switch_log.wait_for("link j/G: recv connection resumed")


def test_a_peer_that_stops_reading_is_cut_within_seconds(
    make_pair: Callable[..., Pair], cutting_proxy, switch_log
) -> None:  # type: ignore[no-untyped-def]
    proxies = []
    pair = make_pair(
        a_peer_address=lambda b: (
            proxies.append(cutting_proxy(b.peer_address)) or proxies[0].address
        ),
        io_timeout_s=2.0,
        ping_interval_s=0.5,
    )
    (proxy,) = proxies
    assert pair.a.wait_connected("cluster-b", 10)
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        g.send("c", b"before")
        assert d.recv("c", timeout=10) == b"before"
        proxy.hold()  # the connection stays open; nothing on it is read any more
        held_at = time.monotonic()
        switch_log.wait_for("link to cluster-b dropped", "stalled", timeout=15)
        noticed = time.monotonic() - held_at
        assert noticed < 2.0 + 0.5 + 3.0, f"noticed after {noticed:.1f} s"
        g.send("c", b"after")  # on a new connection
        assert d.recv("c", timeout=20) == b"after"
    assert pair.a.peer_connections("cluster-b") >= 2


def test_a_blackholed_proxy_drops_every_byte_silently_until_up_and_its_connections_for_good(
    cutting_proxy,
) -> None:  # type: ignore[no-untyped-def]
    """The fault itself, on plain TCP: what either end sends is taken (no backpressure)
    and lost, nobody hears of a close, and nothing lost turns up after `up()`."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    proxy: CuttingProxy = cutting_proxy(server.getsockname()[:2])
    big = bytes(32 * 1024 * 1024)  # far more than the sockets buffer: a held link blocks

    def connect() -> tuple[socket.socket, socket.socket]:
        near = socket.create_connection(proxy.address, timeout=10)
        far, _ = server.accept()
        far.settimeout(10)
        return near, far

    def silent(*socks: socket.socket) -> None:
        """Neither a byte nor an end of stream nor a reset comes to any of `socks`."""
        readable, _, _ = select.select(socks, [], [], 0.5)
        assert readable == []

    near, far = connect()
    near.sendall(b"before")
    assert far.recv(16) == b"before"
    proxy.blackhole()
    near.sendall(big)  # taken, though nobody will ever read it
    far.sendall(big)
    late_near, late_far = connect()  # accepted and connected on, while black
    late_near.sendall(b"lost")
    _wait(lambda: proxy.discarded == 2 * len(big) + 4, "the proxy to throw it all away")
    silent(near, far, late_near, late_far)
    proxy.up()
    new_near, new_far = connect()
    new_near.sendall(b"after")
    assert new_far.recv(16) == b"after"
    new_far.sendall(b"back")
    assert new_near.recv(16) == b"back"
    near.sendall(b"stale")
    late_near.sendall(b"stale")
    near.close()  # its far end hears nothing of it
    _wait(lambda: proxy.discarded == 2 * len(big) + 14, "the stale bytes to be thrown away")
    silent(far, late_near, late_far)
    assert (proxy.accepted, proxy.blackholed, proxy.refused, proxy.cuts) == (2, 2, 0, 0)
    for sock in (far, late_near, late_far, new_near, new_far, server):
        sock.close()


def test_a_silent_link_between_the_switches_is_noticed_within_seconds_and_the_stream_resumes(
    make_pair: Callable[..., Pair], cutting_proxy, switch_log
) -> None:  # type: ignore[no-untyped-def]
    """Both ways of the link go black mid-stream: bytes are taken and lost, with no end of
    stream, no reset and no backpressure, so only the pings left unanswered tell. Each
    switch drops its connection within the io timeout, dials again into the silence, and
    once the path is back the stream goes on, on new connections: nothing lost, nothing
    twice."""
    proxies: dict[str, CuttingProxy] = {}

    def via_proxy(name: str) -> Callable[[Switch], tuple[str, int]]:
        def address(switch: Switch) -> tuple[str, int]:
            proxies[name] = cutting_proxy(switch.peer_address)
            return proxies[name].address

        return address

    io_timeout, ping_interval = 2.0, 0.5
    pair = make_pair(
        a_peer_address=via_proxy("to b"),
        b_peer_address=via_proxy("to a"),
        io_timeout_s=io_timeout,
        ping_interval_s=ping_interval,
        handshake_timeout_s=2.0,  # a dial into the silence gives up this soon
    )
    assert pair.a.wait_connected("cluster-b", 10) and pair.b.wait_connected("cluster-a", 10)
    frames, size = 120, 64 * KIB
    went_black = threading.Event()

    def blackhole(i: int) -> None:
        if i == 60:  # the frames from here on leave into the silence
            for proxy in proxies.values():
                proxy.blackhole()
            went_black.set()

    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        finish = _transfer(g, d, frames, size, before=blackhole)
        assert went_black.wait(30)
        black_at = time.monotonic()
        for line in ("link to cluster-b dropped", "link to cluster-a dropped"):
            switch_log.wait_for(line, "stalled: no answer to a ping", timeout=15)
            noticed = time.monotonic() - black_at
            assert noticed < io_timeout + ping_interval + 3.0, f"{line} after {noticed:.1f} s"
        # frames lost on the way to b, their receipts and pings' answers on the way back
        assert proxies["to b"].discarded > size and proxies["to a"].discarded > 0
        for proxy in proxies.values():  # each switch dials again, into the silence
            _wait(lambda p=proxy: p.blackholed >= 2, "a dial while black", 10)
        assert all(p.accepted == 1 and p.refused == 0 for p in proxies.values())
        for proxy in proxies.values():
            proxy.up()
        up_at = time.monotonic()
        _wait(lambda: pair.a.peer_connections("cluster-b") >= 2, "a to dial b again", 15)
        _wait(lambda: pair.b.peer_connections("cluster-a") >= 2, "b to dial a again", 15)
        resumed = time.monotonic() - up_at
        finish()
        _wait(lambda: g.unacknowledged() == 0, "the last receipt to come back")
    # a dial caught in the silence gives up after the handshake timeout, the next one works
    assert resumed < 2.0 + 3.0, f"resumed {resumed:.1f} s after the path came back"
    switch_log.wait_for("peer cluster-a sent nothing")
    switch_log.wait_for("peer cluster-b sent nothing")


def test_a_job_whose_role_reads_slowly_holds_up_no_other_job(pair: Pair) -> None:
    size = 64 * KIB
    with (
        pair.link("a", "slow", "G", "D", window_frames=8) as g1,
        pair.link("b", "slow", "D", "G") as d1,
        pair.link("a", "fast", "G", "D") as g2,
        pair.link("b", "fast", "D", "G") as d2,
    ):
        # job "slow" sends far more than its peer takes (its role reads nothing yet)
        slow = threading.Thread(target=_stream, args=(g1, 200, size), daemon=True)
        slow.start()
        _wait(lambda: g1.unacknowledged() == 8, "the slow job's window to fill")
        started = time.monotonic()
        sent: list[str] = []
        fast = threading.Thread(target=lambda: sent.append(_stream(g2, 100, size)))
        fast.start()
        received = _receive(d2, 100, lambda i: None)
        fast.join(timeout=30)
        assert received == sent[0]
        fast_s = time.monotonic() - started
        assert slow.is_alive(), "the slow job should still be waiting on its reader"
        expected = hashlib.sha256()
        for i in range(200):
            expected.update(i.to_bytes(4, "big") + bytes([i % 251]) * (size - 4))
        assert _receive(d1, 200, lambda i: None) == expected.hexdigest()
        slow.join(timeout=30)
    assert fast_s < 30


def test_the_link_estimate_tracks_the_shaper(make_pair: Callable[..., Pair]) -> None:
    """10 Mbit/s and 20 ms one way (each switch shapes what it sends, acknowledgements
    included): the estimate is within 15% of 1.25 MB/s and 40 ms (+25 ms) round trip."""
    pair = make_pair(shaper=ShaperConfig(rate_mbit=10, delay_ms=20), ping_interval_s=0.25)
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        frames, size = 48, 64 * KIB  # 3 MiB: about 2.5 s at 1.25 MB/s
        sender = threading.Thread(target=_stream, args=(g, frames, size))
        sender.start()
        _receive(d, frames, lambda i: None)
        sender.join()
        _wait(lambda: (e := g.link_estimate()) is not None and e.samples >= 10, "an estimate")
        estimate = g.link_estimate()
        assert estimate is not None
        assert estimate.bandwidth_bytes_per_s == pytest.approx(1.25e6, rel=0.15)
        assert 0.040 <= estimate.rtt_s <= 0.065, estimate
        assert d.link_estimate() is None  # nothing was sent the other way: not measured
        series = 'nebula_switch_link_rtt_seconds{job="j",peer="cluster-b"}'
        _wait(lambda: series in pair.a.metrics_text().decode(), "the job's series on /metrics")
        line = next(ln for ln in pair.a.metrics_text().decode().splitlines() if series in ln)
        assert 0.040 <= float(line.split()[-1]) <= 0.065
    # the job's series go with its attempt; the switch's own figure stays
    assert pair.a.wait_role_ended("j", "G", timeout=10)
    assert series not in pair.a.metrics_text().decode()
    assert pair.a.link_estimate("cluster-b") is not None
