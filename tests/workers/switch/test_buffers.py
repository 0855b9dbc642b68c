"""Recycled body buffers: never handed out while anything refers to them, and bounded."""

from __future__ import annotations

import torch

from workers.switch import protocol as p
from workers.switch.buffers import POOLED_BYTES, BufferPool
from workers.switch.client import tensor_from_wire

MIB = 1024 * 1024


def _pool() -> BufferPool:
    return BufferPool(max_bytes=64 * MIB, max_free_bytes=8 * MIB)


def test_a_buffer_anything_refers_to_is_not_handed_out_again() -> None:
    pool = _pool()
    held = pool.take(MIB)
    view = memoryview(pool.take(MIB))
    tensor = torch.frombuffer(pool.take(MIB), dtype=torch.uint8)
    fresh = pool.take(MIB)
    assert pool.reused == 0 and len({id(held), id(view.obj), id(fresh)}) == 3
    del view, tensor  # the view's and the tensor's buffers are free now, not `held`
    again = [pool.take(MIB), pool.take(MIB)]
    assert pool.reused == 2
    assert all(buf is not held and buf is not fresh for buf in again)
    last = pool.take(MIB)  # none is free: a new one
    assert all(last is not buf for buf in (held, fresh, *again)) and pool.reused == 2


def test_free_buffers_beyond_the_bound_are_let_go() -> None:
    pool = _pool()
    in_use = [pool.take(MIB) for _ in range(16)]
    assert pool.kept_bytes() == 16 * MIB
    in_use.clear()  # all 16 free: the next take keeps 8 MiB of free ones and its own
    pool.take(MIB)
    assert pool.kept_bytes() <= 8 * MIB + MIB
    # small bodies are the allocator's: never tracked
    pool.take(POOLED_BYTES - 1)
    assert pool.kept_bytes() <= 9 * MIB


def test_tracked_buffers_are_bounded_while_all_are_in_use() -> None:
    pool = BufferPool(max_bytes=4 * MIB, max_free_bytes=4 * MIB)
    in_use = [pool.take(MIB) for _ in range(10)]
    assert pool.kept_bytes() == 4 * MIB and len(in_use) == 10


def test_a_decoded_body_keeps_its_bytes_while_later_frames_reuse_buffers() -> None:
    pool = _pool()
    decoder = p.FrameDecoder(pool=pool)
    bodies = [bytes([n]) * (2 * POOLED_BYTES) for n in range(4)]
    got: list[p.Data] = []
    for seq, body in enumerate(bodies):
        for chunk in p.encode(p.Data("j", "c", seq, "G", "D", body=body)):
            decoder.receive_data(chunk)
        frame = decoder.next_event()
        assert isinstance(frame, p.Data)
        got.append(frame)
        if seq == 1:
            got.pop(0)  # frame 0 dropped: its buffer is the next frame's
    del frame
    assert pool.reused == 1
    assert [bytes(f.body) for f in got] == bodies[1:]
    # a tensor over a body keeps the body's buffer out of use
    tensor = tensor_from_wire(got[-1].body, p.TensorSpec("uint8", (len(bodies[3]),)))
    got.clear()
    for chunk in p.encode(p.Data("j", "c", 4, "G", "D", body=bytes(len(bodies[3])))):
        decoder.receive_data(chunk)
    assert isinstance(decoder.next_event(), p.Data)
    assert bytes(tensor.numpy()) == bodies[3]
