"""`train_electra_local`: both roles in one process, the reference a split run must equal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Tokenizer

from workers.training.data import SpecialIds, clean_lines, encode_lines
from workers.training.electra.config import ElectraConfig
from workers.training.electra.sides import DiscriminatorSide, GeneratorSide, Initial, job_tokenizer


@dataclass
class LocalElectraRun:
    """Result of `train_electra_local`."""

    generator: GeneratorSide
    discriminator: DiscriminatorSide
    tokenizer: Tokenizer
    history: list[dict[str, float]]


def train_electra_local(
    cfg: ElectraConfig,
    text_lines: Iterable[str],
    *,
    seed: int = 0,
    device: str = "cpu",
    steps: int | None = None,
    tokenizer: Tokenizer | None = None,
    init_generator: Initial | None = None,
    init_discriminator: Initial | None = None,
) -> LocalElectraRun:
    """Both roles in one process, no link: the reference a split run must equal.

    Pass the split run's `tokenizer` (its generator's `tokenizer.json`) to
    compare: the `tokenizers` WordPiece trainer breaks ties in hash-map order,
    so two trainings on the same text may differ. With pretrained models (`init_*`) pass
    their tokenizer too.
    """
    lines = clean_lines(text_lines)
    tok = tokenizer or job_tokenizer(cfg, lines, None)
    V = tok.get_vocab_size()
    ids = encode_lines(tok, lines, cfg.seq_len)
    sp = SpecialIds.of(tok)
    g = GeneratorSide(cfg, ids, V, seed, device, special=sp, init=init_generator)
    d = DiscriminatorSide(cfg, V, seed, device, special=sp, init=init_discriminator)
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
