"""ABNet's job config: sizes, schedule, codecs per stream; the `tiny` and `paper` presets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.kinds import AUTO_CODEC, SCHEDULES
from contract.presets import ABNET_PRESETS
from workers.compression import PER_SAMPLE, SpecError, check_stream_spec, parse_spec
from workers.training.configs import PresetConfig

AUTO = AUTO_CODEC
# what `auto` chooses among (normalized specs; the index is the `auto.<stream>.choice` metric)
AUTO_CANDIDATES: tuple[str, ...] = tuple(
    parse_spec(spec).spec
    for spec in (
        "none",
        "fp16",
        "bf16",
        "int8",
        "fp16(lowrank(0.6,method=power))",
        "fp16(lowrank(0.2,method=power))",
    )
)


@dataclass
class AbnetConfig(PresetConfig):
    """One ABNet job. Defaults: `tiny`.

    `tiny` reaches a clear BLEU on the demo corpus in a few CPU minutes; `paper` has
    sizes for the `paper` ELECTRA models on GPUs.
    """

    PRESETS = ABNET_PRESETS
    SCENARIO = "ABNet"

    adapter_dim: int = 256  # bottleneck; wider than the tiny PLM: adapters carry the new task
    cross_heads: int = 4
    src_len: int = 24  # at most the PLM's positions; demo sentences have at most 17 tokens
    tgt_len: int = 24
    batch_size: int = 16  # sentence pairs per micro-batch
    micro_batches: int = 4  # per optimizer step, in a 1F1B pipeline (4-8 keep the link busy)
    # `stale1`: a step's forwards start before the previous step's last gradient is back,
    # on the encoder's adapters of one update earlier (PipeDream-2BW); exact `sync` is the
    # default because stale weights change what is learned (sides.DelayedWeights)
    schedule: str = "sync"
    activation_chunks: int = 2  # pieces of a micro-batch's activations, decoded as they land
    steps: int = 250
    lr: float = 2e-3  # adapters start as identities; a high rate is safe on the demo
    warmup_steps: int = 40
    weight_decay: float = 0.01
    dropout: float = 0.1  # in the adapters; the frozen PLMs run in eval mode
    length_loss_weight: float = 0.1  # Mask-Predict's
    decode_iterations: int = 4  # mask-predict refinement rounds
    length_candidates: int = 3  # Mask-Predict's length beam
    forward_codec: str = "fp16"  # activations S -> T (Nebula-I); `auto`: chosen per link
    backward_codec: str = "int8"  # activation gradients T -> S (Nebula-I); `auto` too
    auto_max_error: float = 0.03  # `auto`: the largest relative error a candidate may make
    compress_from_step: int = 0  # steps before this one send float32 (`none`)
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    eval_every: int = 0  # BLEU on the eval lines every N steps (0: only after the last step)
    eval_batch_size: int = 100
    recv_timeout_s: float = 900.0

    precision: str = "fp32"  # or "bf16": autocast on CPU and CUDA

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError("precision must be fp32 or bf16")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be sync or stale1, got {self.schedule!r}")
        if min(self.batch_size, self.micro_batches, self.steps, self.ckpt_every) < 1:
            raise ValueError("batch_size, micro_batches, steps and ckpt_every must be at least 1")
        if not 1 <= self.activation_chunks <= self.batch_size:
            raise ValueError("activation_chunks must be between 1 and batch_size")
        if min(self.src_len, self.tgt_len) < 3 or self.adapter_dim < 1:
            raise ValueError("src_len and tgt_len must be at least 3, adapter_dim at least 1")
        if self.decode_iterations < 1 or self.length_candidates < 1:
            raise ValueError("decode_iterations and length_candidates must be at least 1")
        if not 0.0 < self.auto_max_error < 1.0:
            raise ValueError("auto_max_error must be in (0, 1)")
        for name in ("forward_codec", "backward_codec"):
            check_codec_field(name, getattr(self, name))

    @property
    def staleness(self) -> int:
        """Updates by which the weights of a step's encoder forwards lag: 0 (sync) or 1."""
        return 1 if self.schedule == "stale1" else 0

    def codecs(self, step: int) -> tuple[str, str]:
        """Forward and backward codec specs in force at `step` (`auto` left to the stream)."""
        if step < self.compress_from_step:
            return "none", "none"
        return self.forward_codec, self.backward_codec


def check_codec_field(name: str, spec: str) -> None:
    """ValueError unless `spec` is `auto` or a codec fit for a per-sample stream.

    Both ABNet streams are per sample (activations S -> T, their gradients T -> S), so
    error feedback is refused on either (workers.compression.check_stream_spec says why).
    """
    if spec == AUTO:
        return
    try:
        check_stream_spec(spec, name, PER_SAMPLE)
    except SpecError as exc:
        raise ValueError(str(exc)) from None


def abnet_preset(name: str, **overrides: Any) -> AbnetConfig:
    """The `tiny` or `paper` config (contract.presets), with overrides."""
    return AbnetConfig.preset(name, **overrides)
