"""The sans-IO frame protocol: round trips, order rules, and fuzzed byte streams."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workers.switch import protocol as p
from workers.switch.frames import HEADER, KIND_OF, KINDS, MAGIC, VERSION, Kind

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
tensor_specs = st.builds(
    lambda dtype, shape: p.TensorSpec(dtype=dtype, shape=tuple(shape)),
    st.sampled_from(sorted(p.DTYPE_SIZES)),
    st.lists(st.integers(0, 5), max_size=3),
)


@st.composite
def data_frames(draw: st.DrawFn) -> p.Data:
    spec = draw(st.none() | tensor_specs)
    body = draw(st.binary(max_size=200)) if spec is None else bytes(spec.raw_nbytes())
    return p.Data(
        job_id=draw(names),
        channel=draw(names),
        seq=draw(st.integers(0, 2**63 - 1)),
        src_role=draw(names),
        dst_role=draw(names),
        body=body,
        tensor=spec,
    )


frames = st.one_of(
    data_frames(),
    st.builds(p.Ack, count=st.integers(0, 2**40), ping=st.none() | st.integers(0, 2**40)),
    st.builds(p.Error, reason=st.text(max_size=50)),
    st.builds(p.PeerHello, cluster=names, session=names, resume_from=st.integers(0, 2**62)),
    st.builds(
        p.Receipt,
        job_id=names,
        src_role=names,
        dst_role=names,
        next_seq=st.integers(0, 2**62),
        resend=st.booleans(),
    ),
    st.builds(p.Ping, id=st.integers(0, 2**40)),
    st.builds(
        p.LinkReport,
        bandwidth_bytes_per_s=st.floats(0, 1e12),
        rtt_s=st.floats(0, 100),
        samples=st.integers(0, 2**40),
    ),
    st.just(p.Welcome()),
    st.builds(
        p.Hello,
        token=st.text(max_size=100),
        job_id=names,
        role=names,
        peer_role=names,
        direction=st.sampled_from(list(p.Direction)),
    ),
)


def wire(frame_list: list[p.Frame]) -> bytes:
    return b"".join(bytes(b) for f in frame_list for b in p.encode(f))


def drain(decoder: p.FrameDecoder) -> list[p.Event]:
    events = []
    while (event := decoder.next_event()) is not p.NEED_DATA:
        events.append(event)
        if event is p.CLOSED:
            break
    return events


def same(a: p.Frame, b: p.Event) -> bool:
    if isinstance(a, p.Data) and isinstance(b, p.Data):
        fields = {"body": bytes(a.body), "wire": None}
        return a.__dict__ | fields == b.__dict__ | fields | {"body": bytes(b.body)}
    return a == b


@given(st.lists(frames, max_size=8), st.data())
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_frames_survive_any_split_of_the_stream(
    frame_list: list[p.Frame], data: st.DataObject
) -> None:
    stream = wire(frame_list)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = p.FrameDecoder()
    events: list[p.Event] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        if cut > start:
            decoder.receive_data(stream[start:cut])
            events += drain(decoder)
        start = cut
    decoder.receive_data(b"")
    events += drain(decoder)
    assert events[-1] is p.CLOSED
    assert len(events) - 1 == len(frame_list)
    assert all(same(a, b) for a, b in zip(frame_list, events, strict=False))
    # a frame read is written again, as a switch passes it on, in the very bytes it came in
    assert wire(events[:-1]) == stream  # type: ignore[arg-type]
    assert all(f.wire is not None for f in events if isinstance(f, p.Data))


def test_a_frame_changed_after_reading_is_encoded_afresh() -> None:
    """`Data.wire` is no field of `dataclasses.replace`: a frame made from a read one with
    other fields is written with its own meta, not the one it came in with."""
    decoder = p.FrameDecoder()
    decoder.receive_data(wire([p.Data("j", "c", 7, "G", "D", body=b"abc")]))
    read = decoder.next_event()
    assert isinstance(read, p.Data) and read.wire is not None
    changed = dataclasses.replace(read, seq=8)
    assert changed.wire is None
    assert wire([changed]) == wire([p.Data("j", "c", 8, "G", "D", body=b"abc")])


def test_body_can_be_received_straight_into_the_frame() -> None:
    frame = p.Data("j", "c", 0, "G", "D", body=bytes(range(256)) * 100)
    header, body = p.encode(frame)
    decoder = p.FrameDecoder()
    decoder.receive_data(header)
    assert decoder.next_event() is p.NEED_DATA
    view = decoder.body_view()
    assert view is not None and len(view) == len(body)
    view[:] = body
    decoder.advance_body(len(body))
    got = decoder.next_event()
    assert isinstance(got, p.Data) and bytes(got.body) == bytes(body)


def test_a_data_body_is_sent_as_the_callers_buffer() -> None:
    payload = bytearray(1024)
    buffers = p.encode(p.Data("j", "c", 0, "G", "D", body=memoryview(payload)))
    assert isinstance(buffers[1], memoryview) and buffers[1].obj is payload


@given(st.lists(frames, min_size=1, max_size=4), st.data())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_corrupted_or_truncated_streams_raise_only_protocol_errors(
    frame_list: list[p.Frame], data: st.DataObject
) -> None:
    stream = bytearray(wire(frame_list))
    for _ in range(data.draw(st.integers(0, 4))):
        where = data.draw(st.integers(0, len(stream) - 1))
        stream[where] = data.draw(st.integers(0, 255))
    stream = stream[: data.draw(st.integers(0, len(stream)))]
    decoder = p.FrameDecoder(max_body=4096)
    try:
        decoder.receive_data(bytes(stream))
        drain(decoder)
        decoder.receive_data(b"")
        drain(decoder)
    except p.ProtocolError:
        pass


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_random_bytes_raise_only_protocol_errors(junk: bytes) -> None:
    decoder = p.FrameDecoder(max_body=4096)
    try:
        decoder.receive_data(junk)
        drain(decoder)
        decoder.receive_data(b"")
        drain(decoder)
    except p.ProtocolError:
        pass


@given(st.integers(4097, 2**64 - 1), st.integers(p.MAX_META_BYTES + 1, 2**32 - 1))
@settings(max_examples=50)
def test_a_huge_announced_length_is_refused_before_any_allocation(body: int, meta: int) -> None:
    tracemalloc.start()
    try:
        for header in (
            p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.DATA, 10, body),
            p.HEADER.pack(p.MAGIC, p.VERSION, p.Kind.DATA, meta, 0),
        ):
            decoder = p.FrameDecoder(max_body=4096)
            decoder.receive_data(header)
            with pytest.raises(p.ProtocolError, match="exceeds"):
                decoder.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_version_and_magic_errors_are_clear() -> None:
    decoder = p.FrameDecoder()
    decoder.receive_data(p.HEADER.pack(p.MAGIC, 9, p.Kind.ACK, 0, 0))
    with pytest.raises(p.ProtocolError, match="version 9"):
        decoder.next_event()
    with pytest.raises(p.ProtocolError):
        decoder.next_event()  # a failed stream stays failed
    decoder = p.FrameDecoder()
    decoder.receive_data(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(20))
    with pytest.raises(p.ProtocolError, match="magic"):
        decoder.next_event()


def test_tensor_body_must_match_dtype_and_shape() -> None:
    spec = p.TensorSpec(dtype="float32", shape=(2, 3))
    with pytest.raises(p.ProtocolError, match="24 bytes"):
        p.encode(p.Data("j", "c", 0, "G", "D", body=bytes(23), tensor=spec))
    coded = p.TensorSpec(dtype="float32", shape=(2, 3), codec="fp16", codec_params={"k": 1})
    frame = p.Data("j", "c", 0, "G", "D", body=bytes(12), tensor=coded)
    decoder = p.FrameDecoder()
    decoder.receive_data(wire([frame]))
    got = decoder.next_event()
    assert isinstance(got, p.Data) and got.tensor == coded


def test_connection_enforces_the_handshake_order() -> None:
    server, client = p.Connection(p.Side.SERVER), p.Connection(p.Side.CLIENT)
    with pytest.raises(p.ProtocolError):
        client.send(p.Data("j", "c", 0, "G", "D", body=b"x"))
    server.receive_data(wire([p.Data("j", "c", 0, "G", "D", body=b"x")]))
    with pytest.raises(p.ProtocolError, match="before the handshake"):
        server.next_event()
    server = p.Connection(p.Side.SERVER)
    for buf in client.send(p.PeerHello("cluster-a")):
        server.receive_data(buf)
    assert server.next_event() == p.PeerHello("cluster-a")
    for buf in server.send(p.Welcome()):
        client.receive_data(buf)
    assert client.next_event() == p.Welcome()
    assert client.state is server.state is p.ConnState.OPEN
    for buf in client.send(p.Data("j", "c", 0, "G", "D", body=b"x")):
        server.receive_data(buf)
    assert isinstance(server.next_event(), p.Data)
    server.receive_data(wire([p.Welcome()]))
    with pytest.raises(p.ProtocolError, match="after the handshake"):
        server.next_event()


def test_stream_tracker_delivers_once_in_order() -> None:
    tracker = p.StreamTracker(max_streams=2)
    assert tracker.admit(("j", "c"), 0)
    assert tracker.admit(("j", "c"), 1)
    assert not tracker.admit(("j", "c"), 0)
    with pytest.raises(p.ProtocolError, match="gap"):
        tracker.admit(("j", "c"), 3)
    assert tracker.admit(("k", "c"), 0)
    with pytest.raises(p.ProtocolError, match="streams"):
        tracker.admit(("l", "c"), 0)
    tracker.forget("j")
    assert tracker.admit(("l", "c"), 0)


@given(frames)
@settings(max_examples=300)
def test_a_frames_meta_is_the_text_json_dumps_writes(frame: p.Frame) -> None:
    header = bytes(p.encode(frame)[0])
    meta_len = HEADER.unpack_from(header)[3]
    meta = KINDS[KIND_OF[type(frame)]].meta(frame)
    assert (
        header[HEADER.size : HEADER.size + meta_len]
        == json.dumps(meta, separators=(",", ":")).encode()
    )


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_a_meta_json_loads_reads_is_read_whatever_its_encoding(encoding: str) -> None:
    meta = '{"count":3}'.encode(encoding)
    decoder = p.FrameDecoder()
    decoder.receive_data(HEADER.pack(MAGIC, VERSION, Kind.ACK, len(meta), 0) + meta)
    assert decoder.next_event() == p.Ack(3)
