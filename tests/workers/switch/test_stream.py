"""FrameStream over real TLS on loopback: a connection cut while frames are queued."""

from __future__ import annotations

import socket
import threading

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
