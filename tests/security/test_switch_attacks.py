"""Hostile bytes at a switch: strangers, greedy connections, token holders, ended attempts."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.jobtoken import JobClaims
from support.switches import Pair
from workers.switch import protocol as p
from workers.switch.client import SwitchLink
from workers.switch.rules import admit_worker
from workers.switch.stream import FrameStream
from workers.switch.tls import client_context

MIB = 1024 * 1024


def rss_mib() -> float:
    """This process's resident memory (the switches run in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def huge_frame_header(body_bytes: int = 64 * MIB) -> bytes:
    """73 bytes: a DATA header announcing a 64 MiB body, and its meta."""
    meta = json.dumps({"job": "j", "ch": "c", "seq": 0, "src": "G", "dst": "D"}).encode()
    return p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.DATA, len(meta), body_bytes) + meta


def tls_to(address: tuple[str, int], ca_path: Path, cluster: str = "cluster-a") -> ssl.SSLSocket:
    raw = socket.create_connection(address, timeout=10)
    return client_context(ca_path=ca_path).wrap_socket(raw, server_hostname=cluster)


def closed_by_peer(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the other end closes `sock` within `timeout` (reading past any error frame)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    return True


def still_serves(pair: Pair, job: str = "ok") -> None:
    with pair.link("a", job, "G", "D") as g, pair.link("b", job, "D", "G") as d:
        g.send("c", b"still here")
        assert d.recv("c", timeout=10) == b"still here"


# -- before authentication


def test_only_a_small_hello_is_read_before_authentication() -> None:
    """Refused on the header alone, before the meta or a body is buffered."""
    server = p.Connection(p.Side.SERVER)
    server.receive_data(huge_frame_header()[: p.HEADER.size])
    with pytest.raises(p.ProtocolError, match="DATA frame before the handshake"):
        server.next_event()
    big_hello = p.Connection(p.Side.SERVER)
    big_hello.receive_data(p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.HELLO, 13 * 1024, 0))
    with pytest.raises(p.ProtocolError, match="meta of 13312 bytes exceeds 12288"):
        big_hello.next_event()
    client = p.Connection(p.Side.CLIENT)  # a hostile switch gets the same from a worker
    client.receive_data(huge_frame_header()[: p.HEADER.size])
    with pytest.raises(p.ProtocolError, match="before the handshake"):
        client.next_event()


def test_eight_strangers_announcing_huge_frames_cost_no_memory(pair: Pair) -> None:
    """The review's attack: 8 TLS connections of 73 bytes each grew a switch by 516 MiB."""
    before = rss_mib()
    attackers = [tls_to(pair.a.worker_address, pair.pki.ca_path) for _ in range(8)]
    for sock in attackers:
        sock.sendall(huge_frame_header())
    assert all(closed_by_peer(sock) for sock in attackers)
    grown = rss_mib() - before
    for sock in attackers:
        sock.close()
    assert grown < 32, f"the switch grew by {grown:.0f} MiB"
    still_serves(pair)


def test_idle_strangers_are_closed_within_seconds(make_pair) -> None:  # type: ignore[no-untyped-def]
    strict_pair = make_pair(auth_timeout_s=0.5)
    started = time.monotonic()
    silent_tcp = socket.create_connection(strict_pair.a.worker_address, timeout=10)
    silent_tls = tls_to(strict_pair.a.worker_address, strict_pair.pki.ca_path)
    # the header of a hello, and then nothing: the deadline covers the whole hello
    silent_tls.sendall(p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.HELLO, 200, 0))
    silent_peer = socket.create_connection(strict_pair.a.peer_address, timeout=10)
    for sock in (silent_tcp, silent_tls, silent_peer):
        assert closed_by_peer(sock, timeout=5)
        sock.close()
    assert time.monotonic() - started < 5
    still_serves(strict_pair)  # authenticated links outlive the deadline


