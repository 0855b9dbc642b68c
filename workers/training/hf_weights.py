"""Hugging Face BERT, ELECTRA and (XLM-)RoBERTa checkpoints as Nebula models.

The weight-name maps, one per architecture, are pure data in contract/hf_weight_maps.py
(the control plane's export uses them too). `load_hf_archive` reads a tar of a Hugging
Face folder from memory: safetensors only (`safetensors.torch.load` reads raw tensors;
nothing is unpickled), the tensors checked against config.json (contract/hf_layout.py)
before a module is built, and the folder's own tokenizer. The control plane made the
same checks at upload; a worker makes them again because the bytes are all it trusts.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_safetensors_bytes
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from torch import nn

from contract.hf_layout import (
    MAX_MEMBERS,
    SINGLE_WEIGHTS,
    HfConfig,
    LayoutError,
    archive_kind,
    check_tensors,
    file_member,
    member_path,
    parse_config,
    refuse_unsafe_file,
    strip_prefix,
    tokenizer_file,
    weights_layout,
)
from contract.hf_weight_maps import weight_map
from workers.training.bert import BertConfig, Encoder
from workers.training.electra.model import Discriminator, Generator


def body_config(cfg: HfConfig) -> BertConfig:
    """Nebula's body config for a Hugging Face config."""
    return BertConfig(
        vocab_size=cfg.vocab_size,
        max_len=cfg.max_position_embeddings,
        d_model=cfg.hidden_size,
        n_layers=cfg.num_hidden_layers,
        n_heads=cfg.num_attention_heads,
        d_ff=cfg.intermediate_size,
        dropout=cfg.dropout,
        layer_norm_eps=cfg.layer_norm_eps,
        post_ln=True,
        type_vocab_size=cfg.type_vocab_size,
        d_embed=0 if cfg.embedding_size == cfg.hidden_size else cfg.embedding_size,
        position_pad_id=cfg.position_pad_id,
    )


# ------------------------------------------------------------------ reading a folder


@dataclass
class ImportedModel:
    """A Hugging Face checkpoint as a Nebula module, with its tokenizer."""

    config: HfConfig
    body: BertConfig
    model: nn.Module  # Encoder (a bare body), Generator (masked LM) or Discriminator
    tokenizer: Tokenizer

    @property
    def encoder(self) -> Encoder:
        """The body, whatever head sits on it."""
        return self.model if isinstance(self.model, Encoder) else self.model.body  # type: ignore[return-value]


def is_archive(blob: bytes) -> bool:
    """Whether a `model` dataset's bytes are a tar (plain or gzip), not a Nebula file."""
    return archive_kind(blob) is not None


def _folder_files(blob: bytes) -> dict[str, bytes]:
    """Basename -> bytes of each regular file in the archive; links, pickles, escaping paths
    and nested folders refused (LayoutError, a ValueError), as at upload."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
        members = archive.getmembers()
        if len(members) > MAX_MEMBERS:
            raise LayoutError(f"more than {MAX_MEMBERS} members")
        for member in members:
            if member.isdir():
                member_path(member.name)
                continue
            if not member.isfile():
                raise LayoutError(f"member {member.name[:120]!r} is not a regular file")
            _, base = file_member(member.name)
            refuse_unsafe_file(base)
            if base in files:
                raise ValueError(f"member {base[:120]!r} appears twice")
            extracted = archive.extractfile(member)
            assert extracted is not None  # a regular file
            files[base] = extracted.read()
    return files


def wordpiece_from_vocab(vocab_txt: str, lowercase: bool) -> Tokenizer:
    """BERT's WordPiece tokenizer from a vocab.txt, as `BertTokenizerFast` builds it."""
    vocab = {token: i for i, token in enumerate(vocab_txt.splitlines())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.get("[CLS]", 0)), ("[SEP]", vocab.get("[SEP]", 0))],
    )
    tok.decoder = decoders.WordPiece()
    return tok


def _tokenizer(cfg: HfConfig, files: dict[str, bytes]) -> Tokenizer:
    if tokenizer_file(cfg, files) == "tokenizer.json":
        return Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    settings = json.loads(files["tokenizer_config.json"])
    return wordpiece_from_vocab(
        files["vocab.txt"].decode("utf-8"), bool(settings.get("do_lower_case", True))
    )


def _tensors(files: dict[str, bytes]) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors or of the shards its index names."""
    where = weights_layout(files)
    if where == SINGLE_WEIGHTS:
        return load_safetensors_bytes(files[SINGLE_WEIGHTS])
    index = json.loads(files[where])["weight_map"]
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index.values())):
        tensors.update(load_safetensors_bytes(files[shard]))
    return tensors


def load_hf_archive(blob: bytes, device: str = "cpu") -> ImportedModel:
    """A tar of a Hugging Face folder as a Nebula module in eval mode (ValueError if unfit)."""
    files = _folder_files(blob)
    if "config.json" not in files:
        raise ValueError("config.json is missing")
    cfg = parse_config(json.loads(files["config.json"]))  # ModelTooLarge is a ValueError
    saved = _tensors(files)
    shapes = {name: (_dtype_name(t), tuple(t.shape)) for name, t in saved.items()}
    check_tensors(cfg, shapes)  # before anything is built
    plain = {strip_prefix(cfg, name): tensor for name, tensor in saved.items()}
    body = body_config(cfg)
    model: nn.Module
    if cfg.head == "discriminator":
        model = Discriminator(body)
    elif cfg.head == "mlm":
        model = Generator(body)
    else:
        model = Encoder(body)
    state = {
        ours: torch.cat([plain[name].float() for name in theirs], dim=0)
        for ours, theirs in weight_map(cfg).items()
    }
    model.load_state_dict(state, strict=True)
    return ImportedModel(cfg, body, model.to(device).eval(), _tokenizer(cfg, files))


_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}


def _dtype_name(tensor: torch.Tensor) -> str:
    return _DTYPES.get(tensor.dtype, str(tensor.dtype))
