"""A cluster's workers reach the broker over TLS (amqps://) with the broker's CA from their
bundle, and refuse a broker whose certificate that CA did not sign.

The machine's RabbitMQ has no TLS listener, so a TLS front of the test's own (a real TLS
server with a certificate for `localhost`) passes the bytes on to its AMQP port, as a
TLS-terminating load balancer in front of a broker would.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from common.broker import make_celery
from support.certs import localhost_certificate
from support.services import RABBITMQ_URL, service_unavailable

pytestmark = pytest.mark.services


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def tls_front(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A TLS listener on a free loopback port in front of RabbitMQ; its port and CA."""
    upstream = urlsplit(RABBITMQ_URL)
    address = (upstream.hostname or "127.0.0.1", upstream.port or 5672)
    try:
        socket.create_connection(address, timeout=5).close()
    except OSError as exc:
        service_unavailable("RabbitMQ", exc)
    ca_path, cert, key = localhost_certificate(tmp_path, "broker")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                secured = context.wrap_socket(client, server_side=True)
            except (OSError, ssl.SSLError):
                client.close()  # a client that refused our certificate
                continue
            broker = socket.create_connection(address)
            for a, b in ((secured, broker), (broker, secured)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], ca_path
    stop.set()
    listener.close()
    thread.join(timeout=10)


def _connects(url: str, broker_ca: Path, var_dir: Path) -> None:
    app = make_celery(url, var_dir, broker_ca=broker_ca)
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=10)
        channel = conn.channel()
        channel.queue_declare("nebula-test-tls", auto_delete=True)
        channel.close()


def test_workers_reach_the_broker_over_tls_with_the_bundles_ca(
    tls_front: tuple[int, Path], tmp_path: Path
) -> None:
    port, broker_ca = tls_front
    credentials = urlsplit(RABBITMQ_URL).netloc.rsplit("@", 1)[0]
    url = f"amqps://{credentials}@localhost:{port}//"
    _connects(url, broker_ca, tmp_path)
    # a broker whose certificate the bundle's CA did not sign is refused
    other_ca, _cert, _key = localhost_certificate(tmp_path, "other")
    with pytest.raises(Exception, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _connects(url, other_ca, tmp_path)
