"""What a cluster process may configure: nothing of the control plane's secrets.

`nebula worker` and `nebula switch` read these instead of the control plane's
`Settings`. There is no field for the database URL or the platform secret, and they
refuse to start when either is set (`control_plane_secrets_set`): removing them from
`os.environ` would still leave them in /proc/PID/environ, readable by the same user and
root for the process's life. `scrub_control_plane_secrets` removes what else is the
control plane's (its data folder), so that no child a cluster process forks sees it.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

CONTROL_PLANE_ONLY = ("NEBULA_DATABASE_URL", "NEBULA_SECRET_KEY", "NEBULA_DATA_DIR")
# a cluster process refuses to start with these in its environment
CONTROL_PLANE_SECRETS = ("NEBULA_DATABASE_URL", "NEBULA_SECRET_KEY")


class ClusterSettings(BaseSettings):
    """A cluster host's configuration (NEBULA_* environment variables)."""

    model_config = SettingsConfigDict(env_prefix="NEBULA_", extra="ignore")

    var_dir: Path = Path("./var")
    broker_url: str = ""  # empty: the embedded filesystem broker under var_dir
    control_plane_url: str = "http://127.0.0.1:8000"
    # a switch without a fresh CRL for this long stops serving (fails closed)
    crl_grace_s: float = 300.0
    log_level: str = "INFO"

    # a switch (`nebula switch`): what it takes from the network before anyone authenticates
    switch_max_connections: int = 1024  # both doors together
    switch_max_connections_per_source: int = 64  # per source IP address
    switch_auth_timeout_s: float = 5.0  # a connection not through its hello by then is closed


def scrub_control_plane_secrets() -> list[str]:
    """Drop the control plane's secrets from this process's environment; returns the names."""
    found = [name for name in CONTROL_PLANE_ONLY if name in os.environ]
    for name in found:
        del os.environ[name]
    return found


def control_plane_secrets_set() -> list[str]:
    """The control plane's secrets set in this process's environment (names only)."""
    return [name for name in CONTROL_PLANE_SECRETS if name in os.environ]
