"""The contract between the control plane and the clusters: pure, and what both sides read."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from contract.codec_spec import (
    PARAMETER,
    CastSpec,
    ErrorFeedbackSpec,
    Int8Spec,
    LowRankSpec,
    SpecError,
    check_stream_spec,
    parse_codec_spec,
)
from contract.kinds import KINDS, AbnetJobConfig, ElectraJobConfig
from contract.presets import ABNET_PRESETS, ELECTRA_PRESETS

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import contract.bundle, contract.certs, contract.cluster_api, contract.codec_spec
import contract.fields, contract.jobtoken, contract.kinds, contract.model_limits
import contract.presets, contract.queues, contract.text
heavy = ("torch", "numpy", "sqlalchemy", "fastapi", "httpx", "celery", "app", "workers", "cli")
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def test_importing_the_whole_contract_loads_nothing_of_either_side() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "", done.stdout


def test_the_codec_grammar_gives_plain_values() -> None:
    assert parse_codec_spec("fp16") == CastSpec("fp16")
    assert parse_codec_spec("FP32") == CastSpec("none")
    assert parse_codec_spec("int8(stochastic=true,seed=3)") == Int8Spec(stochastic=True, seed=3)
    assert parse_codec_spec("ef(fp16(lowrank(0.25,method=power,oversample=2)))") == (
        ErrorFeedbackSpec(LowRankSpec(0.25, CastSpec("fp16"), method="power", oversample=2))
    )
    # a bare lowrank sends float32 factors; the method's oversampling is the cluster's default
    assert parse_codec_spec("lowrank(1)") == LowRankSpec(1.0, CastSpec("none"))


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "empty codec spec"),
        ("lowrank(2)", "lowrank ratio must be in (0, 1]"),
        ("ef(ef(int8))", "ef must be the outermost codec"),
        ("int8(fp16)", "int8 can only wrap one lowrank"),
        ("lowrank(0.5,method=qr)", "method must be one of svd, rsvd, power"),
        ("lowrank(0.5,colour=red)", "unknown option(s) colour"),
        ("zip", "unknown codec 'zip'"),
        ("x" * 600, "longer than 512"),
    ],
)
def test_the_codec_grammar_says_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_codec_spec(spec)
    assert says in str(caught.value)


def test_a_job_config_knows_its_length_from_the_presets() -> None:
    assert ElectraJobConfig().total_steps() == ELECTRA_PRESETS["tiny"]["steps"]
    assert ElectraJobConfig(preset="paper", steps=7).total_steps() == 7
    assert AbnetJobConfig(preset="paper").total_steps() == ABNET_PRESETS["paper"]["steps"]
    values = AbnetJobConfig(backward_codec="bf16", forward_codec="auto").training_values()
    assert values["backward_codec"] == "bf16" and values["forward_codec"] == "auto"
    assert values["steps"] == 250
    # ABNet's streams are per sample: error feedback is refused there, allowed elsewhere
    with pytest.raises(ValueError, match="per-sample stream"):
        AbnetJobConfig(backward_codec="ef(int8)")
    assert check_stream_spec("ef(int8)", "weight deltas", PARAMETER) == ErrorFeedbackSpec(
        Int8Spec()
    )


def test_electras_max_lag_is_an_integer_or_auto() -> None:
    assert ElectraJobConfig().overrides() == {}  # the preset's (2) unless the job says
    assert ElectraJobConfig(max_lag="auto").training_values()["max_lag"] == "auto"
    assert ElectraJobConfig(max_lag=3).training_values()["max_lag"] == 3
    for bad in (0, 65, "fast", "3", 2.5):
        with pytest.raises(ValueError, match="max_lag"):
            ElectraJobConfig(max_lag=bad)


def test_abnets_schedule_is_sync_unless_the_job_asks_for_stale1() -> None:
    assert "schedule" not in AbnetJobConfig().overrides()  # AbnetConfig's default: sync
    assert AbnetJobConfig(schedule="stale1").training_values()["schedule"] == "stale1"
    for bad in ("stale2", "async", 1, ""):
        with pytest.raises(ValueError, match="schedule"):
            AbnetJobConfig(schedule=bad)


def test_every_kind_names_roles_that_exist() -> None:
    for kind in KINDS.values():
        assert kind.primary_role in kind.roles
        assert set(kind.apart) <= set(kind.roles)
        for role in kind.roles.values():
            assert role.peer in kind.roles
            assert set(role.reads) <= set(kind.inputs) | set(kind.optional_inputs)


def _import_rules() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def _rule(rule_id: str) -> dict:
    return next(c for c in _import_rules()["contracts"] if c.get("id") == rule_id)


def _cluster_side_parts() -> set[str]:
    return {
        f"workers.{p.stem}"
        for p in (REPO / "workers").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }


def test_the_codecs_contract_names_every_other_part_of_the_cluster_side() -> None:
    # import-linter cannot forbid a package's own parent, so the codecs' contract lists the
    # cluster side's modules one by one: a new module must join the list
    codecs = _rule("codecs")
    assert codecs["source_modules"] == ["workers.compression"]
    others = set(_import_rules()["root_packages"]) - {"workers", "contract"}
    assert set(codecs["forbidden_modules"]) == (_cluster_side_parts() - {"workers.compression"}) | (
        others
    )


def test_the_two_sides_and_the_shared_packages_are_barred_from_each_other() -> None:
    roots = set(_import_rules()["root_packages"])
    assert roots == {"app", "cli", "common", "contract", "workers"}
    # the contract: pure data, known to all, knowing none
    contract = _rule("contract")
    assert contract["source_modules"] == ["contract"]
    assert roots - {"contract"} <= set(contract["forbidden_modules"])
    assert {"torch", "sqlalchemy", "fastapi", "httpx", "celery"} <= set(
        contract["forbidden_modules"]
    )
    # the neutral package: used by both sides and the command, importing none of them
    assert _rule("common")["source_modules"] == ["common"]
    assert {"app", "cli", "workers"} <= set(_rule("common")["forbidden_modules"])
    # the whole of each side is barred from the whole of the other, and from the command
    assert _rule("control-plane")["source_modules"] == ["app"]
    assert {"workers", "cli", "torch"} <= set(_rule("control-plane")["forbidden_modules"])
    assert _rule("cluster-side")["source_modules"] == ["workers"]
    assert {"app", "cli"} <= set(_rule("cluster-side")["forbidden_modules"])


def test_the_switch_contract_bars_the_control_plane_client_and_the_model() -> None:
    switch = _rule("switch")
    assert switch["source_modules"] == ["workers.switch"]
    assert {
        "workers.control_plane",  # the client of the cluster API
        "workers.presence",  # which reports through it
        "workers.switch_agent",  # which joins the switch to it
        "workers.training",
        "workers.compression",
    } <= set(switch["forbidden_modules"])


def test_every_domain_is_layered_and_its_services_speak_no_http() -> None:
    layers = _rule("domain-layers")
    assert layers["type"] == "layers"
    assert layers["containers"] == ["app.*"]  # every domain, new ones included
    assert [name.strip("()") for name in layers["layers"]] == ["routes", "service", "models"]
    for rule_id, forbidden in (
        ("services-without-http", {"fastapi", "starlette"}),
        ("services-without-celery", {"celery"}),
    ):
        rule = _rule(rule_id)
        assert rule["source_modules"] == ["app.*.service"]
        assert forbidden <= set(rule["forbidden_modules"])
        assert not rule.get("allow_indirect_imports", False)  # nor through what they import


def test_presets_hold_fields_of_the_training_configs() -> None:
    pytest.importorskip("torch")
    from workers.training.abnet import AbnetConfig, abnet_preset
    from workers.training.electra import ElectraConfig, electra_preset

    for presets, make, config in (
        (ELECTRA_PRESETS, electra_preset, ElectraConfig),
        (ABNET_PRESETS, abnet_preset, AbnetConfig),
    ):
        names = {f.name for f in fields(config)}
        for name, values in presets.items():
            assert set(values) <= names, (name, set(values) - names)
            built = asdict(make(name))
            assert {k: built[k] for k in values} == values
        # `tiny` states the defaults: the control plane's lengths are the cluster's
        defaults = asdict(config())
        assert {k: defaults[k] for k in presets["tiny"]} == presets["tiny"]
