"""The Celery application: one queue per cluster, the broker from Nebula's settings.

The control plane sends with it and the clusters' workers consume with it, so it belongs to
neither; the queue and task names are the contract's (contract/queues.py).

By default the broker is kombu's filesystem transport under the var folder, so a
single machine needs no server (polling tuned as measured in DESIGN.md); set
NEBULA_BROKER_URL=redis://... for a real deployment.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery import Celery
from kombu import Connection


def broker_options(broker_url: str, var_dir: Path) -> tuple[str, dict[str, Any]]:
    """Broker URL and transport options; an empty URL means the embedded broker in var_dir."""
    if broker_url:
        return broker_url, {}
    folder = (var_dir / "broker").resolve()
    # messages carry job tokens: only this account may list or read them
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    for sub in ("queue", "control", "processed"):
        (folder / sub).mkdir(mode=0o700, exist_ok=True)
        (folder / sub).chmod(0o700)
    return "filesystem://", {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "control_folder": str(folder / "control"),
        "processed_folder": str(folder / "processed"),
        "store_processed": False,
        "polling_interval": 0.1,
    }


def broker_check(broker_url: str, var_dir: Path, *, timeout_s: float = 2.0) -> None:
    """Raise unless the broker answers now (a fresh connection, no retries)."""
    url, options = broker_options(broker_url, var_dir)
    if url == "filesystem://":
        folder = Path(options["data_folder_in"])
        if not os.access(folder, os.W_OK):
            raise OSError(f"the embedded broker's folder {folder} is not writable")
        return
    transport = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    with Connection(url, connect_timeout=timeout_s, transport_options=transport) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)
        conn.default_channel  # noqa: B018  (opening a channel is what talks to the server)


def _private_files() -> None:
    """Make every file this process creates from now on 0600 (folders 0700).

    kombu's filesystem transport writes each message (a job token inside) with the
    default mode and has no option for another; the umask is the one place to say it.
    It only ever tightens: bits already masked stay masked.
    """
    previous = os.umask(0o077)
    os.umask(previous | 0o077)


def make_celery(broker_url: str, var_dir: Path, broker_ca: Path | None = None) -> Celery:
    """A Celery app bound to the broker; no result backend (state lives on the control plane).

    `broker_ca`: the CA that signed an amqps:// broker's certificate (a cluster bundle's
    broker-ca.pem); the broker's name is then checked against it."""
    url, options = broker_options(broker_url, var_dir)
    if url == "filesystem://":
        _private_files()
    app = Celery("nebula", broker=url, set_as_current=False)
    if broker_ca is not None and url.startswith("amqps://"):
        import ssl

        app.conf.broker_use_ssl = {
            "ca_certs": str(broker_ca),
            "cert_reqs": ssl.CERT_REQUIRED,
            "server_hostname": urlsplit(url).hostname,
        }
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=False,  # Nebula's reaper restarts roles, not the broker
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue="cluster.default",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        # a cluster's broker user may touch its own queue only: no pidbox, no events
        worker_enable_remote_control=False,
        task_send_sent_event=False,
    )
    app.conf.include = ["workers.tasks"]  # a name the worker imports on start; not imported here
    return app


@lru_cache
def celery_for(var_dir: Path, broker_url: str) -> Celery:
    """One Celery app per broker, cached for the process."""
    return make_celery(broker_url, var_dir)
