"""Wire messages, ELECTRA's batch packing, overlapped sends: round-trip properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.switch.link import LocalLink
from workers.training.electra import CorruptedBatch, decode_batch, encode_batch
from workers.training.messages import pack_message, smallest_uint, unpack_message
from workers.training.pipeline import AsyncSender

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


def test_async_sender_keeps_order() -> None:
    a, b = LocalLink.pair()
    sender = AsyncSender(a, depth=2)
    for i in range(20):
        sender.send("c", bytes([i]))
    sender.close()
    assert [b.recv("c", timeout=1) for _ in range(20)] == [bytes([i]) for i in range(20)]
