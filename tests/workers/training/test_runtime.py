"""Wire messages, batch packing, checkpoints: pure helpers with round-trip properties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.switch.link import LocalLink
from workers.training.electra import CorruptedBatch, decode_batch, encode_batch
from workers.training.pipeline import AsyncSender
from workers.training.runtime import (
    CheckpointStore,
    linear_warmup_decay,
    pack_message,
    restore_training_state,
    resume_step,
    smallest_uint,
    training_state,
    unpack_message,
)

DTYPES = [np.uint8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.bool_]


@settings(max_examples=60, deadline=None)
@given(
    header=st.dictionaries(st.text(max_size=8), st.integers(-(2**40), 2**40), max_size=4),
    shapes=st.lists(st.lists(st.integers(0, 5), max_size=3), max_size=4),
    dtype_index=st.integers(0, len(DTYPES) - 1),
)
def test_messages_round_trip(
    header: dict[str, int], shapes: list[list[int]], dtype_index: int
) -> None:
    rng = np.random.default_rng(0)
    dtype = DTYPES[dtype_index]
    arrays = {
        f"a{i}": (rng.integers(0, 100, size=shape)).astype(dtype) for i, shape in enumerate(shapes)
    }
    got_header, got = unpack_message(pack_message(header, arrays))
    assert got_header == header
    assert got.keys() == arrays.keys()
    for key, arr in arrays.items():
        assert got[key].dtype == arr.dtype and np.array_equal(got[key], arr)


def test_malformed_messages_are_refused() -> None:
    blob = pack_message({"k": 1}, {"x": np.arange(10, dtype=np.uint16)})
    for bad in (b"nope", blob[:-1], blob + b"\0"):
        with pytest.raises(ValueError):
            unpack_message(bad)


def test_smallest_uint() -> None:
    assert smallest_uint(255) == np.uint8
    assert smallest_uint(256) == np.uint16
    assert smallest_uint(65535) == np.uint16
    assert smallest_uint(65536) == np.uint32


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    vocab=st.sampled_from([40, 300, 70000]),
    b=st.integers(1, 6),
    t=st.integers(3, 12),
)
def test_both_batch_encodings_rebuild_what_the_generator_made(
    seed: int, vocab: int, b: int, t: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(5, vocab, (20, t), generator=g)
    index = torch.randperm(20, generator=g)[:b]
    original = text[index]
    replaced = torch.rand(b, t, generator=g) < 0.3
    corrupted = original.clone()
    corrupted[replaced] = (original[replaced] + 1) % vocab
    batch = CorruptedBatch(corrupted, corrupted != original)
    for mode, text_ids in (("full", None), ("shared", text)):
        blob = encode_batch(mode, 1, 0, index, original, batch, vocab, len(text))
        header, arrays = unpack_message(blob)
        got = decode_batch(header, arrays, text_ids)
        assert torch.equal(got.ids, batch.ids) and torch.equal(got.replaced, batch.replaced)
        if mode == "full":  # ids in the narrowest type: uint8, uint16, uint32 here
            assert arrays["ids"].dtype == {40: np.uint8, 300: np.uint16, 70000: np.uint32}[vocab]


def test_checkpoints_keep_the_newest_and_restore_everything(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    rng = torch.Generator().manual_seed(7)
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 5):
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        torch.rand(3, generator=rng)
        tensors, meta = training_state(model, opt, {"r": rng})
        store.save(step, tensors, {**meta, "step": step})
    assert store.steps() == [3, 4]
    expected = [p.detach().clone() for p in model.parameters()]
    next_draw = torch.rand(3, generator=rng)

    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_rng = torch.Generator()
    tensors, meta = store.load(4)
    assert meta["step"] == 4
    restore_training_state(tensors, meta, fresh, fresh_opt, {"r": fresh_rng})
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), expected, strict=True))
    assert torch.equal(torch.rand(3, generator=fresh_rng), next_draw)
    state = fresh_opt.state_dict()["state"][0]
    assert torch.equal(state["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_resume_step_is_the_newest_common_checkpoint() -> None:
    assert resume_step([], [10]) == 0
    assert resume_step([10, 20, 30], [10, 20]) == 20


def test_learning_rate_schedule() -> None:
    assert linear_warmup_decay(5, 1.0, 10, 100) == 0.5
    assert linear_warmup_decay(10, 1.0, 10, 100) == 1.0
    assert linear_warmup_decay(100, 1.0, 10, 100) == pytest.approx(0.1)


def test_async_sender_keeps_order() -> None:
    a, b = LocalLink.pair()
    sender = AsyncSender(a, depth=2)
    for i in range(20):
        sender.send("c", bytes([i]))
    sender.close()
    assert [b.recv("c", timeout=1) for _ in range(20)] == [bytes([i]) for i in range(20)]
