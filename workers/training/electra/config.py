"""Scenario-I's job configuration: `ElectraConfig`, built from the presets (`tiny`,
`paper`) that contract/presets.py keeps as plain data.

Validation only, no model: the roles, the reference run and the replicas read it
from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.presets import ELECTRA_PRESETS
from workers.training.bert import BertConfig
from workers.training.configs import PresetConfig
from workers.training.data import MIN_TOKEN_FREQUENCY
from workers.training.electra.pace import AUTO, DEFAULT_LAG


@dataclass
class ElectraConfig(PresetConfig):
    """One ELECTRA job: data, both model sizes, optimisation, runtime. Defaults: `tiny`.

    `tiny` trains in a couple of minutes on 2 CPU cores; `paper` has Nebula-I's sizes,
    an ERNIE-M base discriminator (278M parameters) and ELECTRA-Base's generator (74M).
    """

    PRESETS = ELECTRA_PRESETS
    SCENARIO = "ELECTRA"

    # data
    vocab_size: int = 2048  # WordPiece vocabulary trained on the job's own text
    # pieces rarer than this stay out of the vocabulary, which ships with the model: a
    # name or number on one line of someone's text must not come out verbatim
    min_token_frequency: int = MIN_TOKEN_FREQUENCY
    seq_len: int = 24  # the demo sentences are at most 17 WordPiece tokens
    batch_size: int = 32  # sequences per micro-batch, i.e. per discriminator replica
    n_discriminators: int = 1  # data-parallel replicas on the discriminator's cluster
    mask_prob: float = 0.15  # BERT's and ELECTRA's
    # generator: ELECTRA finds a generator 1/4-1/2 the discriminator's width works best
    gen_d_model: int = 64
    gen_layers: int = 2
    gen_heads: int = 1
    gen_d_ff: int = 256
    # discriminator
    disc_d_model: int = 128
    disc_layers: int = 3
    disc_heads: int = 2
    disc_d_ff: int = 512
    dropout: float = 0.1  # ELECTRA's
    # BERT's post-LN layout instead of Nebula's pre-LN one: what a Hugging Face ELECTRA
    # computes, so the models export (GET /datasets/{id}/content?format=huggingface)
    post_ln: bool = False
    precision: str = "fp32"  # or "bf16": autocast on CPU and CUDA
    # optimisation (AdamW, linear warm-up then decay)
    steps: int = 600
    lr_generator: float = 1e-3  # small models on small data tolerate a high rate
    lr_discriminator: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01  # ELECTRA's
    # runtime
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    # steps G may run ahead of D's last sync: overlap, bounded memory; "auto": derived
    # from the measured round trip and both roles' step times (pace.py)
    max_lag: int | str = DEFAULT_LAG
    recv_timeout_s: float = 900.0  # a peer silent this long is considered gone

    def __post_init__(self) -> None:
        if self.n_discriminators < 1 or self.batch_size < 1 or self.steps < 1:
            raise ValueError("n_discriminators, batch_size and steps must be at least 1")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError("precision must be fp32 or bf16")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError("mask_prob must lie strictly between 0 and 1")
        if self.min_token_frequency < 1:
            raise ValueError("min_token_frequency must be at least 1")
        if self.seq_len < 3 or self.ckpt_every < 1:
            raise ValueError("seq_len must be at least 3, ckpt_every at least 1")
        if self.max_lag != AUTO and (
            not isinstance(self.max_lag, int) or isinstance(self.max_lag, bool) or self.max_lag < 1
        ):
            raise ValueError(f"max_lag must be an integer of at least 1 or {AUTO!r}")
        for d, h in ((self.gen_d_model, self.gen_heads), (self.disc_d_model, self.disc_heads)):
            if h < 1 or d % h:
                raise ValueError(f"width {d} is not a multiple of {h} heads")

    def generator_body(self, vocab_size: int) -> BertConfig:
        """Transformer size of the generator for a tokenizer of `vocab_size` ids."""
        return self._body(
            vocab_size, self.gen_d_model, self.gen_layers, self.gen_heads, self.gen_d_ff
        )

    def discriminator_body(self, vocab_size: int) -> BertConfig:
        """Transformer size of the discriminator for a tokenizer of `vocab_size` ids."""
        return self._body(
            vocab_size, self.disc_d_model, self.disc_layers, self.disc_heads, self.disc_d_ff
        )

    def _body(
        self, vocab_size: int, d_model: int, layers: int, heads: int, d_ff: int
    ) -> BertConfig:
        return BertConfig(
            vocab_size=vocab_size,
            max_len=self.seq_len,
            d_model=d_model,
            n_layers=layers,
            n_heads=heads,
            d_ff=d_ff,
            dropout=self.dropout,
            post_ln=self.post_ln,
        )


def electra_preset(name: str, **overrides: Any) -> ElectraConfig:
    """The `tiny` or `paper` config (contract.presets), with overrides."""
    return ElectraConfig.preset(name, **overrides)
