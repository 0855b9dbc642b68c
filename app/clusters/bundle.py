"""What a cluster host is given: its bundle, made on the control plane."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from app.audit.service import Actor
from app.clusters import broker
from app.clusters import service as clusters
from app.clusters.models import Cluster
from app.pki import service as pki
from app.settings import Settings
from contract.bundle import ClusterBundle

log = logging.getLogger("nebula.clusters")


def broker_url_for(settings: Settings, cluster: str, reached_at: str = "") -> str:
    """The broker URL a cluster's workers use: its own user on RabbitMQ, else the shared URL.

    On RabbitMQ the cluster's user is made (or its password reset) now; Redis and the
    embedded broker have no users, so a single site shares the control plane's URL.
    `reached_at` is the broker's address as this cluster sees it (default: the setting).
    """
    reached_at = reached_at or settings.cluster_broker_url
    if not broker.is_rabbitmq(settings.broker_url):
        return reached_at or settings.broker_url
    target = broker.target_for(settings.broker_url, reached_at)
    password = broker.ensure_cluster_user(target, cluster)
    return broker.url_with_credentials(target, broker.user_for(cluster), password)


def provision_broker_user(settings: Settings, cluster: str) -> None:
    """Give a newly registered cluster its broker user, when the broker is RabbitMQ here."""
    if not broker.is_rabbitmq(settings.broker_url):
        return
    try:
        broker.ensure_cluster_user(
            broker.target_for(settings.broker_url, settings.cluster_broker_url), cluster
        )
    except broker.BrokerError as exc:
        log.warning(
            "no broker user for cluster %s (%s); run `nebula clusters broker-credentials %s` "
            "on the broker host",
            cluster,
            exc,
            cluster,
        )


def make_bundle(
    db: Session,
    *,
    actor: Actor,
    cluster: Cluster,
    settings: Settings,
    control_plane_url: str,
    enroll_ttl: timedelta,
    broker_reached_at: str = "",
) -> tuple[ClusterBundle, bytes]:
    """A fresh bundle for `cluster` (new enrollment token, worker credential, broker
    password) and the platform CA certificate; the caller commits and writes it."""
    _row, token = pki.create_enrollment_token(db, actor=actor, cluster=cluster, ttl=enroll_ttl)
    _cred, credential = clusters.create_worker_credential(db, actor=actor, cluster=cluster)
    bundle = ClusterBundle(
        cluster=cluster.name,
        control_plane_url=control_plane_url,
        worker_credential=credential,
        enrollment_token=token,
        broker_url=broker_url_for(settings, cluster.name, broker_reached_at),
    )
    return bundle, pki.platform_keys(db, settings).ca_pem
