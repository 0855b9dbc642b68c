"""Scenario-I: ELECTRA pre-training with the generator and the discriminator on two clusters.

The generator G (a small BERT trained with masked-language modelling) masks
15% of the tokens, samples replacements from its own predictions and sends the
corrupted sequences to the discriminator D (a larger BERT trained to tell
which tokens were replaced). The two models share no embeddings, so only token
indices cross the link, packed in the narrowest unsigned integer type:

- `shared` mode (the default, `discriminator_reads_text`: D's cluster reads
  the same text, as its owner or through a grant; the roles compare SHA-256
  digests of their lines at hello): the example indices and only the replaced
  positions with their sampled ids; D rebuilds the rest from its own copy of
  the text;
- `full` mode (D's cluster is not given the text): the whole corrupted
  sequence and a bit per position saying whether it was replaced.

Neither mode hides the text from D's cluster. In `shared` mode it holds the
text itself; in `full` mode it receives every sequence with about 85% of its
tokens unchanged, and the tokenizer (at hello) to decode them, so it can read
the text nearly verbatim. What `full` mode spares is a copy of the dataset at
rest on D's cluster, not its contents.

G does not wait for D: it may run `max_lag` steps ahead of the last small
sync tensor D sends after each optimizer step, and its sends go out on a
background thread while it computes the next micro-batch. With
`n_discriminators = n`, G produces n micro-batches per step; the root D
scatters them to n data-parallel replicas (torch.distributed, gloo on CPU,
nccl on GPU; `replicas.py`) which average their gradients, then the root syncs
with G.

Because ELECTRA's discriminator loss never reaches the generator (sampling is
discrete), a split run computes exactly what `train_electra_local` computes in
one process with the same seed: both build the same objects and call the same
methods in the same order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from tokenizers import Tokenizer
from torch import nn

from contract.model_limits import check_bert_config
from contract.presets import ELECTRA_PRESETS, preset_values
from workers.switch.link import Link
from workers.training.bert import (
    BertConfig,
    Encoder,
    count_parameters,
    init_weights,
    set_dropout_generator,
)
from workers.training.data import (
    MASK,
    MIN_TOKEN_FREQUENCY,
    PAD,
    SPECIAL_TOKENS,
    batch_indices,
    clean_lines,
    encode_lines,
    lines_digest,
    train_tokenizer,
)
from workers.training.runtime import (
    AsyncSender,
    CheckpointStore,
    Hooks,
    RoleResult,
    expect_bytes,
    hello,
    linear_warmup_decay,
    pack_message,
    pack_uint,
    read_safetensors_metadata,
    restore_training_state,
    resume_step,
    set_lr,
    training_state,
    unpack_int,
    unpack_message,
)

BATCH, SYNC, HELLO = "electra.batch", "electra.sync", "electra.hello"
N_SPECIAL = len(SPECIAL_TOKENS)  # ids below this are special tokens, never masked nor sampled
PAD_ID, MASK_ID = SPECIAL_TOKENS.index(PAD), SPECIAL_TOKENS.index(MASK)


@dataclass
class ElectraConfig:
    """One ELECTRA job: data, both model sizes, optimisation, runtime. Defaults: `tiny`."""

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
    # optimisation (AdamW, linear warm-up then decay)
    steps: int = 600
    lr_generator: float = 1e-3  # small models on small data tolerate a high rate
    lr_discriminator: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01  # ELECTRA's
    # runtime
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    max_lag: int = 2  # steps G may run ahead of D's last sync: overlap, bounded memory
    recv_timeout_s: float = 900.0  # a peer silent this long is considered gone

    def __post_init__(self) -> None:
        if self.n_discriminators < 1 or self.batch_size < 1 or self.steps < 1:
            raise ValueError("n_discriminators, batch_size and steps must be at least 1")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError("mask_prob must lie strictly between 0 and 1")
        if self.min_token_frequency < 1:
            raise ValueError("min_token_frequency must be at least 1")
        if self.seq_len < 3 or self.ckpt_every < 1 or self.max_lag < 1:
            raise ValueError("seq_len must be at least 3, ckpt_every and max_lag at least 1")
        for d, h in ((self.gen_d_model, self.gen_heads), (self.disc_d_model, self.disc_heads)):
            if h < 1 or d % h:
                raise ValueError(f"width {d} is not a multiple of {h} heads")

    def generator_body(self, vocab_size: int) -> BertConfig:
        """Transformer size of the generator for a tokenizer of `vocab_size` ids."""
        return BertConfig(
            vocab_size=vocab_size,
            max_len=self.seq_len,
            d_model=self.gen_d_model,
            n_layers=self.gen_layers,
            n_heads=self.gen_heads,
            d_ff=self.gen_d_ff,
            dropout=self.dropout,
        )

    def discriminator_body(self, vocab_size: int) -> BertConfig:
        """Transformer size of the discriminator for a tokenizer of `vocab_size` ids."""
        return BertConfig(
            vocab_size=vocab_size,
            max_len=self.seq_len,
            d_model=self.disc_d_model,
            n_layers=self.disc_layers,
            n_heads=self.disc_heads,
            d_ff=self.disc_d_ff,
            dropout=self.dropout,
        )

    @classmethod
    def tiny(cls, **overrides: Any) -> ElectraConfig:
        """Trains in a couple of minutes on 2 CPU cores (the defaults)."""
        return electra_preset("tiny", **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> ElectraConfig:
        """Nebula-I's sizes: generator about 220M, discriminator about 550M parameters (GPU)."""
        return electra_preset("paper", **overrides)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ElectraConfig:
        """The config a dict (e.g. a job's JSON) describes; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown ELECTRA config keys: {sorted(unknown)}")
        return cls(**values)


def electra_preset(name: str, **overrides: Any) -> ElectraConfig:
    """The `tiny` or `paper` config (contract.presets), with overrides."""
    return ElectraConfig(**preset_values(ELECTRA_PRESETS, name, **overrides))


# ---------------------------------------------------------------- models


class Generator(nn.Module):
    """Masked-language model: predicts the original token at masked positions."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.body = Encoder(cfg)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        h = self.body(ids, valid)[masked]  # (M, C): only the masked positions
        h = self.ln(F.gelu(self.dense(h)))
        # output embedding tied to the generator's own input embedding, as BERT
        return h @ self.body.embed.tok.weight.T + self.bias  # (M, V)


