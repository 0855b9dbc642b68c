"""Which of the flags, the bundle, the settings and the state files gives a worker or a switch
each setting.

`plan_worker` and `plan_switch` as tables, no files: each row is a command line, a bundle
(or none) and the settings, and what the process ends up with. The bundle folder's own checks (owner, mode)
are tests/workers/test_bundle_folder.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.bundle import ClusterBundle
from workers.bundle import (
    BundleFolder,
    ClusterSetupError,
    SwitchFlags,
    WorkerFlags,
    credential_path,
    host_port,
    plan_switch,
    plan_worker,
)

VAR = Path("/var/lib/nebula")
BUNDLE_DIR = Path("/etc/nebula/bundle-a")
SETTINGS = {"broker_url": "redis://settings/0", "control_plane_url": "https://settings.example"}


def bundle(
    *,
    credential: str = "nbw_bundle",
    broker_url: str = "amqps://a@broker.example/",
    control_plane_ca: bool = True,
    broker_ca: bool = True,
) -> BundleFolder:
    """Cluster a's bundle folder as read."""
    return BundleFolder(
        folder=BUNDLE_DIR,
        manifest=ClusterBundle(
            cluster="a",
            control_plane_url="https://bundle.example",
            worker_credential=credential,
            enrollment_token="nbe_bundle",
            broker_url=broker_url,
        ),
        control_plane_ca=BUNDLE_DIR / "control-plane-ca.pem" if control_plane_ca else None,
        broker_ca=BUNDLE_DIR / "broker-ca.pem" if broker_ca else None,
    )


STATE_A = VAR / "clusters" / "a"

# (case, flags, bundle, what the plan holds: only the fields that row is about)
TABLE: list[tuple[str, WorkerFlags, BundleFolder | None, dict[str, Any]]] = [
    (
        "flags and settings alone: the local switch's state and the default credential file",
        WorkerFlags(cluster="a"),
        None,
        {
            "cluster": "a",
            "control_plane": "https://settings.example",
            "control_plane_ca": None,
            "broker_url": "redis://settings/0",
            "broker_ca": None,
            "switch": None,
            "ca_path": None,
            "switch_state": STATE_A / "switch.json",
            "credential": "",
            "credential_file": credential_path(VAR, "a"),
            "scratch_dir": STATE_A / "scratch",
        },
    ),
    (
        "flags win over the settings",
        WorkerFlags(
            cluster="a",
            control_plane="https://flag.example",
            control_plane_ca=Path("/flag/ca.pem"),
            credential_file=Path("/flag/credential"),
            scratch_dir=Path("/scratch"),
        ),
        None,
        {
            "control_plane": "https://flag.example",
            "control_plane_ca": Path("/flag/ca.pem"),
            "credential_file": Path("/flag/credential"),
            "scratch_dir": Path("/scratch"),
        },
    ),
    (
        "a given switch needs no state file",
        WorkerFlags(cluster="a", switch="10.0.0.5:7201", ca="/flag/platform-ca.pem"),
        None,
        {"switch": ("10.0.0.5", 7201), "ca_path": "/flag/platform-ca.pem", "switch_state": None},
    ),
    (
        "a switch port alone is on loopback",
        WorkerFlags(cluster="a", switch=":7201", ca="/ca.pem"),
        None,
        {"switch": ("127.0.0.1", 7201)},
    ),
    (
        "the bundle over the settings, its folder holding the state",
        WorkerFlags(bundle=BUNDLE_DIR),
        bundle(),
        {
            "cluster": "a",
            "control_plane": "https://bundle.example",
            "control_plane_ca": BUNDLE_DIR / "control-plane-ca.pem",
            "broker_url": "amqps://a@broker.example/",
            "broker_ca": BUNDLE_DIR / "broker-ca.pem",
            "switch_state": BUNDLE_DIR / "switch.json",
            "credential": "nbw_bundle",
            "credential_file": None,
            "scratch_dir": BUNDLE_DIR / "scratch",
        },
    ),
    (
        "the bundle's cluster and credential over --cluster and --credential-file",
        WorkerFlags(cluster="b", bundle=BUNDLE_DIR, credential_file=Path("/flag/credential")),
        bundle(),
        {"cluster": "a", "credential": "nbw_bundle", "credential_file": None},
    ),
    (
        "flags over the bundle: the control plane and its CA",
        WorkerFlags(
            bundle=BUNDLE_DIR,
            control_plane="https://flag.example",
            control_plane_ca=Path("/flag/ca.pem"),
        ),
        bundle(),
        {"control_plane": "https://flag.example", "control_plane_ca": Path("/flag/ca.pem")},
    ),
    (
        "a bundle without a credential: the credential file is read",
        WorkerFlags(bundle=BUNDLE_DIR, credential_file=Path("/flag/credential")),
        bundle(credential=""),
        {"credential": "", "credential_file": Path("/flag/credential")},
    ),
    (
        "a bundle without a credential or flag: the host's default file",
        WorkerFlags(bundle=BUNDLE_DIR),
        bundle(credential=""),
        {"credential_file": credential_path(VAR, "a")},
    ),
    (
        "a bundle naming no broker: the settings' (the embedded broker)",
        WorkerFlags(bundle=BUNDLE_DIR),
        bundle(broker_url="", broker_ca=False, control_plane_ca=False),
        {"broker_url": "redis://settings/0", "broker_ca": None, "control_plane_ca": None},
    ),
    (
        "a bundle and a given switch: the bundle's platform CA",
        WorkerFlags(bundle=BUNDLE_DIR, switch="switch-a:7201"),
        bundle(),
        {"switch": ("switch-a", 7201), "ca_path": BUNDLE_DIR / "ca.pem", "switch_state": None},
    ),
    (
        "a bundle and a given switch and CA: the flag's CA",
        WorkerFlags(bundle=BUNDLE_DIR, switch="switch-a:7201", ca="/flag/ca.pem"),
        bundle(),
        {"ca_path": "/flag/ca.pem"},
    ),
]


