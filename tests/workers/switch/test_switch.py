"""Two switches on loopback, real TLS: delivery, link cuts, rotation, metrics."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
import torch

from support.certs import serial_of
from workers.switch.client import SwitchLink
from workers.switch.rules import ACK_EVERY
from workers.switch.shaper import Shaper, ShaperConfig


def test_bytes_and_tensors_cross_both_ways_in_order(pair) -> None:
    with pair.link("a", "job1", "G", "D") as g, pair.link("b", "job1", "D", "G") as d:
        tensors = [
            torch.randn(3, 4),
            torch.arange(10, dtype=torch.int64),
            torch.randn(2, 2).to(torch.bfloat16),
            torch.randn(5).to(torch.float16)[::2],  # not contiguous
            torch.zeros(0, 3),
            torch.tensor(7.0),
        ]
        for t in tensors:
            g.send("acts", t)
        g.send("ids", b"hello")
        d.send("grads", b"back")
        for t in tensors:
            got = d.recv("acts", timeout=10)
            assert isinstance(got, torch.Tensor)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
        assert d.recv("ids", timeout=10) == b"hello"
        assert g.recv("grads", timeout=10) == b"back"
        with pytest.raises(TimeoutError):
            g.recv("grads", timeout=0.05)
        assert g.bytes_sent()["ids"] == 5
    metrics = pair.a.metrics_text().decode()
    assert 'nebula_switch_frames_total{direction="to_peer",job="job1"} 7.0' in metrics
    assert 'nebula_switch_bytes_total{direction="from_peer",job="job1"} 4.0' in metrics


def test_jobs_are_kept_apart(pair) -> None:
    with (
        pair.link("a", "job1", "G", "D") as g1,
        pair.link("a", "job2", "G", "D") as g2,
        pair.link("b", "job1", "D", "G") as d1,
        pair.link("b", "job2", "D", "G") as d2,
    ):
        g1.send("x", b"one")
        g2.send("x", b"two")
        assert d2.recv("x", timeout=10) == b"two"
        assert d1.recv("x", timeout=10) == b"one"


def _stream(sender: SwitchLink, frames: int, size: int, sent_digest: list[str]) -> None:
    digest = hashlib.sha256()
    gen = torch.Generator().manual_seed(1)
    buf = torch.empty(size // 4, dtype=torch.float32)
    for i in range(frames):
        buf.uniform_(generator=gen)
        buf[0] = i
        digest.update(buf.numpy().tobytes())
        sender.send("stream", buf)
    sent_digest.append(digest.hexdigest())


def _receive(receiver: SwitchLink, frames: int, on_frame: callable) -> str:  # type: ignore[valid-type]
    digest = hashlib.sha256()
    for i in range(frames):
        got = receiver.recv("stream", timeout=30)
        assert isinstance(got, torch.Tensor)
        assert int(got[0]) == i, "out of order or duplicated"
        digest.update(got.numpy().tobytes())
        on_frame(i)
    with pytest.raises(TimeoutError):
        receiver.recv("stream", timeout=0.2)  # nothing extra arrives
    return digest.hexdigest()


def test_a_200mb_stream_survives_repeated_link_cuts(make_pair, cutting_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = None

    def via_proxy(b):  # type: ignore[no-untyped-def]
        nonlocal proxy
        proxy = cutting_proxy(b.peer_address)
        return proxy.address

    pair = make_pair(a_peer_address=via_proxy)
    assert proxy is not None
    frames, size = 200, 1024 * 1024  # 200 MiB in 1 MiB frames
    cut_at = {30, 70, 110, 150, 185}
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        sent: list[str] = []
        sender = threading.Thread(target=_stream, args=(g, frames, size, sent))
        sender.start()
        received = _receive(d, frames, lambda i: proxy.cut() if i in cut_at else None)
        sender.join()
    assert received == sent[0]
    assert proxy.cuts == len(cut_at)
    # the last cut's reconnection may come after the last frame: the frames after the cut
    # can all have crossed before it, and the sending switch dials again on its own time
    deadline = time.monotonic() + 30
    while pair.a.peer_connections("cluster-b") <= len(cut_at) and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert pair.a.peer_connections("cluster-b") > len(cut_at)


def _wait_until_steady(value, settle: float, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait until `value()` is non-zero and has not changed for `settle` seconds."""
    deadline = time.monotonic() + timeout
    last, since = value(), time.monotonic()
    while not last or time.monotonic() - since < settle:
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        threading.Event().wait(0.01)
        if (now := value()) != last:
            last, since = now, time.monotonic()


