"""A cluster bundle folder on disk (its manifest is contract.bundle.ClusterBundle).

Files are 0600 in a 0700 folder; the switch keeps its key and certificate there too.
`plan_worker` and `plan_switch` decide, as pure functions, which of the command line,
the bundle, the settings and the state files gives a worker or a switch each setting.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
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


# ------------------------------------------------ where a worker's settings come from


def credential_path(var_dir: Path, cluster: str) -> Path:
    """Where a cluster host keeps its worker credential by default (mode 0600)."""
    return var_dir / "clusters" / cluster / "worker-credential"


def switch_state_path(var_dir: Path, cluster: str) -> Path:
    """Where `nebula switch` writes the worker-facing address of a cluster's switch."""
    return var_dir / "clusters" / cluster / "switch.json"


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT, on loopback) as an address."""
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


@dataclass(frozen=True)
class BundleFolder:
    """A bundle folder as read: its manifest and which optional CA files it holds."""

    folder: Path
    manifest: ClusterBundle
    control_plane_ca: Path | None = None
    broker_ca: Path | None = None


def read_bundle_folder(folder: Path) -> BundleFolder:
    """A bundle folder, checked and read (SystemExit with the reason when it is not one)."""
    return BundleFolder(
        folder=folder,
        manifest=load_bundle(folder),
        control_plane_ca=control_plane_ca(folder),
        broker_ca=broker_ca(folder),
    )


@dataclass(frozen=True)
class WorkerFlags:
    """What `nebula worker` was given on its command line (None: not given)."""

    cluster: str | None = None
    bundle: Path | None = None
    switch: str | None = None  # HOST:PORT
    ca: str | None = None  # the platform CA, with --switch
    control_plane: str | None = None
    control_plane_ca: Path | None = None
    credential_file: Path | None = None
    scratch_dir: Path | None = None


@dataclass(frozen=True)
class WorkerPlan:
    """Where a worker gets each thing it needs; what is left to read is named, not read."""

    cluster: str
    control_plane: str
    control_plane_ca: Path | None
    broker_url: str  # empty: the embedded broker
    broker_ca: Path | None
    scratch_dir: Path  # not yet resolved
    # the switch: given (address and platform CA), or read from the switch's state file
    switch: tuple[str, int] | None
    ca_path: str | Path | None
    switch_state: Path | None  # read worker_address and ca_path here when switch is None
    # the worker credential: the bundle's, or read from credential_file
    credential: str = field(repr=False)
    credential_file: Path | None


class ClusterSetupError(ValueError):
    """The flags, bundle and settings do not say enough to start a worker or a switch."""


def plan_worker(
    flags: WorkerFlags,
    *,
    bundle: BundleFolder | None,
    var_dir: Path,
    broker_url: str,
    control_plane_url: str,
) -> WorkerPlan:
    """Which of the flags, the bundle, the settings and the state files gives each setting.

    A flag wins, then the bundle, then the settings (NEBULA_*), then the files a local
    `nebula switch` left under var_dir. Two exceptions, both so that a bundle's cluster
    gets that cluster's secrets only: with a bundle, its cluster and worker credential
    win over --cluster and --credential-file (the file is read only when the bundle has
    no credential), and the broker is the bundle's when it names one. Pure: the bundle
    comes read, and the files still to read are named in the plan.
    """
    cluster = flags.cluster
    control_plane = flags.control_plane or control_plane_url
    control_plane_ca = flags.control_plane_ca
    credential = ""
    broker_ca_path: Path | None = None
    state_dir = var_dir / "clusters" / (cluster or "")
    if bundle is not None:
        manifest = bundle.manifest
        cluster, credential = manifest.cluster, manifest.worker_credential
        control_plane = flags.control_plane or manifest.control_plane_url
        broker_url = manifest.broker_url or broker_url
        control_plane_ca = control_plane_ca or bundle.control_plane_ca
        broker_ca_path = bundle.broker_ca
        state_dir = bundle.folder  # the bundle's host keeps its state beside it
    if not cluster:
        raise ClusterSetupError("name the cluster with --cluster or --bundle")
    switch: tuple[str, int] | None = None
    ca_path: str | Path | None = None
    switch_state: Path | None = None
    if flags.switch:
        switch = host_port(flags.switch)
        ca_path = flags.ca or (bundle.folder / CA_FILE if bundle is not None else None)
        if ca_path is None:
            raise ClusterSetupError("--switch needs --ca (the platform CA) or --bundle")
    else:
        switch_state = state_dir / "switch.json"
    credential_file = None
    if not credential:
        credential_file = flags.credential_file or credential_path(var_dir, cluster)
    return WorkerPlan(
        cluster=cluster,
        control_plane=control_plane,
        control_plane_ca=control_plane_ca,
        broker_url=broker_url,
        broker_ca=broker_ca_path,
        scratch_dir=flags.scratch_dir or state_dir / "scratch",
        switch=switch,
        ca_path=ca_path,
        switch_state=switch_state,
        credential=credential,
        credential_file=credential_file,
    )


@dataclass(frozen=True)
class SwitchFlags:
    """What `nebula switch` was given on its command line (None: not given)."""

    cluster: str | None = None
    bundle: Path | None = None
    control_plane: str | None = None
    control_plane_ca: Path | None = None
    enroll_token: str | None = field(default=None, repr=False)
    state_dir: Path | None = None
    credential_file: Path | None = None


@dataclass(frozen=True)
class SwitchPlan:
    """Where a switch gets each thing it needs; the credential file is named, not read."""

    cluster: str
    folder: Path  # where the switch keeps its key, certificate and state
    control_plane: str
    control_plane_ca: Path | None
    enroll_token: str | None = field(repr=False)
    credential_file: Path | None  # read first: its credential wins
    credential: str | None = field(repr=False)  # the bundle's, when the file gives none


def plan_switch(
    flags: SwitchFlags, *, bundle: BundleFolder | None, var_dir: Path, control_plane_url: str
) -> SwitchPlan:
    """Which of the flags, the bundle and the settings gives a switch each setting.

    A flag wins, then the bundle, then the settings; with a bundle, its cluster wins over
    --cluster, and the switch keeps its identity beside the bundle unless --state-dir
    says otherwise. Pure, like `plan_worker`.
    """
    cluster = flags.cluster
    control_plane = flags.control_plane or control_plane_url
    folder, enroll_token = flags.state_dir, flags.enroll_token
    control_plane_ca = flags.control_plane_ca
    credential: str | None = None
    if bundle is not None:
        manifest = bundle.manifest
        credential = manifest.worker_credential
        cluster = manifest.cluster
        control_plane = flags.control_plane or manifest.control_plane_url
        folder = folder or bundle.folder
        enroll_token = enroll_token or manifest.enrollment_token
        control_plane_ca = control_plane_ca or bundle.control_plane_ca
    if not cluster:
        raise ClusterSetupError("name the cluster with --cluster or --bundle")
    return SwitchPlan(
        cluster=cluster,
        folder=folder or var_dir / "clusters" / cluster,
        control_plane=control_plane,
        control_plane_ca=control_plane_ca,
        enroll_token=enroll_token,
        credential_file=flags.credential_file,
        credential=credential,
    )