def test_connections_are_capped_per_source_and_in_all(make_pair) -> None:  # type: ignore[no-untyped-def]
    strict_pair = make_pair(max_connections_per_source=3, max_connections=8, auth_timeout_s=60)
    switch = strict_pair.a
    held: list[socket.socket] = []
    try:
        # a holds one peer connection from b; per source 3, in all 8
        for _ in range(3):
            held.append(
                socket.create_connection(switch.worker_address, source_address=("127.0.0.2", 0))
            )
        fourth = socket.create_connection(switch.worker_address, source_address=("127.0.0.2", 0))
        assert closed_by_peer(fourth, timeout=5)
        for source in ("127.0.0.3", "127.0.0.4"):
            for _ in range(2):
                held.append(
                    socket.create_connection(switch.worker_address, source_address=(source, 0))
                )
        over = socket.create_connection(switch.worker_address, source_address=("127.0.0.5", 0))
        assert closed_by_peer(over, timeout=5)  # 1 + 3 + 2 + 2 = 8 open already
        assert not closed_by_peer(held[0], timeout=0.1)  # those within the caps stay open
    finally:
        for sock in held:
            sock.close()
    assert switch.wait_connections(at_most=1, timeout=10)
    still_serves(strict_pair)


# -- token holders


def hello_to(pair: Pair, job: str, role: str, direction: p.Direction) -> FrameStream:
    """A raw worker connection to switch b that says its hello; the answer is left unread."""
    stream = FrameStream(
        tls_to(pair.b.worker_address, pair.pki.ca_path, "cluster-b"), p.Connection(p.Side.CLIENT)
    )
    stream.write(p.Hello(pair.pki.token(job, role, "cluster-b"), job, role, "G", direction))
    return stream