def test_a_cut_of_a_full_link_is_noticed_by_a_sender_blocked_in_a_write(  # type: ignore[no-untyped-def]
    make_pair, cutting_proxy, switch_log
) -> None:
    """The far end stops reading, the link fills, the sending switch blocks in a write; then
    the link is cut (a half-close: an end of stream, and the unread bytes stay unread). The
    sender must see the end of stream and reconnect now, not after io_timeout_s."""
    proxy = None

    def via_proxy(b):  # type: ignore[no-untyped-def]
        nonlocal proxy
        proxy = cutting_proxy(b.peer_address)
        return proxy.address

    pair = make_pair(a_peer_address=via_proxy, io_timeout_s=60.0, resend_frames=1000)
    assert proxy is not None
    size, frames = 1024 * 1024, 160
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        assert pair.a.wait_connected("cluster-b", 10)
        proxy.hold()

        def send() -> None:
            for i in range(frames):
                g.send("c", i.to_bytes(4, "big") + bytes(size - 4))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        # the socket buffers fill and the sender blocks in a write, with frames still queued
        # behind it: its count of frames waiting for an acknowledgement stops moving
        unacked = pair.a.unacked_frames
        _wait_until_steady(lambda: unacked("cluster-b"), 1.0, 60, "the link filled up")
        assert 0 < unacked("cluster-b") < frames and sender.is_alive()
        proxy.cut()
        switch_log.wait_for("link to cluster-b dropped", timeout=10)
        assert pair.a.wait_connected("cluster-b", 10)
        for i in range(frames):
            got = d.recv("c", timeout=30)
            assert isinstance(got, bytes) and int.from_bytes(got[:4], "big") == i
        sender.join(timeout=10)
        with pytest.raises(TimeoutError):
            d.recv("c", timeout=0.2)
    assert pair.a.peer_connections("cluster-b") >= 2


