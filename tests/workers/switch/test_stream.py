"""FrameStream over real TLS on loopback: a connection cut while frames are queued."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from support.certs import Pki
from workers.switch.protocol import Connection, Data, PeerHello, ProtocolError, Side, Welcome
from workers.switch.stream import FrameStream, cut
from workers.switch.tls import client_context, server_context


def _tls_pair(pki: Pki) -> tuple[FrameStream, FrameStream]:
    key_path, cert_path, _ = pki.issue("cluster-a")
    server_ctx = server_context(cert_path=cert_path, key_path=key_path, ca_path=None)
    client_ctx = client_context(ca_path=pki.ca_path)
    raw_a, raw_b = socket.socketpair()
    raw_a.settimeout(10)
    raw_b.settimeout(10)
    wrapped = {}
    server = threading.Thread(
        target=lambda: wrapped.update(s=server_ctx.wrap_socket(raw_b, server_side=True))
    )
    server.start()
    client_sock = client_ctx.wrap_socket(raw_a, server_hostname="cluster-a")
    server.join(timeout=10)
    writer = FrameStream(client_sock, Connection(Side.CLIENT))
    reader = FrameStream(wrapped["s"], Connection(Side.SERVER))
    writer.write(PeerHello("cluster-b"))
    assert isinstance(reader.read_event(), PeerHello)
    reader.write(Welcome())
    assert isinstance(writer.read_event(), Welcome)
    return writer, reader


def test_a_cut_connection_yields_no_bytes_that_bypass_tls(pki: Pki) -> None:
    # A connection cut (as a revocation cuts one, from another thread) while frames are
    # queued in the kernel must end as TLS ends it: the queued records decoded, then the
    # end of the stream. It must never hand the reader the records' ciphertext.
    writer, reader = _tls_pair(pki)
    body = bytes(range(256)) * 96  # 24 KiB: two TLS records, within the socket buffers
    sent = [Data("j", "c", seq, "G", "D", body, None) for seq in range(2)]
    got: list[Data] = []
    try:
        for frame in sent:
            writer.write(frame)
        cut(reader.sock)
        try:
            while isinstance(event := reader.read_event(), Data):
                got.append(event)
        except (OSError, ProtocolError) as exc:  # the end of the stream, as TLS saw it
            assert "magic" not in str(exc) and "version" not in str(exc)
        assert len(got) <= len(sent)
        for frame, taken in zip(sent, got, strict=False):
            assert (taken.seq, bytes(taken.body)) == (frame.seq, body)
    finally:
        writer.close()
        reader.close()


def _read_in_thread(
    reader: FrameStream, idle: Callable[[], float | None]
) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(reader.read_event(idle=idle))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, outcome


def test_a_body_that_flows_calls_idle_once_not_per_record(pki: Pki) -> None:
    # The readiness and stall checks are the frame's, not each 16 KiB TLS record's.
    writer, reader = _tls_pair(pki)
    body = bytes(range(256)) * 4096  # 1 MiB: 64 TLS records
    calls: list[float] = []

    def idle() -> float:
        calls.append(time.monotonic())
        return 30.0

    try:
        thread, outcome = _read_in_thread(reader, idle)
        writer.write(Data("j", "c", 0, "G", "D", body, None))
        thread.join(timeout=30)
        (frame,) = outcome
        assert isinstance(frame, Data) and bytes(frame.body) == body
        assert 1 <= len(calls) <= 2  # before the body (and before its header, if it waited)
        assert reader.sock.gettimeout() == 10  # the socket's own timeout is back
    finally:
        writer.close()
        reader.close()


def test_a_body_that_stalls_midway_gets_its_idle_calls(pki: Pki) -> None:
    # A sender that stops in the middle of a body: the reader's timed work (pings,
    # acknowledgements due, the stall check) still runs every wait it asks for.
    writer, reader = _tls_pair(pki)
    body = bytes(range(256)) * 256  # 64 KiB
    head, data = writer.conn.send(Data("j", "c", 0, "G", "D", body, None))
    waited = threading.Event()
    calls: list[float] = []

    def idle() -> float:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            waited.set()
        return 0.01

    try:
        thread, outcome = _read_in_thread(reader, idle)
        writer.sock.sendall(bytes(head) + bytes(memoryview(data)[:40000]))
        assert waited.wait(timeout=30)
        assert not outcome  # still waiting for the rest of the body
        writer.sock.sendall(memoryview(data)[40000:])
        thread.join(timeout=30)
        (frame,) = outcome
        assert isinstance(frame, Data) and bytes(frame.body) == body
        assert reader.sock.gettimeout() == 10
    finally:
        writer.close()
        reader.close()


def test_a_stall_in_the_middle_of_a_body_ends_the_read(pki: Pki) -> None:
    # idle's stall check raising mid-body ends the read with its error, and the socket
    # keeps its own timeout for whoever writes on it next.
    writer, reader = _tls_pair(pki)
    body = bytes(64 * 1024)
    head, data = writer.conn.send(Data("j", "c", 0, "G", "D", body, None))
    calls: list[float] = []

    def idle() -> float:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            raise TimeoutError("the peer sent nothing for 5 s")
        return 0.01

    try:
        thread, outcome = _read_in_thread(reader, idle)
        writer.sock.sendall(bytes(head) + bytes(memoryview(data)[:20000]))
        thread.join(timeout=30)
        (error,) = outcome
        assert isinstance(error, TimeoutError) and "sent nothing" in str(error)
        assert reader.sock.gettimeout() == 10
    finally:
        writer.close()
        reader.close()


def test_a_write_that_cannot_finish_now_leaves_its_rest_for_the_next_write(pki: Pki) -> None:
    # The reader takes nothing: the socket fills and `write_now` returns, without waiting,
    # what it could not send; written next (by another thread, as an outlet's writer
    # does), the rest completes the stream: every frame arrives whole and in order.
    writer, reader = _tls_pair(pki)
    body = bytes(range(256)) * 64  # 16 KiB
    sent: list[Data] = []
    rest = None
    try:
        started = time.monotonic()
        while rest is None:
            assert len(sent) < 10_000, "the socket never filled"
            sent.append(Data("j", "c", len(sent), "G", "D", body, None))
            rest = writer.write_now([sent[-1]])
        assert time.monotonic() - started < 5
        assert writer.sock.gettimeout() == 10  # the socket's own timeout is back
        got: list[Data] = []

        def read() -> None:
            while len(got) < len(sent):
                event = reader.read_event()
                assert isinstance(event, Data)
                got.append(event)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        finisher = threading.Thread(target=writer.write_rest, args=(rest,))
        finisher.start()
        finisher.join(timeout=30)
        thread.join(timeout=30)
        assert [f.seq for f in got] == [f.seq for f in sent]
        assert all(bytes(f.body) == body for f in got)
    finally:
        writer.close()
        reader.close()
