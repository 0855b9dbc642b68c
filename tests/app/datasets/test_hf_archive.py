"""A `model` upload that is a tar of a Hugging Face folder: accepted with its description, or a
422 naming what is wrong, with nothing stored and the quota unchanged.

The folders here are built from the layout alone (numpy tensors, no torch, no transformers):
the control plane's check reads headers and config.json, never the weights' values.
tests/workers/training/test_hf_import.py builds real ones with `transformers`.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors

from app.settings import Settings
from contract.hf_layout import body_tensors, head_tensors, parse_config
from support.datasets import API, assert_nothing_left, new_workspace, upload, used
from support.platforms import Platform

CONFIG = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "vocab_size": 40,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(30)]]
TOKENIZER = {
    "version": "1.0",
    "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(VOCAB[:5])],
    "model": {
        "type": "WordPiece",
        "unk_token": "[UNK]",
        "vocab": {t: i for i, t in enumerate(VOCAB)},
    },
}


def weights(config: dict, *, prefix: str = "bert.", change: dict | None = None) -> bytes:
    """model.safetensors for `config`, from the layout; `change` overrides some shapes."""
    cfg = parse_config(config)
    shapes = {prefix + k: v for k, v in body_tensors(cfg).items()} | head_tensors(cfg)
    shapes |= change or {}
    tensors = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    return bytes(save_safetensors(tensors, metadata={"format": "pt"}))


def folder(**override: bytes | None) -> dict[str, bytes]:
    """The files of a valid BertForMaskedLM folder, with some replaced (None: removed)."""
    files: dict[str, bytes | None] = {
        "config.json": json.dumps(CONFIG).encode(),
        "model.safetensors": weights(CONFIG),
        "tokenizer.json": json.dumps(TOKENIZER).encode(),
        "tokenizer_config.json": b'{"do_lower_case": true}',
        "vocab.txt": "\n".join(VOCAB).encode() + b"\n",
    }
    files.update(override)
    return {k: v for k, v in files.items() if v is not None}


def archive(
    files: dict[str, bytes],
    *,
    compress: bool = False,
    root: str = "tiny-bert/",
    extra: list[tarfile.TarInfo] | None = None,
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if root:
            tar.addfile(_info(root.rstrip("/"), tarfile.DIRTYPE))
        for name, data in files.items():
            tar.addfile(_info(root + name, size=len(data)), io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    raw = out.getvalue()
    return gzip.compress(raw) if compress else raw


def _without_end_marker() -> bytes:
    """A whole archive cut right after its last member: only the end-of-archive marker lacks."""
    raw = archive(folder())
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        last = tar.getmembers()[-1]
    return raw[: last.offset_data + -(-last.size // 512) * 512]


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, link, 0o644
    return info


@pytest.mark.parametrize("compress", [False, True])
def test_a_hugging_face_folder_is_accepted_with_its_description(
    client: TestClient, platform: Platform, compress: bool
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    blob = archive(folder(), compress=compress)
    status, body = upload(client, alice, ws, blob, kind="model", name="tiny-bert")
    assert status == 201, body
    cfg = parse_config(CONFIG)
    expected_parameters = sum(
        int(np.prod(s)) for s in [*body_tensors(cfg).values(), *head_tensors(cfg).values()]
    )
    assert body["model"] == {
        "format": "huggingface",
        "architecture": "BertForMaskedLM",
        "parameters": expected_parameters,
        "hidden_size": 16,
        "layers": 2,
        "vocab_size": 40,
        "tokenizer": "WordPiece",
    }
    shown = client.get(f"{API}/datasets/{body['id']}", headers=alice.headers).json()
    assert shown["model"] == body["model"]
    content = client.get(f"{API}/datasets/{body['id']}/content", headers=alice.headers)
    assert content.content == blob  # stored as uploaded
    assert used(platform, ws) == len(blob)


def test_a_folder_with_vocab_txt_and_sharded_weights_is_accepted(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    cfg = parse_config(CONFIG)
    shapes = {"bert." + k: v for k, v in body_tensors(cfg).items()} | head_tensors(cfg)
    names = sorted(shapes)
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    files = folder(**{"model.safetensors": None, "tokenizer.json": None})
    weight_map = {}
    for shard, tensors in halves.items():
        files[shard] = bytes(
            save_safetensors({t: np.zeros(shapes[t], np.float32) for t in tensors})
        )
        weight_map |= dict.fromkeys(tensors, shard)
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    status, body = upload(client, alice, ws, archive(files, root=""), kind="model")
    assert status == 201, body
    assert body["model"]["tokenizer"] == "WordPiece"


def test_a_nebula_checkpoint_still_uploads_and_describes_itself(
    client: TestClient, platform: Platform
) -> None:
    from support.platforms import model_file_bytes

    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, model_file_bytes(), kind="model")
    assert status == 201, body
    assert body["model"] is None  # not an ELECTRA discriminator: nothing to describe


def _many_members() -> bytes:
    # 10,000 entries, each harmless alone (the folder again and again)
    return archive(folder(), extra=[_info("tiny-bert", tarfile.DIRTYPE) for _ in range(10_000)])


def _big_config() -> bytes:
    # 10^12 parameters: each field within its own bound would still be over the total
    huge = CONFIG | {
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_hidden_layers": 128,
        "intermediate_size": 65536,
        "vocab_size": 250_000,
    }
    return json.dumps(huge).encode()


BAD = [
    pytest.param(
        folder(**{"pytorch_model.bin": pickle.dumps({"w": [1.0]})}), "is a pickle", id="bin"
    ),
    pytest.param(folder(**{"optimizer.pt": b"\x80\x04K\x01."}), "is a pickle", id="pt"),
    pytest.param(folder(**{"../config.json": b"{}"}), "'..'", id="dotdot"),
    pytest.param(folder(**{"model.onnx": b"x"}), "only safetensors", id="onnx"),
    pytest.param(
        folder(**{"tokenizer.json": None, "vocab.txt": None}),
        "tokenizer is missing",
        id="no-tokenizer",
    ),
    pytest.param(folder(**{"tokenizer.json": b"{not json"}), "tokenizer.json", id="bad-tokenizer"),
    pytest.param(
        folder(**{"tokenizer.json": json.dumps({"model": {"type": "Magic"}}).encode()}),
        "not a readable tokenizer",
        id="odd-tokenizer",
    ),
    pytest.param(
        folder(
            **{"config.json": json.dumps(CONFIG | {"architectures": ["GPT2LMHeadModel"]}).encode()}
        ),
        "'GPT2LMHeadModel' is not importable",
        id="architecture",
    ),
    pytest.param(folder(**{"config.json": None}), "config.json is missing", id="no-config"),
    pytest.param(folder(**{"config.json": _big_config()}), "parameters, over the limit", id="1e12"),
    pytest.param(
        folder(
            **{
                "model.safetensors": weights(
                    CONFIG, change={"bert.encoder.layer.1.intermediate.dense.weight": (31, 16)}
                )
            }
        ),
        "has shape [31, 16], config.json implies [32, 16]",
        id="shape",
    ),
    pytest.param(
        folder(**{"model.safetensors": weights(CONFIG | {"num_hidden_layers": 1})}),
        "is missing",
        id="missing-layer",
    ),
    pytest.param(
        folder(**{"model.safetensors": None}), "model.safetensors is missing", id="no-weights"
    ),
    pytest.param(
        folder(**{"notes.py": b"import os"}), "unexpected member 'notes.py'", id="unexpected"
    ),
]


@pytest.mark.parametrize(("files", "message"), BAD)
def test_a_bad_folder_is_422_naming_it_and_stores_nothing(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    files: dict[str, bytes],
    message: str,
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, archive(files), kind="model")
    assert status == 422, body
    assert message in body["detail"], body["detail"]
    assert_nothing_left(platform, settings, ws)


ARCHIVES = [
    pytest.param(
        lambda: archive(folder(), extra=[_info("/etc/passwd", size=0)], root=""),
        "absolute path",
        id="absolute",
    ),
    pytest.param(
        lambda: archive(
            folder(), extra=[_info("tiny-bert/evil", tarfile.SYMTYPE, link="/etc/passwd")]
        ),
        "is a link",
        id="symlink",
    ),
    pytest.param(
        lambda: archive(
            folder(), extra=[_info("tiny-bert/hard", tarfile.LNKTYPE, link="tiny-bert/config.json")]
        ),
        "is a link",
        id="hardlink",
    ),
    pytest.param(_many_members, "more than 256 members", id="10000-members"),
    pytest.param(_without_end_marker, "truncated", id="truncated"),
    pytest.param(lambda: archive(folder())[:4096], "truncated", id="truncated-in-a-member"),
    pytest.param(lambda: archive(folder(), compress=True)[:-100], "truncated", id="truncated-gzip"),
    pytest.param(lambda: archive(folder(), root="a/b/"), "nested folder", id="nested"),
]


@pytest.mark.parametrize(("make", "message"), ARCHIVES)
@pytest.mark.parametrize("file_first", [True, False])
def test_a_bad_archive_is_422_naming_it_and_stores_nothing(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    make: object,
    message: str,
    file_first: bool,
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    blob = make()  # type: ignore[operator]
    status, body = upload(client, alice, ws, blob, kind="model", file_first=file_first)
    assert status == 422, body
    assert message in body["detail"], body["detail"]
    assert_nothing_left(platform, settings, ws)