@pytest.mark.parametrize(
    ("flags", "folder", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_plan_worker(
    flags: WorkerFlags, folder: BundleFolder | None, expected: dict[str, Any]
) -> None:
    plan = plan_worker(flags, bundle=folder, var_dir=VAR, **SETTINGS)
    assert {name: getattr(plan, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("flags", "folder", "refusal"),
    [
        (WorkerFlags(), None, "name the cluster with --cluster or --bundle"),
        (WorkerFlags(cluster=""), None, "name the cluster with --cluster or --bundle"),
        (
            WorkerFlags(cluster="a", switch="10.0.0.5:7201"),
            None,
            "--switch needs --ca (the platform CA) or --bundle",
        ),
    ],
    ids=["no-cluster", "empty-cluster", "switch-without-ca"],
)
def test_plan_worker_refuses(flags: WorkerFlags, folder: BundleFolder | None, refusal: str) -> None:
    with pytest.raises(ClusterSetupError) as caught:
        plan_worker(flags, bundle=folder, var_dir=VAR, **SETTINGS)
    assert str(caught.value) == refusal


def test_plan_keeps_the_credential_out_of_its_repr() -> None:
    plan = plan_worker(WorkerFlags(bundle=BUNDLE_DIR), bundle=bundle(), var_dir=VAR, **SETTINGS)
    assert "nbw_bundle" not in repr(plan)


@pytest.mark.parametrize(
    ("text", "address"),
    [("h:1", ("h", 1)), (":7201", ("127.0.0.1", 7201)), ("[::1]:80", ("[::1]", 80))],
)
def test_host_port(text: str, address: tuple[str, int]) -> None:
    assert host_port(text) == address


SWITCH_TABLE: list[tuple[str, SwitchFlags, BundleFolder | None, dict[str, Any]]] = [
    (
        "flags and settings alone: the host's folder",
        SwitchFlags(cluster="a", enroll_token="nbe_flag"),
        None,
        {
            "cluster": "a",
            "folder": STATE_A,
            "control_plane": "https://settings.example",
            "control_plane_ca": None,
            "enroll_token": "nbe_flag",
            "credential_file": None,
            "credential": None,
        },
    ),
    (
        "flags win over the settings",
        SwitchFlags(
            cluster="a",
            control_plane="https://flag.example",
            state_dir=Path("/srv/switch"),
            credential_file=Path("/flag/credential"),
        ),
        None,
        {
            "control_plane": "https://flag.example",
            "folder": Path("/srv/switch"),
            "credential_file": Path("/flag/credential"),
        },
    ),
    (
        "the bundle over --cluster and the settings; the switch keeps its identity beside it",
        SwitchFlags(cluster="b", bundle=BUNDLE_DIR),
        bundle(),
        {
            "cluster": "a",
            "folder": BUNDLE_DIR,
            "control_plane": "https://bundle.example",
            "control_plane_ca": BUNDLE_DIR / "control-plane-ca.pem",
            "enroll_token": "nbe_bundle",
            "credential": "nbw_bundle",
        },
    ),
    (
        "flags over the bundle",
        SwitchFlags(
            bundle=BUNDLE_DIR,
            control_plane="https://flag.example",
            control_plane_ca=Path("/flag/ca.pem"),
            enroll_token="nbe_flag",
            state_dir=Path("/srv/switch"),
            credential_file=Path("/flag/credential"),
        ),
        bundle(),
        {
            "control_plane": "https://flag.example",
            "control_plane_ca": Path("/flag/ca.pem"),
            "enroll_token": "nbe_flag",
            "folder": Path("/srv/switch"),
            "credential_file": Path("/flag/credential"),  # read first, the bundle's if empty
            "credential": "nbw_bundle",
        },
    ),
]


@pytest.mark.parametrize(
    ("flags", "folder", "expected"),
    [row[1:] for row in SWITCH_TABLE],
    ids=[row[0] for row in SWITCH_TABLE],
)
def test_plan_switch(
    flags: SwitchFlags, folder: BundleFolder | None, expected: dict[str, Any]
) -> None:
    plan = plan_switch(
        flags, bundle=folder, var_dir=VAR, control_plane_url=SETTINGS["control_plane_url"]
    )
    assert {name: getattr(plan, name) for name in expected} == expected


def test_plan_switch_needs_a_cluster() -> None:
    with pytest.raises(ClusterSetupError, match="name the cluster with --cluster or --bundle"):
        plan_switch(SwitchFlags(), bundle=None, var_dir=VAR, control_plane_url="https://x")
