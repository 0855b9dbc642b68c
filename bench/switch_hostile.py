"""A switch's memory under the review's attack: strangers announcing huge frames.

Eight TLS connections to a switch's worker port (in its own process, as deployed) each
send 73 bytes: a DATA header announcing a 64 MiB body, and its meta, and then nothing.
Reports the switch's resident memory before and after, and how many of the eight it had
closed two seconds later. Prints a table, writes bench/results/switch_hostile.json.
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import socket
import ssl
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.pki import ca
from workers.switch import protocol as p
from workers.switch.server import Switch, SwitchConfig, crl_from_file
from workers.switch.tls import client_context

ATTACKERS = 8
ANNOUNCED = 64 * 1024 * 1024
RESULTS = Path(__file__).parent / "results" / "switch_hostile.json"


def switch_files(root: Path) -> tuple[SwitchConfig, Path]:
    """A throwaway CA and the config of one switch signed by it; and the CA file."""
    ca_key, ca_cert = ca.create_root_ca("Bench CA")
    ca_path, crl_path = root / "ca.pem", root / "crl.pem"
    ca_path.write_bytes(ca.certificate_pem(ca_cert))
    next_update = datetime.now(UTC) + timedelta(days=1)
    crl_path.write_bytes(ca.build_crl(ca_key, ca_cert, [], next_update=next_update))
    key_pem, csr = ca.make_switch_key_and_csr("cluster-a")
    key_path, cert_path = root / "a.key", root / "a.crt"
    key_path.write_bytes(key_pem)
    cert_path.write_bytes(ca.sign_csr(ca_key, ca_cert, csr, cluster_name="cluster-a"))
    config = SwitchConfig(
        cluster="cluster-a",
        key_path=key_path,
        cert_path=cert_path,
        ca_path=ca_path,
        crl_source=crl_from_file(crl_path),
        job_token_public_key=ca.job_token_public_key_pem(ca.make_job_token_key()),
    )
    return config, ca_path


def serve(config: SwitchConfig, pipe: Connection) -> None:
    """The switch in its own process: its worker address out, then wait for "stop"."""
    switch = Switch(config).start()
    pipe.send(switch.worker_address)
    pipe.recv()
    switch.stop()


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def attack_bytes() -> bytes:
    """A DATA header announcing a 64 MiB body, and a valid meta: 73 bytes."""
    meta = json.dumps({"job": "j", "ch": "c", "seq": 0, "src": "G", "dst": "D"}).encode()
    return p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.DATA, len(meta), ANNOUNCED) + meta


def closed(sock: ssl.SSLSocket) -> bool:
    """Whether the switch has closed this connection (reading without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config, ca_path = switch_files(Path(tmp))
        spawn = multiprocessing.get_context("spawn")
        pipe, child = spawn.Pipe()
        proc = spawn.Process(target=serve, args=(config, child))
        proc.start()
        worker_address = pipe.recv()
        assert proc.pid is not None
        before = rss_mib(proc.pid)
        context = client_context(ca_path=ca_path)
        attackers = []
        for _ in range(ATTACKERS):
            raw = socket.create_connection(tuple(worker_address), timeout=10)
            sock = context.wrap_socket(raw, server_hostname="cluster-a")
            sock.sendall(attack_bytes())
            attackers.append(sock)
        peak = before
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            peak = max(peak, rss_mib(proc.pid))
            time.sleep(0.05)  # sampling the other process's memory, not synchronising
        closed_count = sum(closed(sock) for sock in attackers)
        for sock in attackers:
            sock.close()
        pipe.send("stop")
        proc.join(timeout=10)
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {multiprocessing.cpu_count()} cores",
        "attackers": ATTACKERS,
        "bytes_each": len(attack_bytes()),
        "announced_body_bytes": ANNOUNCED,
        "rss_before_mib": round(before, 1),
        "rss_peak_mib": round(peak, 1),
        "closed_within_2s": closed_count,
    }
    table = Table(title="Switch memory: 8 strangers announcing 64 MiB frames")
    for column in ("RSS before (MiB)", "RSS peak (MiB)", "grown (MiB)", "closed within 2 s"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{before:.0f}", f"{peak:.0f}", f"{peak - before:.0f}", f"{closed_count}/{ATTACKERS}"
    )
    Console().print(table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
