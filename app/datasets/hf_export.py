"""A Nebula-trained ELECTRA model as a tar of a Hugging Face folder, written as it streams.

The discriminator becomes an `ElectraForPreTraining`, the generator an
`ElectraForMaskedLM`, each with config.json, model.safetensors and the job's
tokenizer.json. No torch: a safetensors file is a JSON header and raw bytes, so the
conversion renames tensors (contract/hf_weight_maps.py), splits the fused key/value
projection into its two halves (contiguous rows, so contiguous bytes) and adds zero
token-type embeddings (adding zeros changes nothing). Sizes are known from the header,
so the tar's length is known before the first byte goes out, and the weights pass
through one chunk at a time.

Only a model trained with BERT's post-LN layout (`post_ln: true` in the job's config)
is an ELECTRA: Nebula's default pre-LN body has no Hugging Face equivalent, and is
refused (409) rather than exported as something that computes differently.
"""

from __future__ import annotations

import json
import math
import struct
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.datasets.formats import MAX_SAFETENSORS_HEADER, SAFETENSORS_DTYPES
from app.errors import Conflict, Invalid
from contract.hf_layout import body_tensors, head_tensors, parse_config
from contract.hf_weight_maps import weight_map
from contract.model_limits import ModelTooLarge, check_bert_config

BLOCK = 512
ARCHITECTURES = {
    "electra-discriminator": "ElectraForPreTraining",
    "electra-generator": "ElectraForMaskedLM",
}
TYPE_VOCAB_SIZE = 2  # BERT's and ELECTRA's; Nebula's models have no token types
PAD_ID = 0  # "[PAD]": Nebula's tokenizers put their special tokens at ids 0..4


class _Chunks:
    """Exact reads from an iterator of chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int) -> bytes:
        """Exactly `n` bytes (Invalid if the stream ends first)."""
        parts, need = [], n
        while need:
            if not self._buf:
                self._buf = next(self._chunks, b"")
                if not self._buf:
                    raise Invalid("the stored model ends early")
            part, self._buf = self._buf[:need], self._buf[need:]
            parts.append(part)
            need -= len(part)
        return b"".join(parts)

    def stream(self, n: int) -> Iterator[bytes]:
        """The next `n` bytes, a chunk at a time."""
        while n:
            if not self._buf:
                self._buf = next(self._chunks, b"")
                if not self._buf:
                    raise Invalid("the stored model ends early")
            part, self._buf = self._buf[:n], self._buf[n:]
            n -= len(part)
            yield part


@dataclass(frozen=True)
class _Piece:
    """One tensor of the output: a span of the input's data, or zeros."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    size: int
    zeros: bool = False


