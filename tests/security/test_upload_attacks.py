"""Model files that claim more than they hold: refused at upload (422) and by the worker."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors

from contract.model_limits import ModelTooLarge
from support.platforms import Platform
from workers.training.bert import BertConfig
from workers.training.electra import load_pretrained

API = "/api/v1"
HUGE = {**asdict(BertConfig()), "vocab_size": 10_000_000, "d_model": 65536, "n_heads": 1024}


def model_file(config: object, **extra: str) -> bytes:
    """A tiny safetensors file whose metadata says it is a pre-trained model of `config`."""
    metadata = {
        "nebula.kind": "model",
        "nebula.architecture": "electra-discriminator",
        "config": config if isinstance(config, str) else json.dumps(config),
        "tokenizer": "{}",
        **extra,
    }
    return bytes(save_safetensors({"w": np.zeros(4, np.float32)}, metadata=metadata))


def upload_model(client: TestClient, platform: Platform, content: bytes) -> tuple[int, str]:
    owner = platform.user()
    ws = client.post(f"{API}/workspaces", json={"name": "m"}, headers=owner.headers).json()["id"]
    answer = client.post(
        f"{API}/workspaces/{ws}/datasets",
        data={"name": "plm", "kind": "model", "discoverable": "false"},
        files={"file": ("plm.safetensors", content, "application/octet-stream")},
        headers=owner.headers,
    )
    return answer.status_code, answer.json()["detail"] if answer.status_code != 201 else ""


def test_a_model_claiming_a_10m_by_65536_embedding_is_422_at_upload(
    client: TestClient, platform: Platform
) -> None:
    status, detail = upload_model(client, platform, model_file(HUGE))
    assert status == 422 and "vocab_size = 10000000 exceeds" in detail
    many = {**asdict(BertConfig()), "d_model": 8192, "n_heads": 64, "n_layers": 128}
    status, detail = upload_model(client, platform, model_file(many))
    assert status == 422 and "weights, over" in detail
    for config in ({"vocab_size": "all"}, [1, 2], "{not json", {**asdict(BertConfig()), "x": 1}):
        assert upload_model(client, platform, model_file(config))[0] == 422
    assert upload_model(client, platform, model_file(asdict(BertConfig())))[0] == 201


def test_a_deeply_nested_safetensors_header_is_422_not_500(
    client: TestClient, platform: Platform
) -> None:
    depth = 100_000
    header = b'{"__metadata__":{"nebula.kind":"model"},"w":' + b"[" * depth + b"]" * depth + b"}"
    status, detail = upload_model(client, platform, struct.pack("<Q", len(header)) + header)
    assert status == 422 and "nested too deeply" in detail
    nested_config = "[" * depth + "]" * depth
    status, detail = upload_model(client, platform, model_file(nested_config))
    assert status == 422 and "model refused" in detail


def test_a_worker_never_builds_a_model_past_the_limits() -> None:
    with pytest.raises(ModelTooLarge, match="vocab_size"):
        load_pretrained(model_file(HUGE))  # refused before a single weight is allocated
