"""A cluster bundle's manifest: what the control plane hands a cluster host, once.

`nebula clusters bundle NAME --out DIR` writes the folder (workers.bundle); `nebula switch
--bundle DIR` and `nebula worker --bundle DIR` read it. It holds the cluster's name, the
control plane's URL (and the CA of its HTTPS certificate), the platform CA certificate, a
single-use enrollment token for the switch, the worker credential and the broker URL with
the cluster's own broker user. Nothing in it opens the database or any data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MANIFEST = "bundle.json"
CA_FILE = "ca.pem"
CONTROL_PLANE_CA_FILE = "control-plane-ca.pem"
BROKER_CA_FILE = "broker-ca.pem"  # the CA of an amqps:// broker's certificate


@dataclass(frozen=True)
class ClusterBundle:
    """The contents of a bundle folder's manifest."""

    cluster: str
    control_plane_url: str
    worker_credential: str = field(repr=False)
    enrollment_token: str | None = field(default=None, repr=False)
    broker_url: str = field(default="", repr=False)  # empty: the embedded broker
