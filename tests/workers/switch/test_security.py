"""Every door of a switch refuses what it must, logs why, and keeps serving."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract.jobtoken import sign_job_token
from workers.switch import protocol as p
from workers.switch.client import LinkRefused, SwitchLink
from workers.switch.server import Switch
from workers.switch.stream import FrameStream
from workers.switch.tls import client_context


def still_serves(pair) -> None:  # type: ignore[no-untyped-def]
    with pair.link("a", "ok", "G", "D") as g, pair.link("b", "ok", "D", "G") as d:
        g.send("c", b"still here")
        assert d.recv("c", timeout=10) == b"still here"


def dial_peer(
    address: tuple[str, int],
    ca_path: Path,
    key_cert: tuple[Path, Path] | None,
    claim: str,
    context: ssl.SSLContext | None = None,
) -> p.Event:
    """Connect to a peer port as a switch would; returns the answer to the peer hello."""
    if context is None:
        context = client_context(
            ca_path=ca_path,
            key_path=key_cert[0] if key_cert else None,
            cert_path=key_cert[1] if key_cert else None,
        )
    raw = socket.create_connection(address, timeout=10)
    sock = context.wrap_socket(raw)
    stream = FrameStream(sock, p.Connection(p.Side.CLIENT))
    stream.write(p.PeerHello(claim, "test"))
    try:
        return stream.read_event()
    finally:
        stream.close()


def refused_at_tls(pair, key_cert, claim: str = "cluster-a") -> None:  # type: ignore[no-untyped-def]
    """The TLS handshake to B's peer port fails (the client may see it only on reading)."""
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        event = dial_peer(pair.b.peer_address, pair.pki.ca_path, key_cert, claim)
        assert event is p.CLOSED  # the alert may arrive as a plain close


@pytest.mark.parametrize("door", ["peer", "worker"])
def test_plaintext_is_refused(pair, switch_log, door: str) -> None:  # type: ignore[no-untyped-def]
    address = pair.b.peer_address if door == "peer" else pair.b.worker_address
    with socket.create_connection(address, timeout=10) as raw:
        for buf in p.encode(p.PeerHello("cluster-a")):
            raw.sendall(buf)
        with contextlib.suppress(OSError):
            assert b"Welcome" not in raw.recv(100)
    switch_log.wait_for(f"refused {door} from", "TLS handshake failed")
    still_serves(pair)


def test_certificate_of_another_ca_is_refused(pair, other_pki, switch_log) -> None:  # type: ignore[no-untyped-def]
    key, cert, _ = other_pki.issue("cluster-a")
    refused_at_tls(pair, (key, cert))
    switch_log.wait_for("refused peer from", "certificate verify failed")
    still_serves(pair)


