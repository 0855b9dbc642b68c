"""Scenario-I: the split ELECTRA roles against the single-process reference, replicas, resume."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from support.certs import make_pki
from support.switches import start_pair
from workers.switch.link import Link
from workers.switch.shaper import ShaperConfig
from workers.training.electra import (
    ElectraConfig,
    electra_preset,
    export_pretrained,
    load_pretrained,
    parameter_counts,
    run_electra_discriminator,
    run_electra_generator,
    train_electra_local,
)
from workers.training.hooks import Hooks, RoleResult

SEED = 11
LinkPairs = Callable[[str, str], tuple[Link, Link]]
RunRoles = Callable[..., Any]


def small(**overrides: object) -> ElectraConfig:
    """The tiny models on small batches: seconds per test."""
    base: dict[str, object] = dict(steps=20, batch_size=8, ckpt_every=10, warmup_steps=5)
    base.update(overrides)
    return ElectraConfig.tiny(**base)


def split_run(
    run_roles: RunRoles,
    cfg: ElectraConfig,
    connect: LinkPairs,
    lines: list[str],
    root: Path,
    *,
    d_reads_text: bool = False,
    g_hooks: Hooks | None = None,
    d_hooks: Hooks | None = None,
) -> tuple[RoleResult, RoleResult]:
    g_link, d_link = connect("generator", "discriminator")
    out = run_roles(
        lambda: run_electra_generator(cfg, g_link, lines, root / "g", g_hooks, seed=SEED),
        lambda: run_electra_discriminator(
            cfg, d_link, lines if d_reads_text else None, root / "d", d_hooks, seed=SEED
        ),
    )
    return out.a, out.b


def weights_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_split_run_equals_single_process_reference(
    link_pairs: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    cfg = small()
    lines = text_lines[:800]
    g, d = split_run(run_roles, cfg, link_pairs, lines, tmp_path)
    assert (g.last_step, d.last_step) == (20, 20)
    assert g.extra["mode_shared"] == 0.0  # D was given no text: whole sequences crossed

    tok = Tokenizer.from_file(str(tmp_path / "g" / "tokenizer.json"))
    ref = train_electra_local(cfg, lines, seed=SEED, tokenizer=tok)
    for step, (r, hg, hd) in enumerate(zip(ref.history, g.history, d.history, strict=True), 1):
        assert abs(r["mlm_loss"] - hg["mlm_loss"]) <= 1e-6, step
        assert abs(r["rtd_loss"] - hd["rtd_loss"]) <= 1e-6, step
        assert abs(r["rtd_accuracy"] - hd["rtd_accuracy"]) <= 1e-6, step

    assert d.artifact is not None
    trained = load_pretrained(d.artifact.read_bytes())
    assert_same_weights(weights_of(trained.discriminator), weights_of(ref.discriminator.model))
    g_ckpt = load_file(str(tmp_path / "g" / "step-00000020.safetensors"))
    g_weights = {k[len("model.") :]: v for k, v in g_ckpt.items() if k.startswith("model.")}
    assert_same_weights(g_weights, weights_of(ref.generator.model))


def test_shared_text_sends_only_replaced_positions_and_trains_the_same(
    local_links: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    cfg = small(steps=6, batch_size=16)
    lines = text_lines[:800]
    g_full, d_full = split_run(run_roles, cfg, local_links, lines, tmp_path / "full")
    # same tokenizer for both runs: the shared-mode generator reuses the saved one
    (tmp_path / "shared" / "g").mkdir(parents=True)
    tok_json = (tmp_path / "full" / "g" / "tokenizer.json").read_text()
    (tmp_path / "shared" / "g" / "tokenizer.json").write_text(tok_json)
    g_shared, d_shared = split_run(
        run_roles, cfg, local_links, lines, tmp_path / "shared", d_reads_text=True
    )

    assert g_shared.extra["mode_shared"] == 1.0
    # D rebuilt the same corrupted batches from its own copy of the text
    for a, b in zip(d_full.history, d_shared.history, strict=True):
        assert a["rtd_loss"] == b["rtd_loss"]
    full = sum(h["bytes_to_discriminator"] for h in g_full.history)
    shared = sum(h["bytes_to_discriminator"] for h in g_shared.history)
    every_id_as_int64 = cfg.steps * cfg.batch_size * cfg.seq_len * 8
    assert full < every_id_as_int64 / 3  # uint16 ids and one bit per label
    assert shared < every_id_as_int64 / 9  # the "about 9 times fewer bytes"
    # D answers with one small sync tensor per step
    assert all(h["bytes_to_generator"] <= 32 for h in d_full.history)


def test_two_discriminator_replicas_stay_identical(
    local_links: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    cfg = small(steps=6, n_discriminators=2, ckpt_every=3)
    g, d = split_run(run_roles, cfg, local_links, text_lines[:800], tmp_path, d_reads_text=True)
    assert (g.last_step, d.last_step) == (6, 6)
    assert d.extra["replica_max_abs_diff"] == 0.0
    assert all(torch.isfinite(torch.tensor(h["rtd_loss"])) for h in d.history)
    ckpt = load_file(str(tmp_path / "d" / "step-00000006.safetensors"))
    assert {"rng.dropout.rank0", "rng.dropout.rank1"} <= ckpt.keys()


def auto_over_delay(
    run_roles: RunRoles, cfg: ElectraConfig, lines: list[str], root: Path, delay_ms: float
) -> tuple[RoleResult, RoleResult]:
    """G and D through two real switches whose link the shaper delays `delay_ms` one way."""
    switches = start_pair(
        make_pki(root / "pki", "Training test CA"),
        shaper=ShaperConfig(rate_mbit=None, delay_ms=delay_ms),
    )
    g_link, d_link = switches.link_pair("job-auto", "generator", "discriminator")
    try:
        out = run_roles(
            lambda: run_electra_generator(cfg, g_link, lines, root / "g", seed=SEED),
            lambda: run_electra_discriminator(cfg, d_link, None, root / "d", seed=SEED),
        )
    finally:
        g_link.close()
        d_link.close()
        switches.stop()
    return out.a, out.b


def test_max_lag_auto_leads_further_over_a_delayed_link_and_trains_the_same(
    text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    """Without and with 200 ms of one-way delay on the link between the switches: `auto`
    measures the round trip and leads further on the slow link, and either way the run
    equals the single-process reference."""
    cfg = small(steps=24, max_lag="auto")  # ckpt_every 10, keep 3: the cap is 16
    lines = text_lines[:800]
    lags: dict[int, list[float]] = {}
    for delay_ms in (0, 200):
        root = tmp_path / f"delay-{delay_ms}"
        g, d = auto_over_delay(run_roles, cfg, lines, root, delay_ms)
        assert (g.last_step, d.last_step) == (24, 24)
        lags[delay_ms] = [h["max_lag"] for h in g.history]
        assert all(1 <= lag <= 16 for lag in lags[delay_ms])
        assert all(h["bytes_to_generator"] == 24 for h in d.history)  # the timed sync
        if delay_ms:
            rtt = statistics.median(h["lag.rtt_s"] for h in g.history if "lag.rtt_s" in h)
            assert rtt >= 0.4  # a sync back and a batch out, 200 ms each
        tok = Tokenizer.from_file(str(root / "g" / "tokenizer.json"))
        ref = train_electra_local(cfg, lines, seed=SEED, tokenizer=tok)
        for step, (r, hg, hd) in enumerate(zip(ref.history, g.history, d.history, strict=True)):
            assert abs(r["mlm_loss"] - hg["mlm_loss"]) <= 1e-6, step
            assert abs(r["rtd_loss"] - hd["rtd_loss"]) <= 1e-6, step
        assert d.artifact is not None
        trained = load_pretrained(d.artifact.read_bytes())
        assert_same_weights(weights_of(trained.discriminator), weights_of(ref.discriminator.model))
    # the second half of each run, once measured
    assert statistics.median(lags[200][12:]) > statistics.median(lags[0][12:])
    assert max(lags[200]) >= 3


# with dropout off, replicas and one process compute the same sums in another order: the
# gradient all-reduce adds two fp32 halves where the reference accumulates them in place
REPLICA_TOLERANCE = 1e-5


def test_two_replicas_equal_the_single_process_reference_with_dropout_off(
    local_links: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    cfg = small(steps=6, n_discriminators=2, dropout=0.0)
    lines = text_lines[:800]
    g, d = split_run(run_roles, cfg, local_links, lines, tmp_path)
    assert (g.last_step, d.last_step) == (6, 6)
    tok = Tokenizer.from_file(str(tmp_path / "g" / "tokenizer.json"))
    ref = train_electra_local(cfg, lines, seed=SEED, tokenizer=tok)
    for step, (r, hg, hd) in enumerate(zip(ref.history, g.history, d.history, strict=True), 1):
        assert r["mlm_loss"] == hg["mlm_loss"], step  # G is the same code on the same bits
        assert abs(r["rtd_loss"] - hd["rtd_loss"]) <= REPLICA_TOLERANCE, step
        assert abs(r["rtd_accuracy"] - hd["rtd_accuracy"]) <= REPLICA_TOLERANCE, step
    assert d.artifact is not None
    trained = weights_of(load_pretrained(d.artifact.read_bytes()).discriminator)
    expected = weights_of(ref.discriminator.model)
    assert trained.keys() == expected.keys()
    worst = max(float((trained[k] - expected[k]).abs().max()) for k in trained)
    assert worst <= REPLICA_TOLERANCE


class StopAfter:
    """Hooks that ask a role to stop once it has reported `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.seen = step, 0

    def hooks(self) -> Hooks:
        def on_metrics(step: int, _values: dict[str, float]) -> None:
            self.seen = step

        return Hooks(on_metrics=on_metrics, should_stop=lambda: self.seen >= self.step)


@pytest.mark.parametrize("who", ["generator", "discriminator"])
def test_resume_reproduces_the_uninterrupted_run(
    who: str, local_links: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    cfg = small(steps=8, ckpt_every=4)
    lines = text_lines[:800]
    g_full, d_full = split_run(run_roles, cfg, local_links, lines, tmp_path / "full")

    run_dir = tmp_path / "cut"
    (run_dir / "g").mkdir(parents=True)
    tok_json = (tmp_path / "full" / "g" / "tokenizer.json").read_text()
    (run_dir / "g" / "tokenizer.json").write_text(tok_json)
    stop = StopAfter(4).hooks()
    first = split_run(
        run_roles,
        cfg,
        local_links,
        lines,
        run_dir,
        g_hooks=stop if who == "generator" else None,
        d_hooks=stop if who == "discriminator" else None,
    )
    assert any(r.stopped for r in first)
    assert first[1].artifact is None  # a cancelled run writes no model
    g2, d2 = split_run(run_roles, cfg, local_links, lines, run_dir)
    assert (g2.start_step, d2.start_step) == (4, 4)
    assert [h["mlm_loss"] for h in g2.history] == [h["mlm_loss"] for h in g_full.history[4:]]
    assert [h["rtd_loss"] for h in d2.history] == [h["rtd_loss"] for h in d_full.history[4:]]
    assert d2.artifact is not None and d_full.artifact is not None
    assert_same_weights(
        weights_of(load_pretrained(d2.artifact.read_bytes()).discriminator),
        weights_of(load_pretrained(d_full.artifact.read_bytes()).discriminator),
    )


def test_roles_with_different_configs_refuse_to_train(
    local_links: LinkPairs, text_lines: list[str], tmp_path: Path, run_roles: RunRoles
) -> None:
    g_link, d_link = local_links("generator", "discriminator")
    with pytest.raises(AssertionError, match="different configs"):
        run_roles(
            lambda: run_electra_generator(small(), g_link, text_lines[:200], tmp_path / "g"),
            lambda: run_electra_discriminator(small(steps=5), d_link, None, tmp_path / "d"),
        )


def test_model_artifact_round_trip(text_lines: list[str]) -> None:
    run = train_electra_local(small(steps=2), text_lines[:200], seed=SEED)
    blob = export_pretrained(run.discriminator.model, run.tokenizer, {"steps": 2})
    loaded = load_pretrained(blob)
    assert loaded.info == {"steps": 2}
    assert loaded.tokenizer.to_str() == run.tokenizer.to_str()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    run.discriminator.model.eval()
    loaded.discriminator.eval()
    assert torch.equal(run.discriminator.model(ids, valid), loaded.discriminator(ids, valid))
    with pytest.raises(ValueError, match="not a Nebula ELECTRA"):
        from safetensors.torch import save

        load_pretrained(save({"x": torch.zeros(1)}))


def test_presets_have_the_papers_sizes() -> None:
    paper = electra_preset("paper")
    # the discriminator is an ERNIE-M base: its config.json's sizes and vocabulary
    disc = paper.discriminator_body(paper.vocab_size)
    assert (disc.d_model, disc.n_layers, disc.n_heads, disc.d_ff) == (768, 12, 12, 3072)
    assert (paper.vocab_size, paper.seq_len) == (250_002, 512)
    # the generator is ELECTRA-Base's: the same depth at a third of the width
    gen = paper.generator_body(paper.vocab_size)
    assert (gen.d_model, gen.n_layers, gen.n_heads, gen.d_ff) == (256, 12, 4, 1024)
    counts = parameter_counts(paper)
    assert 270e6 < counts["discriminator"] < 285e6  # ERNIE-M base: about 278M
    assert 70e6 < counts["generator"] < 78e6
    tiny = parameter_counts(electra_preset("tiny"))
    assert tiny["discriminator"] > 2 * tiny["generator"]
    with pytest.raises(ValueError, match="unknown preset"):
        electra_preset("huge")


@pytest.mark.slow
def test_tiny_preset_lowers_the_discriminator_loss(
    tiny_electra: tuple[RoleResult, RoleResult],
) -> None:
    g, d = tiny_electra
    rtd = [h["rtd_loss"] for h in d.history]
    first, last = statistics.mean(rtd[:10]), statistics.mean(rtd[-50:])
    # from ln 2 at the start to below the entropy of the replaced-token rate (about 0.33):
    # the discriminator detects replacements, not just their frequency
    assert first > 0.55
    assert last < 0.30
    assert last < 0.5 * first
    mlm = [h["mlm_loss"] for h in g.history]
    assert statistics.mean(mlm[-50:]) < statistics.mean(mlm[:10]) - 2.0
    assert d.artifact is not None
