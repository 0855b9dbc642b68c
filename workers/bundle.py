"""A cluster bundle folder on disk (its manifest is contract.bundle.ClusterBundle).

Files are 0600 in a 0700 folder; the switch keeps its key and certificate there too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from common.private_files import make_private_folder, write_private_file
from contract.bundle import (
    BROKER_CA_FILE,
    CA_FILE,
    CONTROL_PLANE_CA_FILE,
    MANIFEST,
    ClusterBundle,
)


def write_bundle(
    bundle: ClusterBundle,
    folder: Path,
    *,
    ca_pem: bytes,
    control_plane_ca_pem: bytes | None,
    broker_ca_pem: bytes | None = None,
) -> None:
    """Write the bundle into `folder`, a new one made with mode 0700.

    FileExistsError when anything is there already: a folder someone else made (or a link
    to one) could be read by them, or have links planted in it.
    """
    make_private_folder(folder)
    write_private_file(folder / MANIFEST, json.dumps(asdict(bundle), indent=2).encode())
    write_private_file(folder / CA_FILE, ca_pem)
    if control_plane_ca_pem is not None:
        write_private_file(folder / CONTROL_PLANE_CA_FILE, control_plane_ca_pem)
    if broker_ca_pem is not None:
        write_private_file(folder / BROKER_CA_FILE, broker_ca_pem)


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_folder(folder: Path) -> None:
    """SystemExit naming what is wrong, and the command that fixes it, unless the folder and
    its files belong to this process's user and no one else may read them."""
    import os
    import stat

    uid = os.geteuid()
    me = _owner(uid)
    try:
        # the folder and what the bundle and the switch keep secret in it; workers' scratch
        # folders and the like have owners and modes of their own
        secret = (MANIFEST, CA_FILE, CONTROL_PLANE_CA_FILE, BROKER_CA_FILE, "switch.key")
        entries = [folder, *(folder / n for n in secret if (folder / n).exists())]
    except FileNotFoundError:
        raise SystemExit(f"no bundle folder at {folder}") from None
    except PermissionError:
        info = folder.stat()
        raise SystemExit(
            f"{folder} belongs to {_owner(info.st_uid)} (mode {stat.S_IMODE(info.st_mode):04o}) "
            f"and {me} cannot read it: as root, chown -R {me}: {folder} && "
            f"chmod 0700 {folder}"
        ) from None
    for path in entries:
        info = path.lstat()
        if uid != 0 and info.st_uid != uid:
            raise SystemExit(
                f"{path} belongs to {_owner(info.st_uid)}, not to {me} who runs this: "
                f"as root, chown -R {me}: {folder}"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            want = "0700" if path.is_dir() else "0600"
            raise SystemExit(
                f"{path} has mode {mode:04o}: others may read the cluster's secrets; "
                f"chmod {want} {path}"
                + (f" (and 0600 each file in it: chmod 0600 {folder}/*)" if path == folder else "")
            )


def load_bundle(folder: Path) -> ClusterBundle:
    """Read a bundle folder; SystemExit with the reason when it is not one, or when its owner
    or mode would let another user read it (or keep this one from reading it)."""
    check_folder(folder)
    known = {f.name for f in fields(ClusterBundle)}
    try:
        raw = json.loads((folder / MANIFEST).read_text())
        return ClusterBundle(**{k: raw[k] for k in raw if k in known})
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"{folder} is not a cluster bundle: {exc}") from None


def control_plane_ca(folder: Path) -> Path | None:
    """The CA of the control plane's HTTPS certificate, when the bundle has one."""
    path = folder / CONTROL_PLANE_CA_FILE
    return path if path.exists() else None


def broker_ca(folder: Path) -> Path | None:
    """The CA of the broker's TLS certificate (amqps://), when the bundle has one."""
    path = folder / BROKER_CA_FILE
    return path if path.exists() else None
