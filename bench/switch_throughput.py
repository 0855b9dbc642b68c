"""Switch throughput and small-frame round trips on loopback, against raw TLS and gRPC.

1 GiB (``--mib``) of float32 tensors in 4 MiB frames, each path measured in a process
of its own, ``--rounds`` (>= 3) interleaved rounds, median and spread of each:

(a) one raw Python TLS socket, one hop, the ceiling for pure Python;
(b) worker -> switch A -> switch B -> worker, with every check switched on; each
    switch in its own process as deployed (CPU time counts both switches);
(c) a pass-through relay of the same three TLS hops made of plain gRPC streams,
    the way Flower and NVFlare move messages, each relay in its own process as each
    switch is (CPU time counts both relays).

(d) the round trip of a 16-byte frame, worker -> switch A -> switch B -> worker and
    back (p50, p99), beside a 3-hop gRPC relay's streaming ping-pong and three raw TLS
    hops' in the same rounds. Their two relays run in processes of their own, as the
    switches do, and the two ends in the bench's process, as the two roles do: like
    with like. A message that crosses processes waits on the kernel to wake each next
    one: on this machine three raw hops' round trip took 285 us (206-344) across
    processes against 193 us among the threads of one (bench/results/switch_throughput.json
    as committed in effd8c7 and in 878af4a). Each round trip's CPU is split between the
    ends (the bench's process) and each of the four crossings of the two in the middle
    (switches or relays).

``--against REV`` adds the switch of another commit (a temporary git worktree of REV,
run with its own ``workers`` package) to every round, (b) and (d) both, so that a
change to the hot path is measured against its parent in the same interleaving; it may
be given more than once (the parent and an older reference, say). The load average is
stored with each round: on a shared machine a difference within the spread is no result.
``--profile DIR`` writes a cProfile of each switch process (all its threads) per path.
The switch paths also count the page faults and voluntary context switches of the
workers' process and both switches (per GiB, per frame, per round trip): counts, unlike
times, that the load of a shared machine does not inflate.

Prints a table, writes bench/results/switch_throughput.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import multiprocessing
import os
import platform
import pstats
import queue
import resource
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
import torch
from rich.console import Console
from rich.table import Table


def _argv_value(flag: str, default: str | None = None) -> str | None:
    """A flag's value from argv, read before the project is imported (--code-root picks
    which checkout's packages this process imports; spawned switches inherit it)."""
    if flag in sys.argv:
        return sys.argv[sys.argv.index(flag) + 1]
    return default


CODE_ROOT = Path(_argv_value("--code-root") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(CODE_ROOT))

from app.pki import ca  # noqa: E402
from workers.switch import server as switch_server  # noqa: E402
from workers.switch.client import SwitchLink  # noqa: E402
from workers.switch.server import Switch, SwitchConfig, crl_from_file  # noqa: E402
from workers.switch.tls import client_context, server_context  # noqa: E402

# what the switch agent does once its switch has started (a checkout from before it has
# none: nothing)
settle_process: Callable[[], None] = getattr(switch_server, "settle_process", lambda: None)

TOTAL = int(_argv_value("--mib", "1024") or 1024) << 20
FRAME = 4 << 20
FRAMES = TOTAL // FRAME
RESULTS = Path(__file__).parent / "results" / "switch_throughput.json"
Address = tuple[str, int]
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", FRAME + 1024),
    ("grpc.max_send_message_length", FRAME + 1024),
    ("grpc.ssl_target_name_override", "cluster-b"),
]


