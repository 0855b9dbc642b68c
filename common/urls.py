"""Which hosts are this machine, and http(s) URLs that carry secrets: plain http only to
loopback. The control plane and the clusters check their URLs with the same rule."""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (localhost, 127/8, ::1)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def http_url(url: str, *, why_https: str) -> SplitResult:
    """`url` split, once it is http(s)://HOST... and https unless HOST is loopback;
    ValueError otherwise, with `why_https` saying what plain http would expose."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s)://HOST URL: {url!r}")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"refusing plain http to {parts.hostname}: {why_https}")
    return parts