def _hf_config(meta: dict[str, str], architecture: str) -> dict[str, Any]:
    try:
        body = check_bert_config(json.loads(meta.get("config") or "null"))
    except (ValueError, RecursionError):
        raise Invalid("the stored model's config is not readable") from None
    if not body.get("post_ln", False):
        raise Conflict(
            "this model has Nebula's pre-LN body, which no Hugging Face ELECTRA computes: "
            "train with post_ln: true in the job's config to export it"
        )
    if body.get("position_pad_id", -1) != -1 or body.get("type_vocab_size", 0) not in (0, 2):
        raise Conflict("this model's layout is not ELECTRA's")
    return {
        "architectures": [architecture],
        "model_type": "electra",
        "vocab_size": body["vocab_size"],
        "embedding_size": body.get("d_embed") or body["d_model"],
        "hidden_size": body["d_model"],
        "num_hidden_layers": body["n_layers"],
        "num_attention_heads": body["n_heads"],
        "intermediate_size": body["d_ff"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": body.get("dropout", 0.1),
        "attention_probs_dropout_prob": 0.0,  # Nebula's attention has no dropout
        "max_position_embeddings": body["max_len"],
        "type_vocab_size": TYPE_VOCAB_SIZE,
        "layer_norm_eps": body.get("layer_norm_eps", 1e-12),
        "pad_token_id": PAD_ID,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


class HfExport:
    """The tar of one model's Hugging Face folder: `size` bytes from `chunks()`."""

    def __init__(self, chunks: Iterator[bytes], folder: str) -> None:
        self._in = _Chunks(chunks)
        self.folder = folder
        (header_len,) = struct.unpack("<Q", self._in.read(8))
        if not 2 <= header_len <= MAX_SAFETENSORS_HEADER:
            raise Invalid("the stored model is not a safetensors file")
        header = json.loads(self._in.read(header_len))
        meta = header.pop("__metadata__", {})
        architecture = ARCHITECTURES.get(meta.get("nebula.architecture", ""))
        if architecture is None:
            raise Conflict("only ELECTRA models that Nebula trained export to Hugging Face")
        self.config = _hf_config(meta, architecture)
        self.tokenizer = meta.get("tokenizer", "").encode()
        try:
            cfg = parse_config(self.config)
        except ModelTooLarge as exc:
            raise Conflict(f"this model does not export: {exc}") from None
        names = weight_map(cfg)
        heads = set(head_tensors(cfg))
        shapes = {
            **{f"electra.{k}": v for k, v in body_tensors(cfg).items()},
            **head_tensors(cfg),
        }
        ordered = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
        optional = {"body.embed.segment.weight"}  # zeros when the model has no token types
        if set(header) - optional != set(names) - optional:
            raise Conflict("this model's tensors are not an ELECTRA's")
        self._pieces: list[_Piece] = []
        dtype = "F32"
        for ours, info in ordered:
            dtype = info["dtype"]
            theirs = [t if t in heads else f"electra.{t}" for t in names[ours]]
            total = math.prod(info["shape"]) * SAFETENSORS_DTYPES[dtype]
            for hf_name in theirs:
                shape = tuple(shapes[hf_name])
                self._pieces.append(_Piece(hf_name, dtype, shape, total // len(theirs)))
            if sum(math.prod(shapes[t]) for t in theirs) != math.prod(info["shape"]):
                raise Conflict(f"tensor {ours!r} does not match the config")
        if "body.embed.segment.weight" not in header:
            name = "electra.embeddings.token_type_embeddings.weight"
            shape = tuple(shapes[name])
            size = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
            self._pieces.append(_Piece(name, dtype, shape, size, zeros=True))
        out_header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for piece in self._pieces:
            out_header[piece.name] = {
                "dtype": piece.dtype,
                "shape": list(piece.shape),
                "data_offsets": [offset, offset + piece.size],
            }
            offset += piece.size
        raw = json.dumps(out_header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # keeps the data 8-byte aligned
        self._st_head = struct.pack("<Q", len(raw)) + raw
        self._st_size = len(self._st_head) + offset
        self._small = {
            "config.json": json.dumps(self.config, indent=2).encode(),
            "tokenizer.json": self.tokenizer,
            "tokenizer_config.json": json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "model_max_length": self.config["max_position_embeddings"],
                    "unk_token": "[UNK]",
                    "pad_token": "[PAD]",
                    "cls_token": "[CLS]",
                    "sep_token": "[SEP]",
                    "mask_token": "[MASK]",
                }
            ).encode(),
        }
        self.size = (
            sum(BLOCK + _padded(len(d)) for d in self._small.values())
            + self._header_size("model.safetensors", self._st_size)
            + _padded(self._st_size)
            + 2 * BLOCK
        )

    def _member_header(self, name: str, size: int) -> bytes:
        info = tarfile.TarInfo(f"{self.folder}/{name}")
        info.size, info.mode = size, 0o644
        return info.tobuf(format=tarfile.USTAR_FORMAT)

    def _header_size(self, name: str, size: int) -> int:
        return len(self._member_header(name, size))

    def chunks(self) -> Iterator[bytes]:
        """The tar, a member at a time; the weights a chunk at a time."""
        for name, data in self._small.items():
            yield self._member_header(name, len(data)) + data + b"\0" * (-len(data) % BLOCK)
        yield self._member_header("model.safetensors", self._st_size) + self._st_head
        for piece in self._pieces:
            if piece.zeros:
                yield bytes(piece.size)
            else:
                yield from self._in.stream(piece.size)
        yield b"\0" * (-self._st_size % BLOCK) + b"\0" * (2 * BLOCK)


def _padded(size: int) -> int:
    return size + (-size % BLOCK)


def folder_name(dataset_name: str) -> str:
    """A folder name from a dataset's name: letters, digits, '-', '_' and '.'."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in dataset_name)
    return safe.strip(".-")[:100] or "model"