def test_a_peer_without_a_certificate_is_refused(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    refused_at_tls(pair, None)
    switch_log.wait_for("refused peer from", "TLS handshake failed")


def test_expired_certificate_is_refused(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    long_ago = datetime.now(UTC) - timedelta(days=60)
    key, cert, _ = pair.pki.issue("cluster-a", name="expired", now=long_ago, days=30)
    refused_at_tls(pair, (key, cert))
    switch_log.wait_for("refused peer from", "certificate has expired")
    still_serves(pair)


def test_revoked_certificate_is_refused_and_cut(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    key, cert, serial = pair.pki.issue("cluster-a", name="to-revoke")
    # accepted while valid, and held open
    context = client_context(ca_path=pair.pki.ca_path, key_path=key, cert_path=cert)
    raw = socket.create_connection(pair.b.peer_address, timeout=10)
    live = FrameStream(context.wrap_socket(raw), p.Connection(p.Side.CLIENT))
    live.write(p.PeerHello("cluster-a", "live"))
    assert live.read_event() == p.Welcome()
    pair.pki.revoke(serial)
    pair.b.refresh_crl()
    switch_log.wait_for("closing a connection of revoked certificate serial", str(serial))
    with pytest.raises((ssl.SSLError, OSError)):
        assert live.read_event() is p.CLOSED
        raise OSError("closed")
    live.close()
    answer = dial_peer(pair.b.peer_address, pair.pki.ca_path, (key, cert), "cluster-a")
    assert isinstance(answer, p.Error) and "revoked" in answer.reason
    switch_log.wait_for("refused peer from", f"serial {serial} is revoked")
    still_serves(pair)


def test_revocation_applies_at_once_on_restart(pki, make_pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    pair = make_pair()
    key, cert, serial = pki.issue("cluster-a", name="revoked-before-start")
    pki.revoke(serial)
    pair.b.stop()
    restarted = Switch(pair.b.config).start()  # the CRL is read before the doors open
    try:
        answer = dial_peer(restarted.peer_address, pki.ca_path, (key, cert), "cluster-a")
        assert isinstance(answer, p.Error) and "revoked" in answer.reason
    finally:
        restarted.stop()


def test_valid_certificate_with_the_wrong_cluster_name_is_refused(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    key, cert, _ = pair.pki.issue("cluster-c")
    answer = dial_peer(pair.b.peer_address, pair.pki.ca_path, (key, cert), "cluster-a")
    assert isinstance(answer, p.Error)
    switch_log.wait_for("refused peer from", "expected cluster 'cluster-a'")
    answer = dial_peer(pair.b.peer_address, pair.pki.ca_path, (key, cert), "cluster-c")
    assert isinstance(answer, p.Error)
    switch_log.wait_for("refused peer from", "unknown cluster 'cluster-c'")
    still_serves(pair)


def test_dialling_switch_refuses_a_peer_with_the_wrong_name(
    configure, make_pair, switch_log
) -> None:  # type: ignore[no-untyped-def]
    impostor = Switch(configure("cluster-c", peers={"cluster-a": ("127.0.0.1", 9)}))
    impostor.start()
    try:
        pair = make_pair(a_peer_address=lambda b: impostor.peer_address)
        switch_log.wait_for("cannot reach peer cluster-b", "expected cluster 'cluster-b'")
        assert not pair.a.wait_connected("cluster-b", timeout=0)
    finally:
        impostor.stop()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
@pytest.mark.parametrize("door", ["peer", "worker"])
def test_tls_1_1_is_refused(pair, door: str) -> None:  # type: ignore[no-untyped-def]
    key, cert, _ = pair.pki.issue("cluster-a", name="old-tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(pair.pki.ca_path)
    context.load_cert_chain(cert, key)
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    address = pair.b.peer_address if door == "peer" else pair.b.worker_address
    with pytest.raises(ssl.SSLError):
        dial_peer(address, pair.pki.ca_path, None, "cluster-a", context=context)
    still_serves(pair)


def test_tls_is_1_3_with_an_aead_suite(pair) -> None:  # type: ignore[no-untyped-def]
    context = client_context(ca_path=pair.pki.ca_path)
    with context.wrap_socket(socket.create_connection(pair.b.worker_address)) as sock:
        name, version, _ = sock.cipher()  # type: ignore[misc]
        assert version == "TLSv1.3" and ("GCM" in name or "CHACHA20" in name)
    tls12 = client_context(ca_path=pair.pki.ca_path)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with tls12.wrap_socket(socket.create_connection(pair.b.worker_address)) as sock:
        name, version, _ = sock.cipher()  # type: ignore[misc]
        assert version == "TLSv1.2" and name.startswith("ECDHE") and "GCM" in name


def _link(pair, token: str, job: str = "j1", role: str = "G") -> SwitchLink:  # type: ignore[no-untyped-def]
    return SwitchLink(
        pair.a.worker_address,
        ca_path=pair.pki.ca_path,
        token=token,
        job_id=job,
        role=role,
        peer_role="D",
        cluster="cluster-a",
    )


def test_bad_job_tokens_are_refused(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    good = pair.pki.token("j1", "G", "cluster-a")
    _body, sig = good.split(".")
    other = pair.pki.token("j2", "G", "cluster-a")
    foreign = sign_job_token(
        Ed25519PrivateKey.generate(),
        job_id="j1",
        role="G",
        cluster="cluster-a",
        expires_at=time.time() + 60,
    )
    cases = {
        "tampered": (other.split(".")[0] + "." + sig, "bad signature"),
        "expired": (pair.pki.token("j1", "G", "cluster-a", ttl=-1), "token expired"),
        "foreign": (foreign, "bad signature"),
        "other cluster": (pair.pki.token("j1", "G", "cluster-b"), "for cluster 'cluster-b'"),
        "junk": ("not a token", "malformed"),
    }
    for token, reason in cases.values():
        with pytest.raises(LinkRefused, match=reason):
            _link(pair, token)
        switch_log.wait_for("refused worker from", reason)
    with pytest.raises(LinkRefused, match="another job or role"):
        _link(pair, good, job="j2")
    with pytest.raises(LinkRefused, match="another job or role"):
        _link(pair, good, role="D")
    still_serves(pair)


def test_a_worker_cannot_send_on_another_jobs_channel(pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    context = client_context(ca_path=pair.pki.ca_path)
    # (the job a token is for, the job and source role its frame claims); an attempt that
    # has ended on a switch cannot come back, so each try is an attempt of its own
    for mine, job, src in (("j1", "j2", "G"), ("j3", "j3", "D")):
        token = pair.pki.token(mine, "G", "cluster-a")
        raw = socket.create_connection(pair.a.worker_address, timeout=10)
        stream = FrameStream(context.wrap_socket(raw), p.Connection(p.Side.CLIENT))
        stream.write(p.Hello(token, mine, "G", "D", p.Direction.SEND))
        assert stream.read_event() == p.Welcome()
        stream.write(p.Data(job, "x", 0, src, "D", body=b"sneaky"))
        answer = stream.read_event()
        assert isinstance(answer, p.Error) and "outside its token's job" in answer.reason
        stream.close()
        switch_log.wait_for("refused worker frame from", f"frame for job '{job}'")
    with pair.link("b", "j2", "D", "G") as d2, pytest.raises(TimeoutError):
        d2.recv("x", timeout=0.2)  # nothing leaked into job 2
    still_serves(pair)


def test_metrics_are_served_over_http(configure) -> None:  # type: ignore[no-untyped-def]
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    switch = Switch(configure("cluster-m", metrics_address=("127.0.0.1", port))).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert b"# TYPE nebula_switch_bytes_total counter" in answer.read()
    finally:
        switch.stop()