class Pki:
    """Throwaway CA with certificates for two clusters, in a temporary folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca_key, self.ca_cert = ca.create_root_ca("Bench CA")
        self.ca_path = root / "ca.pem"
        self.ca_path.write_bytes(ca.certificate_pem(self.ca_cert))
        self.crl_path = root / "crl.pem"
        next_update = datetime.now(UTC) + timedelta(days=1)
        self.crl_path.write_bytes(
            ca.build_crl(self.ca_key, self.ca_cert, [], next_update=next_update)
        )
        self.token_key = ca.make_job_token_key()
        self.files = {name: self._issue(name) for name in ("cluster-a", "cluster-b")}

    def _issue(self, cluster: str) -> tuple[Path, Path]:
        key_pem, csr = ca.make_switch_key_and_csr(cluster)
        key_path, cert_path = self.root / f"{cluster}.key", self.root / f"{cluster}.crt"
        key_path.write_bytes(key_pem)
        cert_path.write_bytes(ca.sign_csr(self.ca_key, self.ca_cert, csr, cluster_name=cluster))
        return key_path, cert_path


def measure(run: Callable[[Callable[[], None]], tuple[float, ...] | None]) -> dict:
    """Wall and CPU seconds of one run (and, where it counts them, page faults per GiB and
    voluntary context switches per frame); `run` calls its argument once per frame."""
    wall, cpu = time.perf_counter(), time.process_time()
    own = run(lambda: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    counts: dict = {}
    if own is not None:  # the run timed itself (it had processes to start first)
        wall, cpu, faults, switches = own
        counts = {
            "faults_per_gib": faults * (1 << 30) / TOTAL,
            "cswitch_per_frame": switches / FRAMES,
        }
    gib = (1 << 30) / TOTAL
    return {"mb_s": TOTAL / wall / 1e6, "wall_s": wall, "cpu_s_per_gib": cpu * gib} | counts


def payloads() -> Iterator[torch.Tensor]:
    """FRAMES float32 tensors of 4 MiB; one buffer reused, as a training loop would."""
    tensor = torch.randn(FRAME // 4)
    for i in range(FRAMES):
        tensor[0] = i
        yield tensor


def raw_tls(pki: Pki, on_frame: Callable[[], None]) -> None:
    """(a) one TLS socket, sender and receiver threads, the switch's own TLS settings."""
    key, cert = pki.files["cluster-b"]
    server_ctx = server_context(cert_path=cert, key_path=key, ca_path=None)
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()

    def receive() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as sock:
            buf = memoryview(bytearray(FRAME))
            for _ in range(FRAMES):
                got = 0
                while got < FRAME:
                    got += sock.recv_into(buf[got:])
                on_frame()

    receiver = threading.Thread(target=receive)
    receiver.start()
    with client_context(ca_path=pki.ca_path).wrap_socket(
        socket.create_connection(address), server_hostname="cluster-b"
    ) as sock:
        for tensor in payloads():
            sock.sendall(tensor.numpy().data.cast("B"))
        receiver.join()
    listener.close()


def _profile_threads() -> list[cProfile.Profile]:
    """Profile every thread started from now on in this process (cProfile sees only the
    thread that enables it); returns the list each thread adds its profile to as it ends."""
    profiles: list[cProfile.Profile] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()
            profiles.append(profile)

    threading.Thread.run = profiled  # type: ignore[method-assign]
    return profiles


