"""Hosts of a test deployment: network namespaces joined by veth pairs, and a TCP relay.

Each cluster host is a network namespace with a link to the control-plane host (the
root namespace) and a WAN link to the other cluster. Nothing is forwarded between
links, so a cluster host reaches exactly what listens on the addresses of its links.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path


def run(*argv: str) -> str:
    """Run a command (as root), failing loudly."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Namespace:
    """One host: a network namespace with its addresses."""

    name: str
    addresses: dict[str, str] = field(default_factory=dict)  # link -> this host's address

    def exec_argv(self, *argv: str) -> list[str]:
        """argv that runs `argv` on this host."""
        return ["ip", "netns", "exec", self.name, *argv]

    def tcp_table(self) -> list[tuple[str, int, str, int, str]]:
        """Every TCP socket of the host: (local ip, port, remote ip, port, state)."""
        rows = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                text = run(*self.exec_argv("cat", table))
            except RuntimeError:
                continue
            for line in text.splitlines()[1:]:
                parts = line.split()
                local, remote, state = parts[1], parts[2], parts[3]
                rows.append((*_endpoint(local), *_endpoint(remote), state))
        return rows


def _endpoint(hex_endpoint: str) -> tuple[str, int]:
    address, port = hex_endpoint.split(":")
    if len(address) == 8:  # IPv4, little-endian
        ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1])
    else:
        raw = bytes.fromhex(address)
        ip = socket.inet_ntop(
            socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        )
        ip = ip.removeprefix("::ffff:")
    return ip, int(port, 16)


TCP_LISTEN, TCP_ESTABLISHED, TCP_SYN_SENT = "0A", "01", "02"


class Network:
    """The namespaces and links of one test deployment; `close()` removes them all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.namespaces: list[Namespace] = []
        self.root_links: list[str] = []

    def host(self, name: str) -> Namespace:
        namespace = Namespace(f"{self.prefix}-{name}")
        run("ip", "netns", "add", namespace.name)
        run(*namespace.exec_argv("ip", "link", "set", "lo", "up"))
        self.namespaces.append(namespace)
        return namespace

    def link_to_root(self, host: Namespace, root_ip: str, host_ip: str, link: str) -> None:
        """A veth pair between the root namespace (`root_ip`) and `host` (`host_ip`), /24."""
        outside, inside = f"{self.prefix}{link}r", f"{self.prefix}{link}h"
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self.root_links.append(outside)
        run("ip", "link", "set", inside, "netns", host.name)
        run("ip", "addr", "add", f"{root_ip}/24", "dev", outside)
        run("ip", "link", "set", outside, "up")
        run(*host.exec_argv("ip", "addr", "add", f"{host_ip}/24", "dev", inside))
        run(*host.exec_argv("ip", "link", "set", inside, "up"))
        host.addresses[link] = host_ip

    def link_hosts(self, a: Namespace, a_ip: str, b: Namespace, b_ip: str, link: str) -> None:
        """A veth pair straight between two hosts (a WAN link), /24."""
        end_a, end_b = f"{self.prefix}{link}a", f"{self.prefix}{link}b"
        run("ip", "link", "add", end_a, "type", "veth", "peer", "name", end_b)
        for host, end, ip in ((a, end_a, a_ip), (b, end_b, b_ip)):
            run("ip", "link", "set", end, "netns", host.name)
            run(*host.exec_argv("ip", "addr", "add", f"{ip}/24", "dev", end))
            run(*host.exec_argv("ip", "link", "set", end, "up"))
            host.addresses[link] = ip

    def lan(self, owner: Namespace, owner_ip: str, link: str) -> str:
        """A bridge inside `owner` with `owner_ip`/24 on it (one site network); its name."""
        bridge = f"{self.prefix}{link}"
        run(*owner.exec_argv("ip", "link", "add", bridge, "type", "bridge"))
        run(*owner.exec_argv("ip", "link", "set", bridge, "up"))
        run(*owner.exec_argv("ip", "addr", "add", f"{owner_ip}/24", "dev", bridge))
        owner.addresses[link] = owner_ip
        return bridge

    def join_lan(
        self, host: Namespace, host_ip: str, owner: Namespace, bridge: str, link: str
    ) -> None:
        """Plug `host` into a bridge made by `lan` (a veth pair, one end on the bridge)."""
        inside, port = f"{self.prefix}{link}h", f"{self.prefix}{link}p"
        run("ip", "link", "add", inside, "type", "veth", "peer", "name", port)
        run("ip", "link", "set", inside, "netns", host.name)
        run("ip", "link", "set", port, "netns", owner.name)
        run(*owner.exec_argv("ip", "link", "set", port, "master", bridge))
        run(*owner.exec_argv("ip", "link", "set", port, "up"))
        run(*host.exec_argv("ip", "addr", "add", f"{host_ip}/24", "dev", inside))
        run(*host.exec_argv("ip", "link", "set", inside, "up"))
        host.addresses[bridge] = host_ip

    def close(self) -> None:
        for namespace in self.namespaces:
            with contextlib.suppress(RuntimeError):
                run("ip", "netns", "del", namespace.name)
        for link in self.root_links:
            with contextlib.suppress(RuntimeError):
                run("ip", "link", "del", link)


def namespaces_usable() -> str | None:
    """None if this process may make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"nbprobe{os.getpid()}"
    try:
        run("ip", "netns", "add", probe)
        run("ip", "netns", "del", probe)
    except (RuntimeError, OSError) as exc:
        return f"`ip netns add` failed: {exc}"
    return None


class Relay:
    """A TCP relay: what listens on (host, port) is the service at `target` (a port forward
    on the service's host, as a firewall's DNAT would be). With `tls`, it ends TLS first
    (a TLS listener in front of a plain service, as RabbitMQ's own on 5671 would be)."""

    def __init__(
        self,
        listen: tuple[str, int],
        target: tuple[str, int],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target = target
        self.tls = tls
        self.server = socket.create_server(listen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.tls is not None:
                try:
                    client.settimeout(10)
                    client = self.tls.wrap_socket(client, server_side=True)
                    client.settimeout(None)
                except OSError:
                    client.close()
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def write_server_certificate(folder: Path, ips: list[str]) -> tuple[Path, Path, Path]:
    """A CA of the deployment's own and an HTTPS certificate for the control plane's IPs."""
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deploy test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "control plane")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "tls-ca.pem", folder / "tls.crt", folder / "tls.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def main(argv: list[str]) -> None:
    """`python hosts.py relay LISTEN_HOST:PORT TARGET_HOST:PORT [CERT KEY]`: a relay as a
    process of its own, to run inside a namespace (`ip netns exec NS python hosts.py relay
    ...`); with a certificate and key it ends TLS."""
    _command, listen, target, *tls_files = argv
    tls = None
    if tls_files:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(tls_files[0], tls_files[1])

    def split(text: str) -> tuple[str, int]:
        host, _, port = text.rpartition(":")
        return host, int(port)

    relay = Relay(split(listen), split(target), tls)
    try:
        threading.Event().wait()  # until the test terminates this process
    finally:
        relay.close()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
