"""The wire stays byte-identical: frames recorded from commit 157528f's encoder decode to
the same frames, and today's encoder writes the same bytes for them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.switch import protocol as p

from .recorded_wire import RECORDED

FIXTURE = Path(__file__).parent / "fixtures" / "wire-157528f.json"
WIRE: dict[str, bytes] = {k: bytes.fromhex(v) for k, v in json.loads(FIXTURE.read_text()).items()}


def test_the_fixture_covers_every_kind() -> None:
    assert set(WIRE) == set(RECORDED)
    kinds = {p.Kind(raw[3]) for raw in WIRE.values()}
    assert kinds == set(p.Kind)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_encoder_writes_the_recorded_bytes(name: str) -> None:
    assert b"".join(p.encode(RECORDED[name])) == WIRE[name]


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_decoder_reads_the_recorded_frame(name: str) -> None:
    decoder = p.FrameDecoder()
    decoder.receive_data(WIRE[name])
    assert decoder.next_event() == RECORDED[name]
    assert decoder.next_event() is p.NEED_DATA
    decoder.receive_data(b"")
    assert decoder.next_event() is p.CLOSED


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_recorded_stream_decodes_in_any_chunking(chunk: int) -> None:
    stream = b"".join(WIRE[name] for name in sorted(WIRE))
    decoder = p.FrameDecoder()
    got: list[p.Event] = []
    for start in range(0, len(stream), chunk):
        decoder.receive_data(stream[start : start + chunk])
        while (event := decoder.next_event()) is not p.NEED_DATA:
            got.append(event)
    assert got == [RECORDED[name] for name in sorted(WIRE)]


def test_a_body_received_in_place_decodes_the_same() -> None:
    raw = WIRE["data-tensor"]
    header_and_meta = len(raw) - 24
    decoder = p.FrameDecoder()
    decoder.receive_data(raw[:header_and_meta])
    assert decoder.next_event() is p.NEED_DATA
    view = decoder.body_view()
    assert view is not None and len(view) == 24
    view[:] = raw[header_and_meta:]
    decoder.advance_body(24)
    assert decoder.next_event() == RECORDED["data-tensor"]


def test_a_changed_byte_is_not_the_same_frame() -> None:
    # the comparison above can fail: one byte of the body changed decodes to another frame
    raw = bytearray(WIRE["data-small"])
    raw[-1] ^= 1
    decoder = p.FrameDecoder()
    decoder.receive_data(raw)
    assert decoder.next_event() != RECORDED["data-small"]
