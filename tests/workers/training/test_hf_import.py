"""Hugging Face checkpoints imported through the API compute what `transformers` computes.

For each architecture a small random model is built with `transformers` (the config made
here, saved with `save_pretrained`, nothing downloaded), uploaded as a tar of its folder
through the API, read back, and loaded by Nebula (workers/training/hf_weights.py). On
the same ids, with padding, Nebula's last hidden state, and its masked-LM or
replaced-token logits where the model has that head, equal the reference to 1e-5.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from tokenizers import Tokenizer, models, pre_tokenizers

from support import Platform
from tests.app.datasets.test_datasets import API, new_workspace, upload
from workers.training.hf_weights import ImportedModel, load_hf_archive

TOLERANCE = 1e-5
SIZES: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 40,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
}
WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(40)]]
BPE_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _bert_tokenizer(folder: Path, *, fast: bool) -> None:
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(WORDPIECE) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(vocab))
    tok.save_pretrained(folder)
    if not fast:
        (folder / "tokenizer.json").unlink()  # vocab.txt with tokenizer_config.json


def _bpe_tokenizer(folder: Path, *, unigram: bool) -> None:
    words = [f"\u0120w{i}" for i in range(40)]
    if unigram:
        model: Any = models.Unigram(
            [(t, -1.0) for t in [*BPE_SPECIAL, *words]], unk_id=3, byte_fallback=False
        )
    else:
        vocab = {t: i for i, t in enumerate([*BPE_SPECIAL, *words])}
        model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>")
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


CASES: dict[str, tuple[Any, Any, dict[str, Any], Any]] = {
    # architecture: (config class, model class, extra config, tokenizer writer)
    "BertModel": (
        transformers.BertConfig,
        transformers.BertModel,
        {},
        lambda f: _bert_tokenizer(f, fast=True),
    ),
    "BertForMaskedLM": (
        transformers.BertConfig,
        transformers.BertForMaskedLM,
        {},
        lambda f: _bert_tokenizer(f, fast=False),
    ),
    "BertForPreTraining": (
        transformers.BertConfig,
        transformers.BertForPreTraining,
        {},
        lambda f: _bert_tokenizer(f, fast=True),
    ),
    "ElectraModel": (
        transformers.ElectraConfig,
        transformers.ElectraModel,
        {"embedding_size": 16},
        lambda f: _bert_tokenizer(f, fast=True),
    ),
    "ElectraForPreTraining": (
        transformers.ElectraConfig,
        transformers.ElectraForPreTraining,
        {"embedding_size": 16},
        lambda f: _bert_tokenizer(f, fast=True),
    ),
    "ElectraForMaskedLM": (
        transformers.ElectraConfig,
        transformers.ElectraForMaskedLM,
        {"embedding_size": 16},
        lambda f: _bert_tokenizer(f, fast=False),
    ),
    "RobertaModel": (
        transformers.RobertaConfig,
        transformers.RobertaModel,
        {"pad_token_id": 1, "type_vocab_size": 1},
        lambda f: _bpe_tokenizer(f, unigram=False),
    ),
    "RobertaForMaskedLM": (
        transformers.RobertaConfig,
        transformers.RobertaForMaskedLM,
        {"pad_token_id": 1, "type_vocab_size": 1},
        lambda f: _bpe_tokenizer(f, unigram=False),
    ),
    "XLMRobertaModel": (
        transformers.XLMRobertaConfig,
        transformers.XLMRobertaModel,
        {"pad_token_id": 1, "type_vocab_size": 1},
        lambda f: _bpe_tokenizer(f, unigram=True),
    ),
    "XLMRobertaForMaskedLM": (
        transformers.XLMRobertaConfig,
        transformers.XLMRobertaForMaskedLM,
        {"pad_token_id": 1, "type_vocab_size": 1},
        lambda f: _bpe_tokenizer(f, unigram=True),
    ),
}


def reference_folder(architecture: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """A random `architecture` saved as a Hugging Face folder in `folder`; returns the model."""
    config_class, model_class, extra, write_tokenizer = CASES[architecture]
    torch.manual_seed(seed)
    config = config_class(**SIZES, **extra)
    model = model_class(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return model


def tar_folder(folder: Path, *, gzip: bool = True) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gzip else "w") as tar:
        tar.add(folder, arcname=folder.name)
    return out.getvalue()


def batch(pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences of ids (away from the special ones), the second padded at its end."""
    ids = torch.randint(5, SIZES["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(7))
    ids[1, 9:] = pad_id
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def nebula_outputs(
    imported: ImportedModel, ids: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    valid = mask.bool()
    with torch.no_grad():
        out = {"hidden": imported.encoder(ids, valid)}
        if imported.config.head == "mlm":
            out["logits"] = imported.model(ids, valid, torch.ones_like(valid))  # (B*T, V)
        elif imported.config.head == "discriminator":
            out["logits"] = imported.model(ids, valid)  # (B, T)
    return out


def reference_outputs(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    out = {"hidden": result.hidden_states[-1]}
    logits = getattr(result, "logits", None)
    if logits is None:
        logits = getattr(result, "prediction_logits", None)
    if logits is not None:
        out["logits"] = logits.reshape(-1, logits.shape[-1]) if logits.dim() == 3 else logits
    return out


@pytest.mark.parametrize("architecture", sorted(CASES))
def test_an_imported_model_computes_what_transformers_computes(
    client: TestClient,
    platform: Platform,
    tmp_path: Path,
    architecture: str,
    request: pytest.FixtureRequest,
) -> None:
    if "postgresql" in request.node.callspec.id:
        pytest.skip("the numerics do not depend on the database; sqlite runs them")
    folder = tmp_path / "model"
    reference = reference_folder(architecture, folder)
    blob = tar_folder(folder)
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, blob, kind="model", name=architecture)
    assert status == 201, body
    info = body["model"]
    assert info["architecture"] == architecture and info["format"] == "huggingface"
    assert (info["hidden_size"], info["layers"], info["vocab_size"]) == (32, 2, 64)
    assert info["tokenizer"] in {"WordPiece", "BPE", "Unigram"}
    content = client.get(f"{API}/datasets/{body['id']}/content", headers=alice.headers)
    assert content.status_code == 200
    imported = load_hf_archive(content.content)
    assert imported.tokenizer.get_vocab_size() <= 64
    pad_id = reference.config.pad_token_id
    ids, mask = batch(pad_id)
    ours, theirs = nebula_outputs(imported, ids, mask), reference_outputs(reference, ids, mask)
    assert set(ours) == set(theirs)
    for name in ours:
        assert ours[name].shape == theirs[name].shape, name
        difference = (ours[name] - theirs[name]).abs().max().item()
        assert difference <= TOLERANCE, f"{name}: {difference}"
    # the parameter count shown is the weights Nebula uses
    used = sum(p.numel() for p in imported.model.parameters())
    assert info["parameters"] == used


def test_a_pickle_in_the_folder_is_refused_by_the_worker_too(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    reference = reference_folder("BertModel", folder)
    torch.save(reference.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pickle"):
        load_hf_archive(tar_folder(folder))