def usage() -> tuple[float, int, int]:
    """This process's CPU seconds, minor page faults and voluntary context switches (a
    thread that blocked: each hand-off between threads is one), all threads together.
    The counts, unlike times, do not grow with the load of a shared machine."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), own.ru_minflt, own.ru_nvcsw


def usage_since(mark: tuple[float, int, int]) -> tuple[float, int, int]:
    now = usage()
    return now[0] - mark[0], now[1] - mark[1], now[2] - mark[2]


def run_switch(config: SwitchConfig, pipe: Connection, profile_to: str | None = None) -> None:
    """A switch in its own process, as deployed: addresses out, peers and marks in."""
    profiles = _profile_threads() if profile_to else None
    switch = Switch(config).start()
    settle_process()  # as the switch agent does
    pipe.send((switch.worker_address, switch.peer_address))
    mark = usage()
    while True:
        command, *args = pipe.recv()
        if command == "peer":
            switch.add_peer(*args)
        elif command == "mark":
            mark = usage()
        elif command == "stop":
            pipe.send(usage_since(mark))
            switch.stop()
            if profiles and profile_to:
                stats = pstats.Stats(*profiles)
                stats.dump_stats(profile_to + ".pstats")
                with open(profile_to + ".txt", "w") as out:
                    pstats.Stats(profile_to + ".pstats", stream=out).sort_stats(
                        "tottime"
                    ).print_stats(40)
            return


@contextlib.contextmanager
def switch_pair(
    pki: Pki, profile_to: str | None = None
) -> Iterator[tuple[Callable[[str, str, str], SwitchLink], Callable[[], float]]]:
    """Switches A and B in processes of their own; yields (link(cluster, role, peer),
    mark()): mark() starts the switches' CPU clocks; the CPU seconds they spent since
    are returned by the context's `cpu` list after it closes."""

    def config(cluster: str) -> SwitchConfig:
        key, cert = pki.files[cluster]
        return SwitchConfig(
            cluster=cluster,
            key_path=key,
            cert_path=cert,
            ca_path=pki.ca_path,
            crl_source=crl_from_file(pki.crl_path),
            job_token_public_key=ca.job_token_public_key_pem(pki.token_key),
        )

    spawn = multiprocessing.get_context("spawn")
    procs, pipes, addresses = {}, {}, {}
    for cluster in ("cluster-a", "cluster-b"):
        pipes[cluster], child = spawn.Pipe()
        target = f"{profile_to}-{cluster}" if profile_to else None
        procs[cluster] = spawn.Process(target=run_switch, args=(config(cluster), child, target))
        procs[cluster].start()
    for cluster in procs:
        addresses[cluster] = pipes[cluster].recv()
    pipes["cluster-a"].send(("peer", "cluster-b", addresses["cluster-b"][1]))
    pipes["cluster-b"].send(("peer", "cluster-a", addresses["cluster-a"][1]))
    expires = time.time() + 3600

    def link(cluster: str, role: str, peer: str) -> SwitchLink:
        token = ca.sign_job_token(
            pki.token_key, job_id="bench", role=role, cluster=cluster, expires_at=expires
        )
        return SwitchLink(
            addresses[cluster][0],
            ca_path=pki.ca_path,
            token=token,
            job_id="bench",
            role=role,
            peer_role=peer,
        )

    def mark() -> float:
        for pipe in pipes.values():
            pipe.send(("mark",))
        return 0.0

    try:
        yield link, mark
    finally:
        SWITCH_USAGE.append(_stop_all(list(pipes.values()), list(procs.values())))


# (CPU s, page faults, voluntary context switches) of both switches since the last mark
SWITCH_USAGE: list[tuple[float, int, int]] = []
# the same of a comparator's two relays (`relay_chain`)
RELAY_USAGE: list[tuple[float, int, int]] = []


def _stop_all(
    pipes: Sequence[Connection], procs: Sequence[multiprocessing.process.BaseProcess]
) -> tuple[float, int, int]:
    """Stop the processes a path spawned; their usage since the last mark, summed."""
    spent = []
    for pipe in pipes:
        pipe.send(("stop",))
        spent.append(pipe.recv())
    for proc in procs:
        proc.join()
    return tuple(map(sum, zip(*spent, strict=True)))  # type: ignore[return-value]


def _raw_relay(ca_path: Path, key: Path, cert: Path, onward: Address) -> tuple[Address, Stop]:
    """A raw TLS relay: one connection in, one out to `onward`, both ways in one thread
    (an SSL socket read in one thread while another writes it can lose a record:
    OpenSSL's objects are not thread-safe)."""
    server_ctx = server_context(cert_path=cert, key_path=key, ca_path=None)
    listener = socket.create_server(("127.0.0.1", 0))

    def relay() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a = server_ctx.wrap_socket(conn, server_side=True)
        b = _raw_connect(ca_path, onward)
        other = {a: b, b: a}
        with contextlib.suppress(OSError):
            while True:
                for src in select.select([a, b], [], [])[0]:
                    chunk = src.recv(65536)
                    if not chunk:
                        return
                    while src.pending():  # decrypted bytes select cannot see
                        chunk += src.recv(src.pending())
                    other[src].sendall(chunk)

    threading.Thread(target=relay, daemon=True).start()
    return listener.getsockname()[:2], listener.close


def _raw_connect(ca_path: Path, address: Address) -> ssl.SSLSocket:
    raw = socket.create_connection(address)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client_context(ca_path=ca_path).wrap_socket(raw, server_hostname="cluster-b")


def _grpc_credentials(
    ca_path: Path, key: Path, cert: Path
) -> tuple[grpc.ServerCredentials, grpc.ChannelCredentials]:
    ca_pem, key_pem, cert_pem = ca_path.read_bytes(), key.read_bytes(), cert.read_bytes()
    server = grpc.ssl_server_credentials([(key_pem, cert_pem)], ca_pem, require_client_auth=True)
    return server, grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)


