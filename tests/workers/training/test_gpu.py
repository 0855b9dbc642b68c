"""`make gpu-check`: ELECTRA and ABNet split across a link with every role on CUDA, against
the same runs on the CPU. Skipped, with the reason, where torch sees no CUDA device.

GPU kernels sum in other orders than the CPU's: the losses agree to 1e-3 relative, not
bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.switch.link import Link
from workers.training.abnet import AbnetConfig, run_abnet_decoder, run_abnet_encoder
from workers.training.electra import (
    ElectraConfig,
    export_pretrained,
    run_electra_discriminator,
    run_electra_generator,
    train_electra_local,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
)
RELATIVE = 1e-3
LinkPairs = Callable[[str, str], tuple[Link, Link]]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), 1e-6)


def test_electra_on_cuda_equals_the_cpu_run(
    local_links: LinkPairs, run_roles: Callable[..., Any], text_lines: list[str], tmp_path: Path
) -> None:
    cfg = ElectraConfig.tiny(steps=5, batch_size=8, warmup_steps=1, ckpt_every=5)
    lines = text_lines[:300]

    def discriminator_history(device: str) -> list[dict[str, float]]:
        g_link, d_link = local_links("generator", "discriminator")
        out = run_roles(
            lambda: run_electra_generator(
                cfg, g_link, lines, tmp_path / device / "g", seed=1, device=device
            ),
            lambda: run_electra_discriminator(
                cfg, d_link, lines, tmp_path / device / "d", seed=1, device=device
            ),
        )
        return list(out.b.history)

    histories = {device: discriminator_history(device) for device in ("cpu", "cuda")}
    for a, b in zip(histories["cpu"], histories["cuda"], strict=True):
        assert _close(a["rtd_loss"], b["rtd_loss"]), (a, b)


def test_abnet_on_cuda_equals_the_cpu_run(
    local_links: LinkPairs,
    run_roles: Callable[..., Any],
    text_lines: list[str],
    pairs: Any,
    tmp_path: Path,
) -> None:
    run = train_electra_local(
        ElectraConfig.tiny(steps=2, batch_size=8, warmup_steps=1), text_lines[:300], seed=1
    )
    plm = export_pretrained(run.discriminator.model, run.tokenizer)
    cfg = AbnetConfig.tiny(
        steps=5, batch_size=8, micro_batches=1, adapter_dim=32, warmup_steps=1, ckpt_every=5
    )
    src, tgt = pairs["train"][0][:80], pairs["train"][1][:80]

    def decoder_history(device: str) -> list[dict[str, float]]:
        s_link, t_link = local_links("encoder", "decoder")
        out = run_roles(
            lambda: run_abnet_encoder(
                cfg, s_link, src, plm, tmp_path / device / "s", seed=3, device=device
            ),
            lambda: run_abnet_decoder(
                cfg, t_link, tgt, plm, tmp_path / device / "t", seed=3, device=device
            ),
        )
        return list(out.b.history)

    histories = {device: decoder_history(device) for device in ("cpu", "cuda")}
    for a, b in zip(histories["cpu"], histories["cuda"], strict=True):
        assert _close(a["loss"], b["loss"]), (a, b)
