"""Per-cluster broker users on RabbitMQ: a cluster may consume its own queue and nothing else.

Each cluster gets the user `nebula-cluster-<name>` on the broker's virtual host, with
configure, write and read rights matching exactly `cluster.<name>` (its queue and the
direct exchange of the same name): it can declare and consume its own queue, and can
neither read another cluster's queue nor publish anywhere else. The control plane keeps
its own broker user. Users are managed with `rabbitmqctl`, which runs on the broker host
(the control plane and the broker share a host, or the admin runs the command there).
The control plane derives each cluster's password from the platform secret and the
cluster's password generation (app.clusters.bundle), so writing a bundle again keeps it.
Where `rabbitmqctl` cannot run here (the service user has no Erlang cookie), the user can
be made by root with the one command `root_command` prints; the control plane then checks
that the password works by logging in with it.
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from common.urls import is_loopback

USER_PREFIX = "nebula-cluster-"


class BrokerError(RuntimeError):
    """The broker could not be told (rabbitmqctl missing, refused, or failed)."""


@dataclass(frozen=True)
class BrokerTarget:
    """Where cluster broker users live: the virtual host, and the URL clusters connect to."""

    vhost: str
    cluster_url: str  # amqp://host:port/vhost, without credentials


def is_rabbitmq(url: str) -> bool:
    """Whether a broker URL names RabbitMQ (AMQP)."""
    return urlsplit(url).scheme in ("amqp", "amqps", "pyamqp")


def target_for(broker_url: str, cluster_broker_url: str = "") -> BrokerTarget:
    """The virtual host of `broker_url` and the URL clusters reach it by (default: the same)."""
    parts = urlsplit(cluster_broker_url or broker_url)
    vhost = unquote(urlsplit(broker_url).path.lstrip("/")) or "/"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return BrokerTarget(
        vhost=vhost, cluster_url=urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    )


def user_for(cluster: str) -> str:
    """The broker user of a cluster."""
    return f"{USER_PREFIX}{cluster}"


def queue_pattern(cluster: str) -> str:
    """The one resource name a cluster's user may touch, as RabbitMQ's permission regex."""
    return f"^{re.escape(f'cluster.{cluster}')}$"


def url_with_credentials(target: BrokerTarget, user: str, password: str) -> str:
    """The cluster's broker URL with its user and password."""
    parts = urlsplit(target.cluster_url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _rabbitmqctl(*args: str) -> str:
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        raise BrokerError("rabbitmqctl is not installed on this host")
    done = subprocess.run(
        [binary, "--quiet", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        # the reason is on stderr, or (refused as the wrong user) the last line of stdout
        said = done.stderr.strip() or (done.stdout.strip().splitlines() or [""])[-1]
        raise BrokerError(f"rabbitmqctl {args[0]} failed: {said[:500]}")
    return done.stdout


def ensure_cluster_user(target: BrokerTarget, cluster: str, password: str | None = None) -> str:
    """Create (or set the password of) the cluster's broker user with its one-queue rights.

    `password` defaults to a fresh random one; the password is returned.
    """
    # hex: a password must not start with "-", which rabbitmqctl would read as an option
    user, password = user_for(cluster), password or secrets.token_hex(24)
    if password.startswith("-"):
        raise ValueError("a broker password may not start with '-'")
    existing = {line.split("\t", 1)[0] for line in _rabbitmqctl("list_users").splitlines()}
    if user in existing:
        _rabbitmqctl("change_password", user, password)
    else:
        _rabbitmqctl("add_user", user, password)
    pattern = queue_pattern(cluster)
    _rabbitmqctl("set_permissions", "-p", target.vhost, user, pattern, pattern, pattern)
    return password


def delete_cluster_user(cluster: str) -> None:
    """Remove the cluster's broker user (its connections are closed by the broker)."""
    _rabbitmqctl("delete_user", user_for(cluster))


def root_command(target: BrokerTarget, cluster: str, password: str) -> str:
    """The one shell command that makes (or resets) the cluster's user, run as root on the
    broker host: what to run instead where this user cannot run `rabbitmqctl`."""
    user, pattern = user_for(cluster), queue_pattern(cluster)
    steps = [
        shlex.join(["rabbitmqctl", "--quiet", "add_user", user, password])
        + " 2>/dev/null || "
        + shlex.join(["rabbitmqctl", "--quiet", "change_password", user, password]),
        shlex.join(
            ["rabbitmqctl", "--quiet", "set_permissions", "-p", target.vhost, user] + [pattern] * 3
        ),
    ]
    return "sh -c " + shlex.quote("; ".join(steps))


def logs_in(broker_url: str, *, timeout_s: float = 5.0) -> bool:
    """Whether the broker accepts this URL's user and password (False when refused)."""
    from kombu import Connection

    try:
        with Connection(broker_url, connect_timeout=timeout_s) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception:  # refused, unreachable: either way the login did not work
        return False
    return True


def plain_off_loopback(url: str) -> bool:
    """Whether the broker URL sends its password in clear to another host (amqp:// not on
    loopback; amqps:// is TLS)."""
    parts = urlsplit(url)
    return parts.scheme in ("amqp", "pyamqp") and not is_loopback(parts.hostname or "127.0.0.1")
