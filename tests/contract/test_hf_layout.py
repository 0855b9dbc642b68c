"""The layout of a Hugging Face folder in its archive, as both sides check it: a table each.

The control plane's streaming check (tests/app/datasets/test_hf_archive.py) and the
worker's loader (tests/workers/training/test_hf_import.py) test the same rules through
their readers; here the rules alone.
"""

from __future__ import annotations

import pytest

from contract.hf_layout import (
    SINGLE_WEIGHTS,
    WEIGHTS_INDEX,
    HfConfig,
    LayoutError,
    archive_kind,
    file_member,
    is_weights_file,
    parse_config,
    refuse_unsafe_file,
    tokenizer_file,
    weights_layout,
)

TAR_HEAD = bytes(257) + b"ustar" + bytes(250)


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"\x1f\x8b\x08" + bytes(509), "gzip"),
        (TAR_HEAD, "tar"),
        (b'\x10\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{}}', None),
        (b"", None),
    ],
    ids=["gzip", "tar", "safetensors", "empty"],
)
def test_archive_kind(head: bytes, kind: str | None) -> None:
    assert archive_kind(head) == kind


# (member name, (folder, basename), or the refusal's words)
MEMBERS: list[tuple[str, tuple[str, str] | str]] = [
    ("config.json", ("", "config.json")),
    ("bert/config.json", ("bert", "config.json")),
    ("./bert/./config.json", ("bert", "config.json")),
    ("bert/sub/config.json", "nested folder"),
    ("/etc/passwd", "absolute path"),
    ("\\evil", "absolute path"),
    ("C:evil", "absolute path"),
    ("bert\\config.json", "backslash or a control character"),
    ("bert/con\x01fig.json", "backslash or a control character"),
    ("../config.json", "'..' in its path"),
    ("bert/../../x", "'..' in its path"),
    ("", "absolute path"),
]


@pytest.mark.parametrize(("name", "expected"), MEMBERS)
def test_file_member(name: str, expected: tuple[str, str] | str) -> None:
    if isinstance(expected, tuple):
        assert file_member(name) == expected
        return
    with pytest.raises(LayoutError, match=expected.replace("\\", "\\\\")):
        file_member(name)


@pytest.mark.parametrize(
    ("base", "refusal"),
    [
        ("model.safetensors", None),
        ("vocab.txt", None),
        ("pytorch_model.bin", "is a pickle"),
        ("optimizer.PT", "is a pickle"),
        ("weights.npz", "is a pickle"),
        ("tf_model.h5", "only safetensors"),
        ("model.onnx", "only safetensors"),
    ],
)
def test_refuse_unsafe_file(base: str, refusal: str | None) -> None:
    if refusal is None:
        refuse_unsafe_file(base)
        return
    with pytest.raises(LayoutError, match=refusal):
        refuse_unsafe_file(base)


@pytest.mark.parametrize(
    ("base", "weights"),
    [
        ("model.safetensors", True),
        ("model-00001-of-00002.safetensors", True),
        ("model-1-of-2.safetensors", False),
        ("other.safetensors", False),
        (WEIGHTS_INDEX, False),
    ],
)
def test_is_weights_file(base: str, weights: bool) -> None:
    assert is_weights_file(base) is weights


SHARD = "model-00001-of-00002.safetensors"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ({SINGLE_WEIGHTS, "config.json"}, SINGLE_WEIGHTS),
        ({WEIGHTS_INDEX, SHARD}, WEIGHTS_INDEX),
        ({WEIGHTS_INDEX}, WEIGHTS_INDEX),  # the index's check finds its shards missing
        ({SINGLE_WEIGHTS, SHARD}, "both model.safetensors and sharded weights"),
        ({SINGLE_WEIGHTS, WEIGHTS_INDEX}, "both model.safetensors and sharded weights"),
        ({SHARD}, "sharded weights without"),
        ({"config.json"}, "model.safetensors is missing"),
    ],
)
def test_weights_layout(names: set[str], expected: str) -> None:
    if expected in (SINGLE_WEIGHTS, WEIGHTS_INDEX):
        assert weights_layout(names) == expected
        return
    with pytest.raises(LayoutError, match=expected):
        weights_layout(names)


def config(model_type: str, architecture: str) -> dict[str, object]:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": 100,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    }


BERT = parse_config(config("bert", "BertModel"))
ROBERTA = parse_config(config("roberta", "RobertaModel"))
WORDPIECE = {"vocab.txt", "tokenizer_config.json"}


@pytest.mark.parametrize(
    ("cfg", "names", "expected"),
    [
        (BERT, {"tokenizer.json"}, "tokenizer.json"),
        (BERT, {"tokenizer.json", *WORDPIECE}, "tokenizer.json"),
        (BERT, WORDPIECE, "vocab.txt"),
        (BERT, {"vocab.txt"}, "or vocab.txt with tokenizer_config.json"),
        (ROBERTA, {"tokenizer.json"}, "tokenizer.json"),
        (ROBERTA, WORDPIECE, "the tokenizer is missing: tokenizer.json$"),
    ],
    ids=["bert-json", "bert-both", "bert-wordpiece", "bert-none", "roberta-json", "roberta-vocab"],
)
def test_tokenizer_file(cfg: HfConfig, names: set[str], expected: str) -> None:
    if expected in ("tokenizer.json", "vocab.txt"):
        assert tokenizer_file(cfg, names) == expected
        return
    with pytest.raises(LayoutError, match=expected):
        tokenizer_file(cfg, names)