def _grpc_serve(
    handler: grpc.RpcMethodHandler, name: str, server_creds: grpc.ServerCredentials
) -> tuple[str, grpc.Server]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("relay", {name: handler})]
    )
    port = server.add_secure_port("127.0.0.1:0", server_creds)
    server.start()
    return f"127.0.0.1:{port}", server


def _grpc_relay(ca_path: Path, key: Path, cert: Path, onward: str, name: str) -> tuple[str, Stop]:
    """A gRPC relay: a server whose `name` method (Push: a client stream; Pong: a
    bidirectional one) passes each message on to the same method at `onward`."""
    server_creds, client_creds = _grpc_credentials(ca_path, key, cert)
    channel = grpc.secure_channel(onward, client_creds, options=GRPC_OPTIONS)
    if name == "Push":
        push = channel.stream_unary("/relay/Push")
        handler = grpc.stream_unary_rpc_method_handler(lambda messages, _: push(messages))
    else:
        pong = channel.stream_stream("/relay/Pong")
        handler = grpc.stream_stream_rpc_method_handler(lambda messages, _: pong(messages))
    address, server = _grpc_serve(handler, name, server_creds)
    return address, lambda: server.stop(None)


Stop = Callable[[], None]
RELAYS: dict[str, Callable[..., tuple[Address | str, Stop]]] = {
    "raw": _raw_relay,
    "grpc": _grpc_relay,
}


def run_relay(kind: str, args: tuple, pipe: Connection) -> None:
    """One relay of a comparator in a process of its own, as each switch is: sends its
    address, serves, and at ("stop",) sends its usage since the last ("mark",)."""
    address, stop = RELAYS[kind](*args)
    settle_process()  # as a switch's process does
    pipe.send(address)
    mark = usage()
    while True:
        command, *_ = pipe.recv()
        if command == "mark":
            mark = usage()
        elif command == "stop":
            pipe.send(usage_since(mark))
            stop()
            return


@contextlib.contextmanager
def relay_chain(
    pki: Pki, kind: str, far_end: Address | str, *extra: str
) -> Iterator[tuple[Address | str, Callable[[], None]]]:
    """Relay B (to `far_end`, in this process) and relay A (to B), each in a process of
    its own; yields (A's address, mark()); their usage since the mark lands in
    RELAY_USAGE once the context closes."""
    key, cert = pki.files["cluster-b"]
    spawn = multiprocessing.get_context("spawn")
    pipes, procs, onward = [], [], far_end
    for _ in ("B", "A"):
        mine, theirs = spawn.Pipe()
        proc = spawn.Process(
            target=run_relay, args=(kind, (pki.ca_path, key, cert, onward, *extra), theirs)
        )
        proc.start()
        pipes.append(mine)
        procs.append(proc)
        onward = mine.recv()

    def mark() -> None:
        for pipe in pipes:
            pipe.send(("mark",))

    try:
        yield onward, mark
    finally:
        RELAY_USAGE.append(_stop_all(pipes, procs))


def _profile_to(path: str) -> str | None:
    """Where `--profile` keeps this path's switch profiles (None: not profiled)."""
    prefix = _argv_value("--profile-to")
    return f"{prefix}-{path}" if prefix else None


def switch_path(pki: Pki, on_frame: Callable[[], None]) -> tuple[float, ...]:
    """(b) worker -> switch A -> switch B -> worker, all checks on; returns the wall
    seconds, and the CPU seconds, page faults and voluntary context switches of the
    workers' process and both switches."""
    with (
        switch_pair(pki, _profile_to("switch")) as (link, mark),
        link("cluster-a", "G", "D") as sender,
        link("cluster-b", "D", "G") as receiver,
    ):
        sender.send("warmup", b"x")  # the first frame waits for the switches to connect
        assert receiver.recv("warmup", timeout=60) == b"x"
        mark()
        wall, own = time.perf_counter(), usage()

        def receive() -> None:
            for i in range(FRAMES):
                got = receiver.recv("acts", timeout=60)
                assert isinstance(got, torch.Tensor) and int(got[0]) == i
                on_frame()

        thread = threading.Thread(target=receive)
        thread.start()
        for tensor in payloads():
            sender.send("acts", tensor)
        thread.join()
        wall, spent = time.perf_counter() - wall, usage_since(own)
    return wall, *(mine + theirs for mine, theirs in zip(spent, SWITCH_USAGE[-1], strict=True))