def test_a_second_hello_cannot_take_over_a_live_role(pair: Pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    with pair.link("a", "j1", "G", "D") as g, pair.link("b", "j1", "D", "G") as d:
        thief = hello_to(pair, "j1", "D", p.Direction.RECV)
        answer = thief.read_event()
        assert isinstance(answer, p.Error) and "already connected" in answer.reason
        thief.close()
        g.send("c", b"for the first")
        assert d.recv("c", timeout=10) == b"for the first"  # the stream stayed where it was


def test_a_role_reconnects_only_once_its_first_connection_is_gone(pair: Pair) -> None:
    sender = hello_to(pair, "j2", "D", p.Direction.SEND)
    assert sender.read_event() == p.Welcome()
    first = hello_to(pair, "j2", "D", p.Direction.RECV)
    assert first.read_event() == p.Welcome()
    open_now = 1 + 2  # the peer connection from a, and these two
    second = hello_to(pair, "j2", "D", p.Direction.RECV)
    assert isinstance(second.read_event(), p.Error)
    second.close()
    first.close()
    assert pair.b.wait_connections(at_most=open_now - 1, timeout=10)
    again = hello_to(pair, "j2", "D", p.Direction.RECV)
    assert again.read_event() == p.Welcome()
    with pair.link("a", "j2", "G", "D") as g:
        g.send("c", b"to the new connection")
        frame = again.read_event()
        assert isinstance(frame, p.Data) and bytes(frame.body) == b"to the new connection"
    sender.write(p.Error("done"))  # the role's goodbye: it will not resume
    for stream in (again, sender):
        stream.close()
    assert pair.b.wait_role_ended("j2", "D", timeout=10)
    ended = hello_to(pair, "j2", "D", p.Direction.RECV)  # the attempt is over: a new one, a new id
    answer = ended.read_event()
    assert isinstance(answer, p.Error) and "has ended here" in answer.reason
    ended.close()


def test_admission_is_a_pure_decision() -> None:
    claims = JobClaims(job_id="j.1", role="G", cluster="a", expires_at=0)
    hello = p.Hello("t", "j.1", "G", "D", p.Direction.RECV)
    assert admit_worker(hello, claims, "a", (), ended=False) is None
    assert admit_worker(hello, claims, "a", (p.Direction.SEND,), ended=False) is None
    refusal = admit_worker(hello, claims, "a", (p.Direction.RECV,), ended=False)
    assert "already connected" in str(refusal)
    assert "has ended here" in str(admit_worker(hello, claims, "a", (), ended=True))
    assert "for cluster 'a'" in str(admit_worker(hello, claims, "b", (), ended=False))
    other = p.Hello("t", "j.2", "G", "D", p.Direction.RECV)
    assert "another job" in str(admit_worker(other, claims, "a", (), ended=False))


# -- attempts end


@contextlib.contextmanager
def attempt(pair: Pair, job: str) -> Iterator[tuple[SwitchLink, SwitchLink]]:
    with pair.link("a", job, "G", "D") as g, pair.link("b", job, "D", "G") as d:
        yield g, d
    assert pair.a.wait_role_ended(job, "G", timeout=10)
    assert pair.b.wait_role_ended(job, "D", timeout=10)


def test_more_attempts_than_mailboxes_each_deliver(make_pair) -> None:  # type: ignore[no-untyped-def]
    pair = make_pair(max_mailboxes=2)
    for n in range(6):
        with attempt(pair, f"job.{n}") as (g, d):
            g.send("c", f"attempt {n}".encode())
            assert d.recv("c", timeout=10) == f"attempt {n}".encode()
            d.send("back", b"ok")
            assert g.recv("back", timeout=10) == b"ok"
    for switch in (pair.a, pair.b):
        assert switch.held_state() == {
            "mailboxes": 0,
            "roles": 0,
            "detached_roles": 0,
            "job_queues": 0,
        }


def test_late_frames_of_an_ended_attempt_are_dropped(pair: Pair, switch_log) -> None:  # type: ignore[no-untyped-def]
    with pair.link("a", "j.late", "G", "D") as g:
        with pair.link("b", "j.late", "D", "G") as d:
            g.send("c", b"in time")
            assert d.recv("c", timeout=10) == b"in time"
        assert pair.b.wait_role_ended("j.late", "D", timeout=10)
        g.send("c", b"too late")
        switch_log.wait_for("dropped a late frame of job j.late for D")
    assert pair.b.held_state()["mailboxes"] == 0
    still_serves(pair)


# -- mailboxes for roles that never connect (finding 27.5)


def ghost_frames(pair: Pair, jobs: list[str]) -> None:
    """Generators on a, all connected at once, send a frame each to a discriminator that
    never connects on b, and leave."""
    ghosts = [pair.link("a", job, "G", "D") for job in jobs]
    for g in ghosts:
        g.send("c", b"for nobody")
    for g in ghosts:
        g.close(timeout=0.5)  # a ghost waits for no answer
    for job in jobs:
        assert pair.a.wait_role_ended(job, "G", timeout=10)


def test_finding_27_5_unplaced_mailboxes_expire_and_a_real_job_still_starts(  # type: ignore[no-untyped-def]
    make_pair, switch_log
) -> None:
    pair = make_pair(max_mailboxes=3, unclaimed_mailboxes_per_peer=2, unclaimed_mailbox_s=10.0)
    ghost_frames(pair, ["j.ghost.0", "j.ghost.1", "j.ghost.2"])
    # the peer's share is two mailboxes for roles no token placed here: the third is refused
    switch_log.wait_for("dropped a frame of job j.ghost.", "2 unclaimed mailboxes of cluster-a")
    assert pair.b.held_state()["mailboxes"] == 2, switch_log.lines
    # with the ghosts' mailboxes still held, a real job starts and runs both ways
    with attempt(pair, "j.real") as (g, d):
        g.send("c", b"real")
        assert d.recv("c", timeout=10) == b"real"
        d.send("back", b"ok")
        assert g.recv("back", timeout=10) == b"ok"
    # never claimed, the ghosts' mailboxes are given up
    deadline = time.monotonic() + 30
    while pair.b.held_state()["mailboxes"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pair.b.held_state()["mailboxes"] == 0
    gave_up = [ln for ln in switch_log.lines if "gave up the mailbox of job j.ghost." in ln]
    assert len(gave_up) == 2
    still_serves(pair, "j.after")


def test_a_role_with_a_token_takes_the_place_of_unclaimed_mailboxes(  # type: ignore[no-untyped-def]
    make_pair, switch_log
) -> None:
    pair = make_pair(max_mailboxes=2, unclaimed_mailboxes_per_peer=8, unclaimed_mailbox_s=600)
    ghost_frames(pair, ["j.ghost.0", "j.ghost.1"])
    deadline = time.monotonic() + 10
    while pair.b.held_state()["mailboxes"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pair.b.held_state()["mailboxes"] == 2  # full, all of it on probation
    still_serves(pair, "j.real")
    switch_log.wait_for("the unclaimed mailbox of j.ghost.", "made way for a role")


def test_a_frame_that_comes_before_its_role_waits_for_it(pair: Pair) -> None:
    with pair.link("a", "j.early", "G", "D") as g:
        g.send("c", b"early")
        deadline = time.monotonic() + 10
        while pair.b.held_state()["mailboxes"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pair.b.held_state()["mailboxes"] == 1
        with pair.link("b", "j.early", "D", "G") as d:
            assert d.recv("c", timeout=10) == b"early"
