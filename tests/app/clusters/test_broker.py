"""Per-cluster RabbitMQ users: each consumes its own queue and nothing else (a real broker)."""

from __future__ import annotations

import uuid

import pytest
from amqp.exceptions import AccessRefused
from kombu import Connection, Exchange, Queue
from kombu.exceptions import OperationalError

from app.clusters import broker
from contract.queues import queue_for
from support.services import RABBITMQ_URL

pytestmark = pytest.mark.services


def _refused() -> pytest.RaisesContext[Exception]:
    """The broker's 403, however the client library wraps it."""
    return pytest.raises((AccessRefused, OperationalError), match=r"ACCESS_REFUSED|403")


def _clusters_on(vhost: str) -> tuple[broker.BrokerTarget, dict[str, str]]:
    target = broker.target_for(f"{RABBITMQ_URL}/{vhost}")
    suffix = uuid.uuid4().hex[:6]
    names = {side: f"{side}-{suffix}" for side in ("a", "b")}
    urls = {
        side: broker.url_with_credentials(
            target, broker.user_for(name), broker.ensure_cluster_user(target, name)
        )
        for side, name in names.items()
    }
    return target, {**{f"{s}.name": n for s, n in names.items()}, **urls}


def _publish(vhost: str, cluster: str, body: str) -> None:
    """What the control plane does: declare the cluster's queue and send it a task."""
    name = queue_for(cluster)
    with Connection(f"{RABBITMQ_URL}/{vhost}") as conn:
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
        with conn.Producer() as producer:
            producer.publish(body, exchange=queue.exchange, routing_key=name, declare=[queue])


def test_a_clusters_user_reads_its_own_queue_and_is_refused_on_another(vhost: str) -> None:
    _target, sites = _clusters_on(vhost)
    a, b = sites["a.name"], sites["b.name"]
    try:
        _publish(vhost, a, "for a")
        _publish(vhost, b, "for b")
        with Connection(sites["a"]) as conn:
            own = conn.SimpleQueue(queue_for(a))
            message = own.get(timeout=10)
            assert message.payload == "for a"
            message.ack()
            own.close()
        with (
            Connection(sites["a"]) as conn,
            _refused(),
        ):
            conn.SimpleQueue(queue_for(b)).get(timeout=5)
        # nor may it publish anywhere but its own queue's exchange
        with (
            Connection(sites["a"]) as conn,
            _refused(),
        ):
            exchange = Exchange(queue_for(b), type="direct")
            with conn.Producer() as producer:
                producer.publish(
                    "forged", exchange=exchange, routing_key=queue_for(b), declare=[exchange]
                )
                conn.drain_events(timeout=2)
        # b's task is still there for b
        with Connection(sites["b"]) as conn:
            theirs = conn.SimpleQueue(queue_for(b))
            assert theirs.get(timeout=10).payload == "for b"
            theirs.close()
    finally:
        for cluster in (a, b):
            broker.delete_cluster_user(cluster)


def test_a_bad_password_or_a_deleted_user_is_refused(vhost: str) -> None:
    target, sites = _clusters_on(vhost)
    a = sites["a.name"]
    wrong = broker.url_with_credentials(target, broker.user_for(a), "not-the-password")
    with (
        Connection(wrong, connect_timeout=5) as conn,
        _refused(),
    ):
        conn.ensure_connection(max_retries=1)
    broker.delete_cluster_user(a)
    with (
        Connection(sites["a"], connect_timeout=5) as conn,
        _refused(),
    ):
        conn.ensure_connection(max_retries=1)
    broker.delete_cluster_user(sites["b.name"])


def test_permission_patterns_name_exactly_one_queue() -> None:
    assert broker.queue_pattern("east-1") == r"^cluster\.east\-1$"
    target = broker.target_for("amqp://cp:secret@10.0.0.1:5672/nebula", "amqp://broker.site:5672/x")
    assert target.vhost == "nebula"
    assert broker.url_with_credentials(target, "nebula-cluster-a", "p@ss/word") == (
        "amqp://nebula-cluster-a:p%40ss%2Fword@broker.site:5672/x"
    )


def test_broker_passwords_never_look_like_an_option(vhost: str) -> None:
    target = broker.target_for(f"{RABBITMQ_URL}/{vhost}")
    name = f"opt-{uuid.uuid4().hex[:6]}"
    try:
        passwords = [broker.ensure_cluster_user(target, name) for _ in range(3)]
    finally:
        broker.delete_cluster_user(name)
    assert all(p[0].isalnum() and len(p) >= 32 for p in passwords)