def _percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_us": pick(0.5) * 1e6, "p99_us": pick(0.99) * 1e6, "n": len(ordered)}


def _ping_pong(send: Callable[[bytes], None], receive: Callable[[], bytes]) -> dict:
    """RTT_COUNT round trips of a 16-byte message after a warm-up; p50 and p99."""
    message = b"0123456789abcdef"
    samples = []
    for i in range(RTT_WARMUP + RTT_COUNT):
        start = time.perf_counter()
        send(message)
        assert receive() == message
        if i >= RTT_WARMUP:
            samples.append(time.perf_counter() - start)
    return _percentiles(samples)


def _ping_pong_cpu(ping_pong: Callable[[], dict], mark: Callable[[], None]) -> dict:
    """A comparator's ping-pong, with this process's CPU seconds for it (`own_cpu_s`);
    `mark` starts its relays' clocks."""
    mark()
    own = usage()
    return ping_pong() | {"own_cpu_s": usage_since(own)[0]}


def _with_relays_cpu(result: dict) -> dict:
    """The CPU per round trip of every process it crossed: this one's and, from its
    `relay_chain` once closed, both relays'."""
    own = result.pop("own_cpu_s")
    return result | _split_cpu(own, RELAY_USAGE[-1][0])


def _split_cpu(ends_s: float, middle_s: float) -> dict:
    """CPU per round trip of every process a round trip crossed, and where it went: the
    two ends (this process) and each crossing of the two in the middle (switches or
    relays), which a round trip crosses twice each."""
    trips = RTT_WARMUP + RTT_COUNT
    return {
        "cpu_us_per_round_trip": (ends_s + middle_s) / trips * 1e6,
        "ends_cpu_us_per_round_trip": ends_s / trips * 1e6,
        "cpu_us_per_crossing": middle_s / trips / 4 * 1e6,
    }


def switch_rtt(pki: Pki) -> dict:
    """(d) a 16-byte frame worker -> switch A -> switch B -> worker, and back."""
    with (
        switch_pair(pki, _profile_to("switch_rtt")) as (link, mark),
        link("cluster-a", "G", "D") as g,
        link("cluster-b", "D", "G") as d,
    ):
        mark()
        own = usage()

        def echo() -> None:
            for _ in range(RTT_WARMUP + RTT_COUNT):
                d.send("pong", d.recv("ping", timeout=60))

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        result = _ping_pong(
            lambda m: g.send("ping", m),
            lambda: bytes(g.recv("pong", timeout=60)),
        )
        thread.join()
        workers = usage_since(own)
    # the switches' count runs on to their stop, past the links' goodbyes: a few more
    trips = RTT_WARMUP + RTT_COUNT
    return (
        result
        | {"cswitch_per_round_trip": (workers[2] + SWITCH_USAGE[-1][2]) / trips}
        | _split_cpu(workers[0], SWITCH_USAGE[-1][0])
    )


def grpc_rtt(pki: Pki) -> dict:
    """(d) a 16-byte message through a 3-hop gRPC relay of bidirectional streams, and back:
    the far end here, two relays in processes of their own."""
    key, cert = pki.files["cluster-b"]
    server_creds, client_creds = _grpc_credentials(pki.ca_path, key, cert)

    def echo(messages: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from messages

    far, server = _grpc_serve(grpc.stream_stream_rpc_method_handler(echo), "Pong", server_creds)
    outbox: queue.Queue[bytes | None] = queue.Queue()
    try:
        with relay_chain(pki, "grpc", far, "Pong") as (front, mark):
            channel = grpc.secure_channel(str(front), client_creds, options=GRPC_OPTIONS)
            answers = channel.stream_stream("/relay/Pong")(iter(outbox.get, None))
            try:
                result = _ping_pong_cpu(lambda: _ping_pong(outbox.put, lambda: next(answers)), mark)
            finally:
                outbox.put(None)
                channel.close()
    finally:
        server.stop(None)
    return _with_relays_cpu(result)


def raw_tls_rtt(pki: Pki) -> dict:
    """(d) a 16-byte message through three raw TLS hops, and back: the far end (an echo)
    here, two relays in processes of their own."""
    key, cert = pki.files["cluster-b"]
    server_ctx = server_context(cert_path=cert, key_path=key, ca_path=None)
    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError), server_ctx.wrap_socket(conn, server_side=True) as sock:
            while chunk := sock.recv(65536):
                sock.sendall(chunk)

    threading.Thread(target=echo, daemon=True).start()
    try:
        with relay_chain(pki, "raw", listener.getsockname()[:2]) as (front, mark):
            client = _raw_connect(pki.ca_path, front)  # type: ignore[arg-type]

            def receive() -> bytes:
                got = b""
                while len(got) < 16:
                    got += client.recv(16 - len(got))
                return got

            with client:
                result = _ping_pong_cpu(lambda: _ping_pong(client.sendall, receive), mark)
    finally:
        listener.close()
    return _with_relays_cpu(result)


