"""Switch throughput on loopback: raw TLS vs the switch path vs a gRPC relay.

1 GiB of float32 tensors in 4 MiB frames, each way measured in this process:

(a) one raw Python TLS socket, one hop, the ceiling for pure Python;
(b) worker -> switch A -> switch B -> worker, with every check switched on; each
    switch in its own process as deployed (CPU time counts both switches);
(c) a pass-through relay of the same three TLS hops made of plain gRPC streams,
    the way Flower and NVFlare move messages.

Prints a table, writes bench/results/switch_throughput.json.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.pki import ca
from workers.switch.client import SwitchLink
from workers.switch.server import Switch, SwitchConfig, crl_from_file
from workers.switch.tls import client_context, server_context

TOTAL = 1 << 30
FRAME = 4 << 20
FRAMES = TOTAL // FRAME
RESULTS = Path(__file__).parent / "results" / "switch_throughput.json"


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


def measure(
    run: Callable[[Callable[[], None]], tuple[float, float] | None], progress: Progress, label: str
) -> dict:
    """Wall and CPU seconds of one run; `run` calls its argument once per frame received."""
    task = progress.add_task(label, total=FRAMES)
    wall, cpu = time.perf_counter(), time.process_time()
    own = run(lambda: progress.advance(task))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if own is not None:  # the run timed itself (it had processes to start first)
        wall, cpu = own
    return {"mb_s": TOTAL / wall / 1e6, "wall_s": wall, "cpu_s_per_gib": cpu * (1 << 30) / TOTAL}


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


def run_switch(config: SwitchConfig, pipe: Connection) -> None:
    """A switch in its own process, as deployed: addresses out, peers and marks in."""
    switch = Switch(config).start()
    pipe.send((switch.worker_address, switch.peer_address))
    mark = time.process_time()
    while True:
        command, *args = pipe.recv()
        if command == "peer":
            switch.add_peer(*args)
        elif command == "mark":
            mark = time.process_time()
        elif command == "stop":
            pipe.send(time.process_time() - mark)
            switch.stop()
            return


def switch_path(pki: Pki, on_frame: Callable[[], None]) -> tuple[float, float]:
    """(b) worker -> switch A -> switch B -> worker, all checks on; returns the switches' CPU s."""

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
        procs[cluster] = spawn.Process(target=run_switch, args=(config(cluster), child))
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

    try:
        with link("cluster-a", "G", "D") as sender, link("cluster-b", "D", "G") as receiver:
            sender.send("warmup", b"x")  # the first frame waits for the switches to connect
            assert receiver.recv("warmup", timeout=60) == b"x"
            for pipe in pipes.values():
                pipe.send(("mark",))
            wall, cpu = time.perf_counter(), time.process_time()

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
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        switch_cpu = 0.0
        for pipe in pipes.values():
            pipe.send(("stop",))
            switch_cpu += pipe.recv()
        for proc in procs.values():
            proc.join()
    return wall, cpu + switch_cpu


def grpc_relay(pki: Pki, on_frame: Callable[[], None]) -> None:
    """(c) sender -> relay A -> relay B -> sink, each hop a gRPC client stream over mutual TLS."""
    options = [
        ("grpc.max_receive_message_length", FRAME + 1024),
        ("grpc.max_send_message_length", FRAME + 1024),
        ("grpc.ssl_target_name_override", "cluster-b"),
    ]
    ca_pem = pki.ca_path.read_bytes()
    key, cert = (p.read_bytes() for p in pki.files["cluster-b"])
    server_creds = grpc.ssl_server_credentials([(key, cert)], ca_pem, require_client_auth=True)
    client_creds = grpc.ssl_channel_credentials(ca_pem, key, cert)
    servers: list[grpc.Server] = []
    done = threading.Event()

    def serve(handler: Callable[[Iterator[bytes], grpc.ServicerContext], bytes]) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        method = grpc.stream_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("relay", {"Push": method})]
        )
        port = server.add_secure_port("127.0.0.1:0", server_creds)
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    def sink(messages: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        for message in messages:
            assert len(message) == FRAME
            on_frame()
        done.set()
        return b""

    def forwarder(target: str) -> Callable[[Iterator[bytes], grpc.ServicerContext], bytes]:
        channel = grpc.secure_channel(target, client_creds, options=options)
        push = channel.stream_unary("/relay/Push")

        def forward(messages: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            return push(messages)

        return forward

    relay_b = serve(forwarder(serve(sink)))
    relay_a = serve(forwarder(relay_b))
    channel = grpc.secure_channel(relay_a, client_creds, options=options)
    push = channel.stream_unary("/relay/Push")
    push(tensor.numpy().tobytes() for tensor in payloads())
    done.wait()
    for server in servers:
        server.stop(None)


def main() -> None:
    """Run the three paths once each and report."""
    console = Console()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        with Progress(console=console) as progress:
            results = {
                "raw_tls": measure(lambda f: raw_tls(pki, f), progress, "(a) raw TLS socket"),
                "switch": measure(lambda f: switch_path(pki, f), progress, "(b) switch path"),
                "grpc_relay": measure(lambda f: grpc_relay(pki, f), progress, "(c) gRPC relay"),
            }
    raw = results["raw_tls"]["mb_s"]
    table = Table(title=f"1 GiB of float32 in 4 MiB frames, loopback, {os.cpu_count()} CPUs")
    for column in ("path", "MB/s", "vs raw TLS", "vs gRPC relay", "CPU s per GiB"):
        table.add_column(column, justify="right" if column != "path" else "left")
    names = {
        "raw_tls": "(a) raw TLS socket, 1 hop",
        "switch": "(b) worker > switch A > switch B > worker",
        "grpc_relay": "(c) gRPC relay, 3 TLS hops",
    }
    for key, row in results.items():
        table.add_row(
            names[key],
            f"{row['mb_s']:.0f}",
            f"{row['mb_s'] / raw:.2f}",
            f"{row['mb_s'] / results['grpc_relay']['mb_s']:.2f}",
            f"{row['cpu_s_per_gib']:.2f}",
        )
    console.print(table)
    summary = {
        "switch_mb_s": round(results["switch"]["mb_s"], 1),
        "raw_tls_mb_s": round(raw, 1),
        "grpc_relay_mb_s": round(results["grpc_relay"]["mb_s"], 1),
        "switch_vs_raw_tls": round(results["switch"]["mb_s"] / raw, 3),
        "switch_vs_grpc_relay": round(results["switch"]["mb_s"] / results["grpc_relay"]["mb_s"], 3),
        "cpu_s_per_gib": {k: round(v["cpu_s_per_gib"], 3) for k, v in results.items()},
        "payload_bytes": TOTAL,
        "frame_bytes": FRAME,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
