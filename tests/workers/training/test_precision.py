"""`precision: bf16` (autocast) against float32 on the same seed, with the tolerance stated.

bf16 keeps 8 bits of mantissa (relative rounding 2^-8 ~ 0.4%); over a few steps of a
tiny model the losses stay within 5% of float32's. fp32 is exactly what it was: the same
run twice is bit-equal, and `precision: fp32` changes nothing.
"""

from __future__ import annotations

import pytest

from workers.training.abnet import AbnetConfig, train_abnet_local
from workers.training.electra import ElectraConfig, export_pretrained, train_electra_local

RELATIVE = 0.05  # bf16 vs fp32 losses, after 4 steps of the tiny presets


def test_electra_bf16_stays_within_tolerance_of_fp32(text_lines: list[str]) -> None:
    lines = text_lines[:200]
    base = dict(steps=4, batch_size=8, warmup_steps=1)
    fp32 = train_electra_local(ElectraConfig.tiny(**base), lines, seed=2)
    again = train_electra_local(
        ElectraConfig.tiny(**base, precision="fp32"), lines, seed=2, tokenizer=fp32.tokenizer
    )
    bf16 = train_electra_local(
        ElectraConfig.tiny(**base, precision="bf16"), lines, seed=2, tokenizer=fp32.tokenizer
    )
    assert again.history == fp32.history
    for a, b in zip(fp32.history, bf16.history, strict=True):
        for key in ("mlm_loss", "rtd_loss"):
            assert abs(a[key] - b[key]) <= RELATIVE * abs(a[key]), (key, a[key], b[key])
    assert bf16.history != fp32.history  # bf16 did run


def test_abnet_bf16_stays_within_tolerance_of_fp32(
    text_lines: list[str], pairs: dict[str, tuple[list[str], list[str]]]
) -> None:
    run = train_electra_local(
        ElectraConfig.tiny(steps=2, batch_size=8, warmup_steps=1), text_lines[:300], seed=1
    )
    plm = export_pretrained(run.discriminator.model, run.tokenizer)
    src, tgt = pairs["train"][0][:80], pairs["train"][1][:80]
    base = dict(
        steps=4,
        batch_size=8,
        micro_batches=1,
        adapter_dim=32,
        warmup_steps=1,
        forward_codec="none",
        backward_codec="none",
    )
    fp32 = train_abnet_local(AbnetConfig.tiny(**base), plm, plm, src, tgt, seed=3)
    bf16 = train_abnet_local(AbnetConfig.tiny(**base, precision="bf16"), plm, plm, src, tgt, seed=3)
    for a, b in zip(fp32.history, bf16.history, strict=True):
        assert abs(a["loss"] - b["loss"]) <= RELATIVE * abs(a["loss"]), (a["loss"], b["loss"])


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="fp32 or bf16"):
        ElectraConfig.tiny(precision="fp8")