def grpc_relay(pki: Pki, on_frame: Callable[[], None]) -> tuple[float, ...]:
    """(c) sender -> relay A -> relay B -> sink, each hop a gRPC client stream over mutual
    TLS, each relay in a process of its own; returns what `switch_path` returns."""
    key, cert = pki.files["cluster-b"]
    server_creds, client_creds = _grpc_credentials(pki.ca_path, key, cert)
    done = threading.Event()

    def sink(messages: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        for message in messages:
            assert len(message) == FRAME
            on_frame()
        done.set()
        return b""

    far, server = _grpc_serve(grpc.stream_unary_rpc_method_handler(sink), "Push", server_creds)
    try:
        with relay_chain(pki, "grpc", far, "Push") as (front, mark):
            channel = grpc.secure_channel(str(front), client_creds, options=GRPC_OPTIONS)
            mark()
            wall, own = time.perf_counter(), usage()
            channel.stream_unary("/relay/Push")(tensor.numpy().tobytes() for tensor in payloads())
            done.wait()
            wall, spent = time.perf_counter() - wall, usage_since(own)
            channel.close()
    finally:
        server.stop(None)
    return wall, *(mine + theirs for mine, theirs in zip(spent, RELAY_USAGE[-1], strict=True))


RTT_WARMUP = 50
RTT_COUNT = int(_argv_value("--rtt-count", "1000") or 1000)
THROUGHPUT = {"raw_tls": raw_tls, "switch": switch_path, "grpc_relay": grpc_relay}
ROUND_TRIP = {"switch_rtt": switch_rtt, "grpc_rtt": grpc_rtt, "raw_tls_3hop_rtt": raw_tls_rtt}


def one(path: str) -> dict:
    """Measure one path in this process (the orchestrator's child), with the CPU time
    the hypervisor gave to other guests meanwhile (`steal_s`)."""
    torch.set_num_threads(1)
    stolen = steal_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        if path in THROUGHPUT:
            runner = THROUGHPUT[path]
            result = measure(lambda f: runner(pki, f))
        else:
            result = ROUND_TRIP[path](pki)
    now = steal_seconds()
    if stolen is not None and now is not None:
        result["steal_s"] = now - stolen
    return result


def steal_seconds() -> float | None:
    """CPU seconds this virtual machine's cores waited while the host ran other guests,
    all cores together (/proc/stat), None where it is not known. The load average sees
    only this machine: a neighbour on the host shows here, and nowhere else."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def child(
    paths: list[str], code_root: Path, args: argparse.Namespace, profile_to: Path | None
) -> dict:
    """Run `one` for each of `paths`, in turn, in a fresh process importing the packages
    of `code_root` (one process a round: starting one costs more than a path here)."""
    command = [sys.executable, __file__, "--one", ",".join(paths), "--code-root", str(code_root)]
    command += ["--mib", str(args.mib), "--rtt-count", str(args.rtt_count)]
    if profile_to is not None:
        command += ["--profile-to", str(profile_to)]
    # the checkout's packages first; other entries (a folder of bench extras) pass on,
    # other checkouts do not
    here = Path(__file__).resolve().parent.parent
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    extra = [p for p in inherited if p and Path(p).resolve() not in (here, code_root.resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code_root), *extra])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{paths} at {code_root} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def spread(values: list[float]) -> dict:
    """Median, min and max of a path's rounds."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "rounds": [round(v, 3) for v in values],
    }