class Discriminator(nn.Module):
    """Replaced-token detection: one logit per position, > 0 meaning 'replaced'."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.body = Encoder(cfg)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, 1)

    def forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        h = self.body(ids, valid)  # (B, T, C)
        return self.out(F.gelu(self.dense(h))).squeeze(-1)  # (B, T)


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with no decay on biases and norms (ELECTRA's split)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


# ---------------------------------------------------------------- the two sides


@dataclass
class CorruptedBatch:
    """One micro-batch as the discriminator trains on it."""

    ids: torch.Tensor  # (B, T) corrupted token ids
    replaced: torch.Tensor  # (B, T) bool: True where G's sample differs from the original


class GeneratorSide:
    """G's model, optimizer and random streams, and how it makes one micro-batch."""

    def __init__(
        self, cfg: ElectraConfig, ids: torch.Tensor, vocab_size: int, seed: int, device: str
    ) -> None:
        self.cfg, self.seed, self.device = cfg, seed, torch.device(device)
        self.data = ids  # (N, T) original ids of the whole text, on CPU
        self.vocab_size = vocab_size
        self.model = Generator(cfg.generator_body(vocab_size))
        init_weights(self.model, torch.Generator().manual_seed(seed))
        self.model.to(self.device)
        self.rng_mask = torch.Generator(self.device).manual_seed(seed + 1)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 2)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg.lr_generator, cfg.weight_decay)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"mask": self.rng_mask, "dropout": self.rng_dropout}

    def indices(self, step: int, micro: int) -> torch.Tensor:
        """Example indices of micro-batch `micro` of `step` (a pure function of the seed)."""
        position = (step - 1) * self.cfg.n_discriminators + micro
        return batch_indices(len(self.data), self.cfg.batch_size, position, self.seed)

    def micro_batch(
        self, step: int, micro: int
    ) -> tuple[torch.Tensor, torch.Tensor, CorruptedBatch, float]:
        """Mask, predict, accumulate the MLM gradient and sample replacements.

        Returns the example indices, the original ids, the corrupted batch and the MLM loss.
        """
        index = self.indices(step, micro)
        ids = self.data[index].to(self.device)  # (B, T)
        valid = ids != PAD_ID
        maskable = ids >= N_SPECIAL
        draw = torch.rand(ids.shape, generator=self.rng_mask, device=self.device)
        masked = (draw < self.cfg.mask_prob) & maskable  # (B, T)
        if not bool(masked.any()):
            masked[0, 1] = True  # every sequence holds a token at 1; keeps the loss defined
        logits = self.model(ids.masked_fill(masked, MASK_ID), valid, masked)  # (M, V)
        loss = F.cross_entropy(logits, ids[masked])
        (loss / self.cfg.n_discriminators).backward()
        with torch.no_grad():
            logits = logits.detach().clone()
            logits[:, :N_SPECIAL] = float("-inf")  # never sample [PAD], [MASK], ...
            probs = torch.softmax(logits, dim=-1)
            sampled = torch.multinomial(probs, 1, generator=self.rng_mask).squeeze(1)  # (M,)
            corrupted = ids.clone()
            corrupted[masked] = sampled
        return index, ids, CorruptedBatch(corrupted, corrupted != ids), float(loss.detach())

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated gradient."""
        set_lr(
            self.opt,
            linear_warmup_decay(step, self.cfg.lr_generator, self.cfg.warmup_steps, self.cfg.steps),
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class DiscriminatorSide:
    """D's model, optimizer and random stream, and how it trains on one micro-batch."""

    def __init__(
        self, cfg: ElectraConfig, vocab_size: int, seed: int, device: str, rank: int = 0
    ) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.model = Discriminator(cfg.discriminator_body(vocab_size))
        init_weights(self.model, torch.Generator().manual_seed(seed + 100))  # same on every rank
        self.model.to(self.device)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 200 + rank)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg.lr_discriminator, cfg.weight_decay)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"dropout": self.rng_dropout}

    def train_micro(self, batch: CorruptedBatch, scale: float = 1.0) -> tuple[float, float, int]:
        """Accumulate the RTD gradient of one micro-batch; returns loss, accuracy, tokens."""
        ids = batch.ids.to(self.device)
        target = batch.replaced.to(self.device)
        valid = ids != PAD_ID
        logits = self.model(ids, valid)  # (B, T)
        loss = F.binary_cross_entropy_with_logits(logits[valid], target[valid].float())
        (loss * scale).backward()
        with torch.no_grad():
            acc = ((logits[valid] > 0) == target[valid]).float().mean()
        return float(loss.detach()), float(acc), int(valid.sum())

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated (and, with replicas, averaged) gradient."""
        set_lr(
            self.opt,
            linear_warmup_decay(
                step, self.cfg.lr_discriminator, self.cfg.warmup_steps, self.cfg.steps
            ),
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- wire format


def encode_batch(
    mode: str,
    step: int,
    micro: int,
    index: torch.Tensor,
    original: torch.Tensor,
    batch: CorruptedBatch,
    vocab_size: int,
    n_examples: int,
) -> bytes:
    """The bytes G sends for one micro-batch (see the module docstring for the two modes)."""
    header = {"kind": "batch", "mode": mode, "step": step, "micro": micro}
    B, T = batch.ids.shape
    if mode == "full":
        header["shape"] = [B, T]
        bits = np.packbits(batch.replaced.cpu().numpy().reshape(-1))
        return pack_message(header, {"ids": pack_uint(batch.ids, vocab_size - 1), "replaced": bits})
    flat = batch.replaced.reshape(-1).nonzero().squeeze(1)  # positions in B*T, ascending
    arrays = {
        "index": pack_uint(index, n_examples - 1),
        "pos": pack_uint(flat, B * T - 1),
        "tok": pack_uint(batch.ids.reshape(-1)[flat], vocab_size - 1),
    }
    del original  # D rebuilds it from its own copy of the text
    return pack_message(header, arrays)


def decode_batch(
    header: dict[str, Any], arrays: dict[str, np.ndarray], text_ids: torch.Tensor | None
) -> CorruptedBatch:
    """What D rebuilds from one message; `text_ids` is its own (N, T) text in shared mode."""
    if header["mode"] == "full":
        B, T = header["shape"]
        ids = unpack_int(arrays["ids"]).reshape(B, T)
        bits = np.unpackbits(arrays["replaced"], count=B * T).astype(bool)
        return CorruptedBatch(ids, torch.from_numpy(bits).reshape(B, T))
    if text_ids is None:
        raise ValueError("shared-mode batch but this discriminator holds no text")
    original = text_ids[unpack_int(arrays["index"])]  # (B, T)
    corrupted = original.clone()
    corrupted.view(-1)[unpack_int(arrays["pos"])] = unpack_int(arrays["tok"])
    return CorruptedBatch(corrupted, corrupted != original)


# ---------------------------------------------------------------- model artifact


@dataclass
class PretrainedModel:
    """A trained discriminator with its tokenizer: what a `model` dataset holds."""

    config: BertConfig
    tokenizer: Tokenizer
    discriminator: Discriminator
    info: dict[str, Any] = field(default_factory=dict)


def export_pretrained(
    model: Discriminator, tokenizer: Tokenizer, info: dict[str, Any] | None = None
) -> bytes:
    """One safetensors file: weights, plus config and tokenizer JSON in its metadata."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    metadata = {
        "nebula.kind": "model",
        "nebula.architecture": "electra-discriminator",
        "nebula.format": "1",
        "config": json.dumps(asdict(model.cfg)),
        "tokenizer": tokenizer.to_str(),
        "info": json.dumps(info or {}),
    }
    return bytes(save_safetensors_bytes(tensors, metadata=metadata))


