"""What a cluster host is given: its bundle, made on the control plane.

A cluster's broker password is derived from the platform secret, the cluster's id and its
password generation: writing a bundle again gives every host of the cluster the password
it already has, and only `rotate` (a new generation) changes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import keyring
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters import broker
from app.clusters import service as clusters
from app.clusters.models import Cluster, ClusterPresence
from app.pki import service as pki
from app.settings import Settings
from common.urls import is_loopback
from contract.bundle import ClusterBundle

OK, MISSING = "ok", "missing"


class SharedBrokerRefused(broker.BrokerError):
    """A remote cluster would be handed the control plane's own broker identity."""


class PlainBrokerRefused(broker.BrokerError):
    """A cluster's broker password would cross the network in clear."""


def broker_password(settings: Settings, cluster: Cluster) -> str:
    """The cluster's broker password at its current generation (hex: never an option)."""
    key = keyring.subkey(settings, keyring.Purpose.broker_passwords)
    message = f"{cluster.id}/{cluster.broker_generation}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:48]


def fix_command(cluster: str) -> str:
    """What an operator runs, as the control plane's service user, to make the user."""
    return f"nebula clusters broker-user {cluster}"


def ensure_broker_user(db: Session, settings: Settings, *, actor: Actor, cluster: Cluster) -> str:
    """Make sure the cluster's broker user exists with its derived password; its password.

    A login with the password shows whether the user is already there (made before, by
    this or by root); otherwise `rabbitmqctl` makes it here, and where that fails the
    BrokerError names the one command for root to run. The outcome is kept on the
    cluster (GET /clusters shows it) and audited; BrokerError says why and what to run.
    """
    target = broker.target_for(settings.broker_url, settings.cluster_broker_url)
    password = broker_password(settings, cluster)
    here = broker.target_for(settings.broker_url)
    login = broker.url_with_credentials(here, broker.user_for(cluster.name), password)
    if broker.logs_in(login):  # made before, by this or by root: nothing to change
        _mark(db, actor=actor, cluster=cluster, state=OK, reason=None)
        return password
    try:
        broker.ensure_cluster_user(target, cluster.name, password)
    except broker.BrokerError as exc:
        if not broker.logs_in(login):
            problem = (
                f"no broker user for cluster {cluster.name}: {exc}. Run this as root on the "
                f"broker host: {broker.root_command(target, cluster.name, password)}"
            )
            _mark(db, actor=actor, cluster=cluster, state=MISSING, reason=str(exc))
            raise broker.BrokerError(problem) from None
    _mark(db, actor=actor, cluster=cluster, state=OK, reason=None)
    return password


def _mark(db: Session, *, actor: Actor, cluster: Cluster, state: str, reason: str | None) -> None:
    problem = None
    if reason is not None:
        # the password never goes into the database or the audit log: the fix names the
        # command that prints the root command
        problem = f"{reason[:700]}; run `{fix_command(cluster.name)}` on the control plane"
    if cluster.broker_user == state and cluster.broker_problem == problem:
        return
    cluster.broker_user, cluster.broker_problem = state, problem
    audit.record(
        db,
        actor=actor,
        action="cluster.broker_user",
        subject=cluster,
        outcome="success" if state == OK else "failure",
        details={"name": cluster.name, "broker_user": state, "problem": problem},
    )


def provision_broker_user(
    db: Session, settings: Settings, *, actor: Actor, cluster: Cluster
) -> None:
    """Give a newly registered cluster its broker user, when the broker is RabbitMQ here.

    A failure is not hidden: the cluster is marked "missing" with the reason and the fix,
    which the response, GET /clusters and the audit log show."""
    if not broker.is_rabbitmq(settings.broker_url):
        return
    with contextlib.suppress(broker.BrokerError):  # marked on the cluster and audited
        ensure_broker_user(db, settings, actor=actor, cluster=cluster)


