"""`make gpu-check`: ELECTRA and ABNet split across a link with every role on CUDA, against
the same runs on the CPU; the codecs on CUDA against their CPU blobs; what a CUDA worker
reports of its device. Skipped, with the reason, where torch sees no CUDA device.

GPU kernels sum in other orders than the CPU's: the losses agree to 1e-3 relative, not
bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.compression import ErrorFeedback, LowRankCodec, decode, parse_spec
from workers.runner import describe_device, resolve_device
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


def test_a_cuda_worker_reports_its_device() -> None:
    assert resolve_device("auto") == resolve_device("cuda") == "cuda"
    device = describe_device("cuda")
    assert device.kind == "cuda" and device.count == torch.cuda.device_count() >= 1
    assert device.name and (device.memory_bytes or 0) > 0


# the same blob bytes on CUDA as on the CPU where the arithmetic is elementwise; the
# factorisations' sums run in other orders, so there the decoded tensors agree closely
EXACT = ["none", "fp16", "bf16", "int8", "ef(int8)"]
FACTORED = ["lowrank(0.25)", "lowrank(0.25,method=rsvd)", "fp16(lowrank(0.25,method=power))"]


def _matrix(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(256, 8, generator=g) @ torch.randn(8, 192, generator=g)


@pytest.mark.parametrize("spec", EXACT + FACTORED + ["ef(fp16(lowrank(0.25,method=power)))"])
def test_codecs_on_cuda_keep_their_state_there_and_decode_where_asked(spec: str) -> None:
    on_cpu, on_cuda = parse_spec(spec), parse_spec(spec)
    for step in range(3):
        x = _matrix(step)
        here, there = on_cpu.encode(x), on_cuda.encode(x.cuda())
        if spec in EXACT:
            assert here == there, (spec, step)
        back = on_cuda.decode(there, shape=x.shape, device="cuda")
        assert back.device.type == "cuda"
        # fp16 factors round at 2^-11, and CUDA's sums run in another order
        assert (back.cpu() - decode(here)).norm() <= 1e-2 * x.norm(), (spec, step)
    if isinstance(on_cuda, ErrorFeedback):
        assert on_cuda.residual is not None and on_cuda.residual.device.type == "cuda"
    if isinstance(on_cuda, LowRankCodec) and on_cuda.method == "power":
        assert on_cuda.warm_start is not None and on_cuda.warm_start.device.type == "cuda"