def load_pretrained(blob: bytes, device: str = "cpu") -> PretrainedModel:
    """Load what `export_pretrained` wrote (a `model` dataset's bytes)."""
    meta = read_safetensors_metadata(blob)
    if meta.get("nebula.architecture") != "electra-discriminator":
        raise ValueError("not a Nebula ELECTRA discriminator model file")
    # checked before anything is built: the config is the file's claim, not its weights
    cfg = BertConfig(**check_bert_config(json.loads(meta["config"])))
    model = Discriminator(cfg)
    model.load_state_dict(load_safetensors_bytes(blob))
    return PretrainedModel(
        config=cfg,
        tokenizer=Tokenizer.from_str(meta["tokenizer"]),
        discriminator=model.to(device),
        info=json.loads(meta.get("info", "{}")),
    )


# ---------------------------------------------------------------- single-process reference


@dataclass
class LocalElectraRun:
    """Result of `train_electra_local`."""

    generator: GeneratorSide
    discriminator: DiscriminatorSide
    tokenizer: Tokenizer
    history: list[dict[str, float]]


TOKENIZER_FILE = "tokenizer.json"


def job_tokenizer(cfg: ElectraConfig, lines: list[str], store: CheckpointStore | None) -> Tokenizer:
    """The job's tokenizer: the one the role's `store` holds, else trained on `lines` (and
    kept there, sealed like the checkpoints: its vocabulary comes from the job's text)."""
    if store is not None and store.has_file(TOKENIZER_FILE):
        return Tokenizer.from_str(store.read_file(TOKENIZER_FILE).decode())
    tok = train_tokenizer(lines, cfg.vocab_size, cfg.min_token_frequency)
    if store is not None:
        store.write_file(TOKENIZER_FILE, tok.to_str().encode())
    return tok