def main() -> None:
    """Interleave the rounds of every path, report medians and spreads."""
    # this checkout's helper: the module's imports may come from another commit's checkout
    from bench.revisions import checkouts

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rtt-count", type=int, default=1000)
    parser.add_argument(
        "--against",
        metavar="REV",
        action="append",
        default=[],
        help="also measure this commit's switch (may be repeated)",
    )
    parser.add_argument("--profile", type=Path, metavar="DIR", help="cProfile the switches")
    parser.add_argument("--only", help="comma-separated paths to run (default: all)")
    parser.add_argument("--note", default="", help="a note stored with the figures")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--code-root", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps({path: one(path) for path in args.one.split(",")}))
        return
    if args.rounds < 3:
        parser.error("at least 3 rounds: one run cannot tell a change from noise")
    here = Path(__file__).resolve().parent.parent
    console = Console()
    with checkouts(args.against) as others:
        roots = {"": here} | {f"@{rev}": path for rev, path in others.items()}
        mine = ["raw_tls", "switch", "grpc_relay", "switch_rtt", "grpc_rtt", "raw_tls_3hop_rtt"]
        if args.only:
            mine = [p for p in mine if p in args.only.split(",")]
        theirs = [p for p in mine if p.startswith("switch")]
        got: dict[str, list[dict]] = {}
        loads: list[float] = []
        for n in range(args.rounds):
            # the checkouts rotate which goes first, and the paths rotate in a round
            shift = n % len(mine)
            runs = [("", mine[shift:] + mine[:shift])]
            for tag in roots:
                if tag:
                    runs.append((tag, theirs[n % len(theirs) :] + theirs[: n % len(theirs)]))
            runs = runs[n % len(runs) :] + runs[: n % len(runs)]
            loads.append(round(os.getloadavg()[0], 2))
            for tag, paths in runs:
                profile_to = None
                if args.profile is not None and any(p.startswith("switch") for p in paths):
                    args.profile.mkdir(parents=True, exist_ok=True)
                    name = f"switch{tag.replace('@', '-')}-round{n + 1}"
                    profile_to = args.profile.resolve() / name
                console.print(f"round {n + 1}/{args.rounds}{tag}: {', '.join(paths)}")
                for path, result in child(paths, roots[tag], args, profile_to).items():
                    got.setdefault(path + tag, []).append(result)
    summary = summarize(got, args)
    summary["load_average_1min_per_round"] = loads
    print_table(console, summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {args.out}")


# what each path measures, stored with median and spread where a path has it
FIGURES = (
    "mb_s",
    "cpu_s_per_gib",
    "faults_per_gib",
    "cswitch_per_frame",
    "p50_us",
    "p99_us",
    "cswitch_per_round_trip",
    "cpu_us_per_round_trip",
    "ends_cpu_us_per_round_trip",
    "cpu_us_per_crossing",
    "steal_s",
)


def summarize(got: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """Medians and spreads per path, and the ratios the targets name (medians of rounds)."""
    from bench.revisions import short_head

    paths: dict[str, dict] = {}
    for name, runs in got.items():
        paths[name] = {key: spread([r[key] for r in runs]) for key in FIGURES if key in runs[0]}

    def med(path: str, key: str) -> float | None:
        return paths[path][key]["median"] if path in paths else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    raw_cpu = med("raw_tls", "cpu_s_per_gib")
    summary: dict = {
        "switch_vs_grpc_relay": ratio(med("switch", "mb_s"), med("grpc_relay", "mb_s")),
        "switch_vs_raw_tls": ratio(med("switch", "mb_s"), med("raw_tls", "mb_s")),
        # three raw hops cost three times one hop's CPU per GiB
        "switch_cpu_per_gib_vs_3_raw_hops": ratio(
            med("switch", "cpu_s_per_gib"), 3 * raw_cpu if raw_cpu else None
        ),
        "small_frame_rtt_p50_vs_grpc": ratio(
            med("switch_rtt", "p50_us"), med("grpc_rtt", "p50_us")
        ),
        "small_frame_rtt_p99_vs_grpc": ratio(
            med("switch_rtt", "p99_us"), med("grpc_rtt", "p99_us")
        ),
        "small_frame_rtt_p50_vs_3_raw_hops": ratio(
            med("switch_rtt", "p50_us"), med("raw_tls_3hop_rtt", "p50_us")
        ),
        # CPU of every process a round trip crosses: unlike its time, barely moved by the
        # load of a shared machine
        "small_frame_cpu_per_round_trip_vs_grpc": ratio(
            med("switch_rtt", "cpu_us_per_round_trip"), med("grpc_rtt", "cpu_us_per_round_trip")
        ),
        "small_frame_cpu_per_round_trip_vs_3_raw_hops": ratio(
            med("switch_rtt", "cpu_us_per_round_trip"),
            med("raw_tls_3hop_rtt", "cpu_us_per_round_trip"),
        ),
        # where it goes: a switch's crossing against a raw relay's, the ends against theirs
        "small_frame_cpu_per_crossing_vs_raw_relay": ratio(
            med("switch_rtt", "cpu_us_per_crossing"),
            med("raw_tls_3hop_rtt", "cpu_us_per_crossing"),
        ),
        "small_frame_ends_cpu_per_round_trip_vs_raw": ratio(
            med("switch_rtt", "ends_cpu_us_per_round_trip"),
            med("raw_tls_3hop_rtt", "ends_cpu_us_per_round_trip"),
        ),
    }
    if args.against:
        summary["against"] = args.against
    for rev in args.against:
        summary[f"switch_vs_{rev}"] = ratio(med("switch", "mb_s"), med(f"switch@{rev}", "mb_s"))
        summary[f"switch_cpu_per_gib_vs_{rev}"] = ratio(
            med("switch", "cpu_s_per_gib"), med(f"switch@{rev}", "cpu_s_per_gib")
        )
        summary[f"small_frame_rtt_p50_vs_{rev}"] = ratio(
            med("switch_rtt", "p50_us"), med(f"switch_rtt@{rev}", "p50_us")
        )
        summary[f"switch_faults_per_gib_vs_{rev}"] = ratio(
            med("switch", "faults_per_gib"), med(f"switch@{rev}", "faults_per_gib")
        )
        summary[f"small_frame_cswitch_per_round_trip_vs_{rev}"] = ratio(
            med("switch_rtt", "cswitch_per_round_trip"),
            med(f"switch_rtt@{rev}", "cswitch_per_round_trip"),
        )
        summary[f"small_frame_cpu_per_round_trip_vs_{rev}"] = ratio(
            med("switch_rtt", "cpu_us_per_round_trip"),
            med(f"switch_rtt@{rev}", "cpu_us_per_round_trip"),
        )
    summary |= {
        "paths": paths,
        "rounds": args.rounds,
        "payload_bytes": TOTAL,
        "frame_bytes": FRAME,
        "small_frame_bytes": 16,
        "round_trips_per_round": args.rtt_count,
        "commit": short_head(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "note": args.note,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return summary


def print_table(console: Console, summary: dict) -> None:
    table = Table(title=f"switch bench, {summary['rounds']} interleaved rounds, median [min-max]")
    columns = (
        "path",
        "MB/s",
        "CPU s per GiB",
        "faults per GiB",
        "p50 us",
        "p99 us",
        "CPU us per RT",
        "of it, ends",
        "CPU us per crossing",
        "cswitch",
    )
    for column in columns:
        table.add_column(column, justify="right" if column != "path" else "left")

    def cell(row: dict, key: str) -> str:
        if key not in row:
            return ""
        s = row[key]
        return f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"

    for name, row in summary["paths"].items():
        table.add_row(
            name,
            cell(row, "mb_s"),
            cell(row, "cpu_s_per_gib"),
            cell(row, "faults_per_gib"),
            cell(row, "p50_us"),
            cell(row, "p99_us"),
            cell(row, "cpu_us_per_round_trip"),
            cell(row, "ends_cpu_us_per_round_trip"),
            cell(row, "cpu_us_per_crossing"),
            cell(row, "cswitch_per_frame") or cell(row, "cswitch_per_round_trip"),
        )
    console.print(table)
    for key, value in summary.items():
        if key.startswith(("switch_", "small_frame")) and value is not None:
            console.print(f"{key}: {value}")


if __name__ == "__main__":
    main()