def test_certificate_rotation_during_a_stream_loses_nothing(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    frames, size = 60, 256 * 1024
    old_serial = _serial(pair.a.config.cert_path)

    def rotate(i: int) -> None:
        nonlocal old_serial
        if i != 20:
            return
        key_path, cert_path, _ = pair.pki.issue("cluster-a", name="cluster-a-renewed")
        pair.a.config.key_path, pair.a.config.cert_path = key_path, cert_path
        pair.a.reload_certificate()
        pair.pki.revoke(old_serial)
        pair.b.refresh_crl()  # B cuts A's connection made with the old certificate

    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        sent: list[str] = []
        sender = threading.Thread(target=_stream, args=(g, frames, size, sent))
        sender.start()
        received = _receive(d, frames, rotate)
        sender.join()
    assert received == sent[0]
    switch_log.wait_for("closing a connection of revoked certificate serial", str(old_serial))
    assert pair.a.peer_connections("cluster-b") >= 2


def _serial(cert_path) -> int:  # type: ignore[no-untyped-def]
    return serial_of(cert_path.read_bytes())


def test_switch_renews_its_own_certificate_when_due(pair) -> None:
    from datetime import UTC, datetime, timedelta

    calls = []

    def renew(csr_pem: bytes) -> bytes:
        calls.append(csr_pem)
        return pair.pki.sign_csr(csr_pem, "cluster-a")

    before = _serial(pair.a.config.cert_path)
    assert not pair.a.renew_if_due(renew)
    assert pair.a.renew_if_due(renew, now=datetime.now(UTC) + timedelta(days=25))
    assert len(calls) == 1 and _serial(pair.a.config.cert_path) != before
    assert pair.a.config.key_path.stat().st_mode & 0o777 == 0o600
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        g.send("c", b"after renewal")
        assert d.recv("c", timeout=10) == b"after renewal"


def test_shaped_link_still_delivers(make_pair) -> None:  # type: ignore[no-untyped-def]
    pair = make_pair(shaper=ShaperConfig(rate_mbit=2000, delay_ms=1))
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        payload = bytes(range(256)) * 4096
        g.send("c", payload)
        assert d.recv("c", timeout=10) == payload


def test_shaper_paces_to_the_rate_and_holds_for_the_delay() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    shaper = Shaper(ShaperConfig(rate_mbit=8, delay_ms=50), clock=lambda: now[0], sleep=sleep)
    chunks = list(shaper.chunks([bytes(1_064_000)]))
    assert sum(len(c) for c in chunks) == 1_064_000
    # 1 MB at 1 MB/s, less the 64 KiB burst the bucket starts with
    assert now[0] == pytest.approx(1.0, rel=0.01)
    now[0] = 10.0
    shaper.hold(enqueued_at=9.98)
    assert now[0] == pytest.approx(10.03)


def _direct_frames(switch, direction: str) -> float:  # type: ignore[no-untyped-def]
    prefix = f'nebula_switch_direct_frames_total{{direction="{direction}"}} '
    text = switch.metrics_text().decode()
    return float(next(ln for ln in text.splitlines() if ln.startswith(prefix)).split()[-1])


def test_small_frames_cross_both_switches_without_a_thread_hand_off(pair) -> None:  # type: ignore[no-untyped-def]
    """A ping-pong of small frames: each thread that has a frame writes it on, the
    sending role's, each switch's reading thread (to the peer, to the role), and the
    receiving role's thread reads it itself."""
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        for i in range(50):
            g.send("ping", i.to_bytes(4, "big"))
            assert d.recv("ping", timeout=10) == i.to_bytes(4, "big")
            d.send("pong", i.to_bytes(4, "big"))
            assert g.recv("pong", timeout=10) == i.to_bytes(4, "big")
        # most go directly; a thread that found the connection in use queued its frame
        assert g.direct_writes() >= 25 and d.direct_writes() >= 25
        # and each role's thread waiting in `recv` read its frame itself
        assert g.direct_reads() >= 25 and d.direct_reads() >= 25
        for switch in (pair.a, pair.b):
            assert _direct_frames(switch, "to_peer") >= 25
            assert _direct_frames(switch, "to_worker") >= 25


def test_a_small_frame_never_overtakes_a_large_one_queued_before_it(pair) -> None:  # type: ignore[no-untyped-def]
    """Large frames go through the writer threads, small ones directly when nothing waits:
    on one channel, mixed, and with another job's stream on the same link, each arrives
    once and in order."""
    sizes = [1 << 20 if i % 3 == 0 else 16 for i in range(60)]

    def stream(link: SwitchLink) -> None:
        for i, size in enumerate(sizes):
            link.send("c", i.to_bytes(4, "big") + bytes(size - 4))

    with (
        pair.link("a", "j1", "G", "D") as g1,
        pair.link("b", "j1", "D", "G") as d1,
        pair.link("a", "j2", "G", "D") as g2,
        pair.link("b", "j2", "D", "G") as d2,
    ):
        senders = [threading.Thread(target=stream, args=(g,)) for g in (g1, g2)]
        for sender in senders:
            sender.start()
        for d in (d1, d2):
            for i, size in enumerate(sizes):
                got = d.recv("c", timeout=30)
                assert isinstance(got, bytes) and len(got) == size
                assert int.from_bytes(got[:4], "big") == i, "out of order or twice"
        for sender in senders:
            sender.join(timeout=30)
        with pytest.raises(TimeoutError):
            d1.recv("c", timeout=0.2)


def test_a_shaped_link_takes_no_frame_past_its_shaper(make_pair) -> None:  # type: ignore[no-untyped-def]
    """Each switch holds what it sends its peer 30 ms: a round trip of small frames takes
    60 ms at least, and no frame to a peer skips the writer thread that keeps the delay."""
    pair = make_pair(shaper=ShaperConfig(delay_ms=30))
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        g.send("ping", b"warm")  # the first waits for the switches to connect
        assert d.recv("ping", timeout=10) == b"warm"
        for i in range(5):
            started = time.monotonic()
            g.send("ping", bytes([i]))
            assert d.recv("ping", timeout=10) == bytes([i])
            d.send("pong", bytes([i]))
            assert g.recv("pong", timeout=10) == bytes([i])
            assert time.monotonic() - started >= 0.060
        for switch in (pair.a, pair.b):
            assert _direct_frames(switch, "to_peer") == 0
        assert _direct_frames(pair.b, "to_worker") > 0  # the shaper is on the peer link only


def test_a_role_that_reads_nothing_holds_its_sender_back_through_the_direct_paths(  # type: ignore[no-untyped-def]
    pair,
) -> None:
    """Small frames to a role that reads none: the direct paths take them while there is
    room, then the bounds hold as before (the far role's channel queue, the sender's
    window): the sender blocks with 8 frames unacknowledged, and nothing is lost."""
    frames = 400
    with pair.link("a", "j", "G", "D", window_frames=8) as g, pair.link("b", "j", "D", "G") as d:
        sender = threading.Thread(
            target=lambda: [g.send("c", i.to_bytes(4, "big")) for i in range(frames)],
            daemon=True,
        )
        sender.start()
        _wait_until_steady(g.unacknowledged, 0.5, 30, "the sender's window to fill")
        assert g.unacknowledged() == 8 and sender.is_alive()
        assert _direct_frames(pair.b, "to_worker") > 0
        for i in range(frames):
            assert d.recv("c", timeout=30) == i.to_bytes(4, "big")
        sender.join(timeout=30)
        with pytest.raises(TimeoutError):
            d.recv("c", timeout=0.2)


def test_two_threads_receiving_on_one_link_each_get_theirs_in_order(pair) -> None:  # type: ignore[no-untyped-def]
    """One thread of the role reads the connection while the other waits on its
    channel: what comes for the other is handed to it, and when the reading thread
    leaves, the link's reader reads for the one still waiting."""
    frames = 100
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        got: dict[str, list[int]] = {"x": [], "y": []}

        def receive(channel: str) -> None:
            for _ in range(frames):
                got[channel].append(int.from_bytes(d.recv(channel, timeout=30), "big"))

        threads = [threading.Thread(target=receive, args=(c,)) for c in got]
        for thread in threads:
            thread.start()
        for i in range(frames):
            g.send("x", i.to_bytes(4, "big"))
            if i % 3 == 0:  # unevenly: one thread waits while the other reads
                time.sleep(0.002)
            g.send("y", i.to_bytes(4, "big"))
        for thread in threads:
            thread.join(timeout=60)
        assert got == {"x": list(range(frames)), "y": list(range(frames))}
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            d.recv("x", timeout=0.2)
        assert time.monotonic() - started < 5


def test_a_role_that_stops_receiving_still_gets_the_receipts_that_free_its_window(  # type: ignore[no-untyped-def]
    pair,
) -> None:
    """G's thread read its connection itself (its reader stood aside); then it only
    sends, with room for 4 frames unacknowledged: the receipts must still be read."""
    with pair.link("a", "j", "G", "D", window_frames=4) as g, pair.link("b", "j", "D", "G") as d:
        for i in range(20):
            g.send("ping", bytes([i]))
            d.send("pong", d.recv("ping", timeout=10))
            assert g.recv("pong", timeout=10) == bytes([i])
        assert g.direct_reads() > 0
        started = time.monotonic()
        sender = threading.Thread(
            target=lambda: [g.send("c", i.to_bytes(4, "big")) for i in range(200)]
        )
        sender.start()  # the window fills at once: only receipts let it go on
        for i in range(200):
            assert d.recv("c", timeout=10) == i.to_bytes(4, "big")
        sender.join(timeout=10)
        assert not sender.is_alive() and time.monotonic() - started < 30


def test_the_reader_reads_large_frames_ahead_while_the_role_works_on_the_last(pair) -> None:  # type: ignore[no-untyped-def]
    """Large frames keep the link's reader: it reads the next while the role works on
    the one before, instead of leaving the role to read each when it asks for it."""
    frames = 20
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        sender = threading.Thread(
            target=lambda: [
                g.send("c", i.to_bytes(4, "big") + bytes(1 << 20)) for i in range(frames)
            ]
        )
        sender.start()
        for i in range(frames):
            got = d.recv("c", timeout=30)
            assert isinstance(got, bytes) and int.from_bytes(got[:4], "big") == i
            time.sleep(0.005)  # the role's work on it, shorter than the reader stands aside
        sender.join(timeout=30)
        assert d.direct_reads() <= frames // 2


def test_a_window_smaller_than_an_acknowledgement_s_share_still_moves(make_pair) -> None:  # type: ignore[no-untyped-def]
    """Small frames' acknowledgements are held for a few frames (rules.AckSchedule); a
    sender whose window holds fewer than that gets them when the hold runs out, and the
    last frames are acknowledged even though no more come."""
    # pings (which are answered with the count) far apart: only the hold frees the window
    pair = make_pair(resend_frames=2, ping_interval_s=60.0, io_timeout_s=120.0)
    with pair.link("a", "j", "G", "D") as g, pair.link("b", "j", "D", "G") as d:
        for i in range(3 * ACK_EVERY):
            g.send("c", i.to_bytes(4, "big"))
        for i in range(3 * ACK_EVERY):
            assert d.recv("c", timeout=10) == i.to_bytes(4, "big")
        deadline = time.monotonic() + 10
        while pair.a.unacked_frames("cluster-b") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pair.a.unacked_frames("cluster-b") == 0