def train_electra_local(
    cfg: ElectraConfig,
    text_lines: Iterable[str],
    *,
    seed: int = 0,
    device: str = "cpu",
    steps: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> LocalElectraRun:
    """Both roles in one process, no link: the reference a split run must equal.

    Pass the split run's `tokenizer` (its generator's `tokenizer.json`) to
    compare: the `tokenizers` WordPiece trainer breaks ties in hash-map order,
    so two trainings on the same text may differ.
    """
    lines = clean_lines(text_lines)
    tok = tokenizer or job_tokenizer(cfg, lines, None)
    V = tok.get_vocab_size()
    ids = encode_lines(tok, lines, cfg.seq_len)
    g = GeneratorSide(cfg, ids, V, seed, device)
    d = DiscriminatorSide(cfg, V, seed, device)
    n = cfg.n_discriminators
    history = []
    for k in range(1, (steps or cfg.steps) + 1):
        mlm, rtd, acc = 0.0, 0.0, 0.0
        for m in range(n):
            _, _, batch, loss = g.micro_batch(k, m)
            rtd_m, acc_m, _ = d.train_micro(batch, scale=1.0 / n)
            mlm, rtd, acc = mlm + loss / n, rtd + rtd_m / n, acc + acc_m / n
        g.step(k)
        d.step(k)
        history.append({"mlm_loss": mlm, "rtd_loss": rtd, "rtd_accuracy": acc})
    return LocalElectraRun(g, d, tok, history)


# ---------------------------------------------------------------- the generator role


def run_electra_generator(
    cfg: ElectraConfig,
    link: Link,
    text_lines: Iterable[str],
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-I, cluster G: train the generator and feed corrupted batches to D."""
    hooks = hooks or Hooks()
    lines = clean_lines(text_lines)
    if len(lines) < cfg.batch_size:
        raise ValueError(f"need at least {cfg.batch_size} lines of text, got {len(lines)}")
    store = CheckpointStore(ckpt_dir, keep=cfg.keep_checkpoints, key=hooks.checkpoint_key)
    tok = job_tokenizer(cfg, lines, store)
    V = tok.get_vocab_size()
    ids = encode_lines(tok, lines, cfg.seq_len)
    side = GeneratorSide(cfg, ids, V, seed, device)

    digest = lines_digest(lines)
    peer = hello(
        link,
        HELLO,
        {
            "role": "electra-generator",
            "config": asdict(cfg),
            "seed": seed,
            "tokenizer": tok.to_str(),
            "text_digest": digest,
            "checkpoints": store.steps(),
        },
        cfg.recv_timeout_s,
    )
    _check_peer(peer, "electra-discriminator", cfg, seed)
    mode = "shared" if peer["text_digest"] == digest else "full"
    start = resume_step(store.steps(), peer["checkpoints"])
    if start:
        tensors, meta = store.load(start)
        restore_training_state(tensors, meta, side.model, side.opt, side.generators())

    sender = AsyncSender(link)
    result = RoleResult(start_step=start, last_step=start, stopped=False)
    last_synced, peer_stopped = start, False
    sent_total = 0

    def take_sync() -> None:
        nonlocal last_synced, peer_stopped
        sync = link.recv(SYNC, timeout=cfg.recv_timeout_s)
        assert isinstance(sync, torch.Tensor)
        last_synced = int(sync[0])
        peer_stopped = peer_stopped or bool(sync[3] > 0)

    for k in range(start + 1, cfg.steps + 1):
        if hooks.stop_requested():
            result.stopped = True
            break
        while k - last_synced > cfg.max_lag and not peer_stopped:
            take_sync()  # pace: D is more than max_lag steps behind
        if peer_stopped:
            result.stopped = True
            break
        t0 = time.perf_counter()
        mlm, tokens, sent = 0.0, 0, 0
        for m in range(cfg.n_discriminators):
            index, original, batch, loss = side.micro_batch(k, m)
            blob = encode_batch(mode, k, m, index, original, batch, V, len(ids))
            sender.send(BATCH, blob)  # goes out while the next micro-batch computes
            mlm += loss / cfg.n_discriminators
            tokens += int((original != PAD_ID).sum())
            sent += len(blob)
        side.step(k)
        sent_total += sent
        result.last_step = k
        if k % cfg.ckpt_every == 0 or k == cfg.steps:
            tensors, meta = training_state(side.model, side.opt, side.generators())
            hooks.checkpointed(k, store.save(k, tensors, {**meta, "step": k}))
        metrics = {
            "mlm_loss": mlm,
            "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
            "bytes_to_discriminator": float(sent),
            "bytes_to_discriminator_total": float(sent_total),
            "bytes_per_token": sent / max(tokens, 1),
        }
        result.history.append(metrics)
        hooks.metrics(k, metrics)
    if result.stopped and not peer_stopped:
        sender.send(BATCH, pack_message({"kind": "stop"}))
    sender.close()
    while last_synced < result.last_step and not peer_stopped:
        take_sync()  # let D finish every step that was sent
    result.extra["mode_shared"] = float(mode == "shared")
    return result


def _check_peer(peer: dict[str, Any], role: str, cfg: ElectraConfig, seed: int) -> None:
    if peer.get("role") != role:
        raise ValueError(f"expected the {role} role at the other end, got {peer.get('role')!r}")
    if peer["config"] != asdict(cfg) or peer["seed"] != seed:
        raise ValueError("the two ELECTRA roles were given different configs or seeds")


# ---------------------------------------------------------------- the discriminator role


def run_electra_discriminator(
    cfg: ElectraConfig,
    link: Link,
    text_lines: Iterable[str] | None,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-I, cluster D: train the discriminator (n replicas) on what G sends.

    `text_lines` is None when this cluster may not read the job's text (full
    mode). The result's `artifact` is `ckpt_dir / "model.safetensors"`, the
    trained discriminator with its tokenizer (see `export_pretrained`).
    """
    hooks = hooks or Hooks()
    store = CheckpointStore(ckpt_dir, keep=cfg.keep_checkpoints, key=hooks.checkpoint_key)
    lines = clean_lines(text_lines) if text_lines is not None else None
    peer = hello(
        link,
        HELLO,
        {
            "role": "electra-discriminator",
            "config": asdict(cfg),
            "seed": seed,
            "text_digest": lines_digest(lines) if lines is not None else None,
            "checkpoints": store.steps(),
        },
        cfg.recv_timeout_s,
    )
    _check_peer(peer, "electra-generator", cfg, seed)
    tok = Tokenizer.from_str(peer["tokenizer"])
    V = tok.get_vocab_size()
    shared = lines is not None and peer["text_digest"] == lines_digest(lines)
    text_ids = encode_lines(tok, lines, cfg.seq_len) if shared and lines is not None else None
    start = resume_step(store.steps(), peer["checkpoints"])
    n = cfg.n_discriminators

    from workers.training.replicas import discriminator_replicas  # it imports this module

    with discriminator_replicas(cfg, seed, device, store, V, start, hooks) as group:
        side = DiscriminatorSide(cfg, V, seed, group.device)
        if start:
            tensors, meta = store.load(start)
            restore_training_state(tensors, meta, side.model, side.opt, side.generators())
            group.restore_rng(tensors, side)
        sender = AsyncSender(link)
        result = RoleResult(start_step=start, last_step=start, stopped=False)
        sent_total = 0
        for k in range(start + 1, cfg.steps + 1):
            if hooks.stop_requested():
                result.stopped = True
                sender.send(SYNC, torch.tensor([result.last_step, 0.0, 0.0, 1.0]))
                break
            t0 = time.perf_counter()
            batches: list[CorruptedBatch] = []
            for _ in range(n):
                header, arrays = unpack_message(
                    expect_bytes(link.recv(BATCH, timeout=cfg.recv_timeout_s))
                )
                if header["kind"] == "stop":
                    break
                if (header["step"], header["micro"]) != (k, len(batches)):
                    raise RuntimeError(f"out-of-order batch {header} at step {k}")
                batches.append(decode_batch(header, arrays, text_ids))
            if len(batches) < n:
                result.stopped = True
                break
            rtd, acc, tokens = group.train_step(side, k, batches)
            side.step(k)
            sync = torch.tensor([float(k), rtd, acc, 0.0])  # small, and keeps G at D's pace
            sender.send(SYNC, sync)
            sent_total += sync.numel() * sync.element_size()
            result.last_step = k
            if k % cfg.ckpt_every == 0 or k == cfg.steps:
                tensors, meta = training_state(side.model, side.opt, side.generators())
                tensors.update(group.gather_rng(side))
                hooks.checkpointed(k, store.save(k, tensors, {**meta, "step": k}))
            metrics = {
                "rtd_loss": rtd,
                "rtd_accuracy": acc,
                "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
                "bytes_to_generator": float(sync.numel() * sync.element_size()),
                "bytes_to_generator_total": float(sent_total),
            }
            result.history.append(metrics)
            hooks.metrics(k, metrics)
        sender.close()
        result.extra["replica_max_abs_diff"] = group.replica_max_abs_diff(side)
        if not result.stopped:
            info = {"steps": result.last_step, "seed": seed, "preset_config": asdict(cfg)}
            result.artifact = store.write_file(
                "model.safetensors", export_pretrained(side.model, tok, info)
            )
    return result


def parameter_counts(cfg: ElectraConfig, vocab_size: int | None = None) -> dict[str, int]:
    """Parameters of the generator and the discriminator (built on the meta device)."""
    V = vocab_size or cfg.vocab_size
    with torch.device("meta"):
        g = Generator(cfg.generator_body(V))
        d = Discriminator(cfg.discriminator_body(V))
    return {"generator": count_parameters(g), "discriminator": count_parameters(d)}
