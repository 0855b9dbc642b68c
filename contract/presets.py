"""The named sizes of each job kind's training config, as plain data.

A preset maps the fields of the kind's training config (workers.training's ElectraConfig
and AbnetConfig) to values; a field it leaves out keeps the config's default. `tiny` states
the defaults a job may override, so that the control plane knows a job's length and the web
UI can show what a blank field means, without loading the training code.
"""

from __future__ import annotations

from typing import Any, Literal

Preset = Literal["tiny", "paper"]

# what the web UI says of each preset
PRESET_HINTS: dict[str, str] = {
    "tiny": "Small models and few steps: runs on CPU in minutes. Good for a first try.",
    "paper": "The paper's model sizes: needs accelerators and hours.",
}

ELECTRA_PRESETS: dict[str, dict[str, Any]] = {
    # trains in a couple of minutes on 2 CPU cores
    "tiny": {
        "steps": 600,
        "batch_size": 32,
        "n_discriminators": 1,
        "dropout": 0.1,
        "ckpt_every": 100,
    },
    # Nebula-I's sizes. The discriminator is an ERNIE-M base (Ouyang et al. 2021): 12
    # layers of width 768, 12 heads, 3,072 wide feed-forward, the 250,002-piece vocabulary
    # ERNIE-M shares with XLM-R, 512 positions (its config.json); about 278M parameters,
    # 192M of them the embedding. The generator is ELECTRA-Base's (Clark et al. 2020): the
    # discriminator's depth at a third of its width (256, 4 heads, 1,024), about 74M.
    # bench/paper_preset.py runs a few steps of it on CPU.
    "paper": {
        "vocab_size": 250_002,
        "seq_len": 512,
        "batch_size": 32,
        "gen_d_model": 256,
        "gen_layers": 12,
        "gen_heads": 4,
        "gen_d_ff": 1024,
        "disc_d_model": 768,
        "disc_layers": 12,
        "disc_heads": 12,
        "disc_d_ff": 3072,
        "steps": 400_000,
        "lr_generator": 2e-4,
        "lr_discriminator": 2e-4,
        "warmup_steps": 10_000,
        "ckpt_every": 2000,
    },
}

ABNET_PRESETS: dict[str, dict[str, Any]] = {
    # reaches a clear BLEU on the demo corpus in a few CPU minutes
    "tiny": {
        "steps": 250,
        "batch_size": 16,  # sentence pairs per micro-batch
        "micro_batches": 4,  # per step, in a 1F1B pipeline
        "ckpt_every": 100,
        "forward_codec": "fp16",  # activations S -> T (Nebula-I)
        "backward_codec": "int8",  # gradients T -> S (Nebula-I)
        "compress_from_step": 0,
    },
    # for two `paper` ELECTRA discriminators (ERNIE-M base sized) as the frozen PLMs, on GPUs
    "paper": {
        "adapter_dim": 2048,  # ABNet's decoder adapters
        "cross_heads": 16,
        "src_len": 128,
        "tgt_len": 128,
        "batch_size": 32,
        "micro_batches": 8,
        "activation_chunks": 4,
        "steps": 100_000,
        "lr": 5e-4,
        "warmup_steps": 4000,
        "decode_iterations": 10,  # Mask-Predict's
        "length_candidates": 5,
        "ckpt_every": 2000,
        "eval_every": 5000,
    },
}


def preset_values(
    presets: dict[str, dict[str, Any]], name: str, **overrides: Any
) -> dict[str, Any]:
    """The fields preset `name` sets, with `overrides` on top; ValueError for an unknown name."""
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(presets)}")
    return {**presets[name], **overrides}