def rotate_broker_password(db: Session, *, actor: Actor, cluster: Cluster) -> list[str]:
    """Move the cluster to its next broker password; the hosts seen running its switch or
    workers (each must get the new bundle, or fail at its next broker login)."""
    cluster.broker_generation += 1
    hosts = sorted(
        {
            f"{instance.split(':', 1)[0]} ({kind})"
            for kind, instance in db.execute(
                select(ClusterPresence.kind, ClusterPresence.instance).where(
                    ClusterPresence.cluster_id == cluster.id
                )
            )
        }
    )
    audit.record(
        db,
        actor=actor,
        action="cluster.broker_password_rotate",
        subject=cluster,
        details={"name": cluster.name, "generation": cluster.broker_generation, "hosts": hosts},
    )
    return hosts


def broker_url_for(
    db: Session,
    settings: Settings,
    *,
    actor: Actor,
    cluster: Cluster,
    reached_at: str = "",
    allow_shared: bool = False,
    allow_plain: bool = False,
) -> str:
    """The broker URL a cluster's workers use: its own user on RabbitMQ (made now, with the
    password it already had), else the control plane's own URL.

    Redis and the embedded broker have no users: a remote cluster would be handed the
    control plane's broker identity, refused unless `allow_shared`. A cluster URL in clear
    (amqp://) to a host other than loopback is refused unless `allow_plain`: use amqps://.
    `reached_at` is the broker's address as this cluster sees it (default: the setting).
    """
    reached_at = reached_at or settings.cluster_broker_url
    if not broker.is_rabbitmq(settings.broker_url):
        if not allow_shared and not is_loopback(cluster.switch_host):
            raise SharedBrokerRefused(
                f"the broker ({settings.broker_url.split(':', 1)[0] or 'embedded'}) has no "
                f"per-cluster users, so cluster {cluster.name} at {cluster.switch_host} would "
                "get the control plane's own broker identity; use RabbitMQ "
                "(NEBULA_BROKER_URL=amqps://...), or pass --insecure-shared-broker"
            )
        return reached_at or settings.broker_url
    target = broker.target_for(settings.broker_url, reached_at)
    if broker.plain_off_loopback(target.cluster_url) and not allow_plain:
        raise PlainBrokerRefused(
            f"cluster {cluster.name} would reach the broker at {target.cluster_url} without "
            "TLS, its password in clear: give --broker-url amqps://HOST:5671/VHOST with "
            "--broker-ca, or pass --insecure-plain-broker"
        )
    password = ensure_broker_user(db, settings, actor=actor, cluster=cluster)
    return broker.url_with_credentials(target, broker.user_for(cluster.name), password)


@dataclass(frozen=True)
class BrokerChoice:
    """How a bundle's broker URL is chosen (`nebula clusters bundle` options)."""

    reached_at: str = ""
    allow_shared: bool = False
    allow_plain: bool = False


def make_bundle(
    db: Session,
    *,
    actor: Actor,
    cluster: Cluster,
    settings: Settings,
    control_plane_url: str,
    enroll_ttl: timedelta,
    broker_choice: BrokerChoice | None = None,
) -> tuple[ClusterBundle, bytes]:
    """A fresh bundle for `cluster` (new enrollment token, worker credential; the broker
    password it already had) and the platform CA certificate; the caller commits and
    writes it."""
    choice = broker_choice or BrokerChoice()
    broker_url = broker_url_for(
        db,
        settings,
        actor=actor,
        cluster=cluster,
        reached_at=choice.reached_at,
        allow_shared=choice.allow_shared,
        allow_plain=choice.allow_plain,
    )
    _row, token = pki.create_enrollment_token(db, actor=actor, cluster=cluster, ttl=enroll_ttl)
    _cred, credential = clusters.create_worker_credential(db, actor=actor, cluster=cluster)
    bundle = ClusterBundle(
        cluster=cluster.name,
        control_plane_url=control_plane_url,
        worker_credential=credential,
        enrollment_token=token,
        broker_url=broker_url,
    )
    return bundle, pki.platform_keys(db, settings).ca_pem
