"""Hugging Face folders for the import, export and training tests: small models with random
weights built by `transformers` itself (nothing downloaded), BERT's vocabulary layout, and
the gzip tar that a folder is uploaded as."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import torch

from workers.training.data import SPECIAL_TOKENS, train_tokenizer


def save_random_model(
    folder: Path, config_class: Any, model_class: Any, *, seed: int, **config: Any
) -> torch.nn.Module:
    """A `model_class` of `config_class(**config)` with the random weights of torch's `seed`,
    saved in `folder` as `save_pretrained` writes it (safetensors); returns the model."""
    torch.manual_seed(seed)
    model = model_class(config_class(**config))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def wordpiece_vocab(lines: list[str]) -> list[str]:
    """A WordPiece vocabulary of `lines` laid out as BERT's is: [PAD] first, then unused
    slots, then [UNK] [CLS] [SEP] [MASK] (away from Nebula's own special ids), then words."""
    nebula = train_tokenizer(lines, 600, 1)
    words = [
        t
        for t, _ in sorted(nebula.get_vocab().items(), key=lambda kv: kv[1])
        if t not in SPECIAL_TOKENS
    ]
    return [
        "[PAD]",
        *[f"[unused{i}]" for i in range(5)],
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *words,
    ]


def write_wordpiece_files(folder: Path, vocab: list[str]) -> None:
    """A new `folder` holding vocab.txt with tokenizer_config.json, as BERT's own folders have
    them (transformers 5's BertTokenizerFast no longer builds its vocabulary from a vocab_file)."""
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}')


def tar_folder(folder: Path, *, gzip: bool = True) -> bytes:
    """`folder` as a tar (gzip by default) holding it under its own name."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gzip else "w") as tar:
        tar.add(folder, arcname=folder.name)
    return out.getvalue()
