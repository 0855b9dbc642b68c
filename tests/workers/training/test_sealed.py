"""What a role leaves on its cluster's disk is sealed under its job's key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from workers.training import sealed
from workers.training.checkpoints import CheckpointStore

KEY = bytes(range(32))


@given(st.binary(max_size=4096), st.text(min_size=1, max_size=40))
def test_seal_round_trips(data: bytes, name: str) -> None:
    assert sealed.unseal(KEY, name, sealed.seal(KEY, name, data)) == data


def test_another_key_another_name_or_a_flipped_bit_is_refused() -> None:
    blob = sealed.seal(KEY, "step-00000004.safetensors", b"weights")
    with pytest.raises(sealed.SealError):
        sealed.unseal(os.urandom(32), "step-00000004.safetensors", blob)
    with pytest.raises(sealed.SealError):  # a sealed file renamed into another's place
        sealed.unseal(KEY, "step-00000008.safetensors", blob)
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(sealed.SealError):
        sealed.unseal(KEY, "step-00000004.safetensors", flipped)
    with pytest.raises(sealed.SealError):
        sealed.unseal(KEY, "x", b"plain bytes")


def test_a_keyed_store_writes_no_plaintext_and_reads_it_back(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2, key=KEY)
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    path = store.save(4, tensors, {"step": 4})
    store.write_file("tokenizer.json", b'{"model": {"vocab": {"zarvokian": 7}}}')
    raw = path.read_bytes()
    assert raw.startswith(sealed.MAGIC)
    with pytest.raises(SafetensorError):
        load_safetensors(raw)  # not a safetensors file on disk
    assert b"zarvokian" not in (tmp_path / "ckpt" / "tokenizer.json").read_bytes()
    loaded, meta = store.load(4)
    assert torch.equal(loaded["w"], tensors["w"]) and meta == {"step": 4}
    assert store.read_file("tokenizer.json").startswith(b'{"model"')
    # without the key the store cannot read what it wrote
    with pytest.raises(sealed.SealError):
        CheckpointStore(tmp_path / "ckpt", key=os.urandom(32)).load(4)


def test_without_a_key_files_are_plain_safetensors(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "plain")
    path = store.save(1, {"w": torch.ones(2)}, {"step": 1})
    assert torch.equal(load_safetensors(path.read_bytes())["w"], torch.ones(2))
