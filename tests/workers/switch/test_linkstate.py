"""LinkState without sockets: two roles' ends joined by a fake switch, as h11's
ConnectionPair joins two connections. The clock is the test's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.switch.frames import Data, ProtocolError, Receipt
from workers.switch.linkstate import (
    ASK_AGAIN_S,
    LINGER_S,
    RECEIPT_DELAY_S,
    RECEIPT_EVERY,
    LinkState,
    Taken,
    reader_waits,
    role_reads,
)
from workers.switch.rules import DIRECT_BYTES

RESEND_AFTER_S = 15.0


def _end(role: str, peer: str, *, window_frames: int = 8) -> LinkState:
    return LinkState(
        job_id="job",
        role=role,
        peer_role=peer,
        window_frames=window_frames,
        window_bytes=1 << 20,
        resend_after_s=RESEND_AFTER_S,
        now=0.0,
    )


@dataclass
class LinkPair:
    """Two ends and the switch between them, which loses what `lose` says it loses."""

    g: LinkState = field(default_factory=lambda: _end("G", "D"))
    d: LinkState = field(default_factory=lambda: _end("D", "G"))
    now: float = 0.0
    lose: Callable[[Data | Receipt], bool] = lambda frame: False
    delivered: dict[str, list[bytes]] = field(default_factory=lambda: {"G": [], "D": []})
    dropped: list[tuple[str, int, Taken]] = field(default_factory=list)

    def other(self, end: LinkState) -> LinkState:
        return self.d if end is self.g else self.g

    def pump(self, rounds: int = 200) -> None:
        """Move frames both ways until neither end has anything to write, the clock
        moved on to each receipt held back."""
        for _ in range(rounds):
            moved = False
            for end in (self.g, self.d):
                if not end.has_work(self.now):
                    continue
                moved = True
                writes = end.next_to_write(self.now)
                far = self.other(end)
                if writes.receipt is not None and not self.lose(writes.receipt):
                    far.take_receipt(writes.receipt, self.now)
                if writes.frame is not None and not self.lose(writes.frame):
                    taken = far.take(writes.frame, self.now)
                    if taken is Taken.DELIVER:
                        self.delivered[far.role].append(bytes(writes.frame.body))
                    else:
                        self.dropped.append((far.role, writes.frame.seq, taken))
            if not moved:
                held = [e.receipt_at for e in (self.g, self.d) if e.receipt_at is not None]
                if not held:
                    return
                self.now = max(self.now, min(held))
        raise AssertionError("the pair never went quiet")


def _send(end: LinkState, *bodies: bytes) -> None:
    for body in bodies:
        assert end.has_room(len(body))
        end.push("acts", body, None)


def test_frames_arrive_in_order_once_and_receipts_empty_the_window() -> None:
    pair = LinkPair()
    _send(pair.g, b"a", b"b", b"c")
    _send(pair.d, b"x")
    pair.pump()
    assert pair.delivered == {"D": [b"a", b"b", b"c"], "G": [b"x"]}
    assert len(pair.g.window) == 0 and len(pair.d.window) == 0
    assert pair.g.all_written() and pair.dropped == []


def test_a_frame_lost_on_the_way_is_asked_for_and_comes_once() -> None:
    lost = {1}

    def lose(frame: Data | Receipt) -> bool:
        if isinstance(frame, Data) and frame.seq in lost:
            lost.discard(frame.seq)  # lost once (a switch restarted), not for ever
            return True
        return False

    pair = LinkPair(lose=lose)
    _send(pair.g, b"0", b"1", b"2", b"3")
    pair.pump()
    assert pair.delivered["D"] == [b"0", b"1", b"2", b"3"]
    # what followed the gap was dropped, then sent again after the receiver asked
    assert ("D", 2, Taken.GAP) in pair.dropped
    assert len(pair.g.window) == 0


def test_a_gap_is_asked_about_once_a_while_not_for_every_frame_after_it() -> None:
    d = _end("D", "G")
    d.take(Data("job", "acts", 0, "G", "D", b"0", None), now=0.0)
    asks = []
    for seq in range(2, 12):  # frame 1 is missing
        assert d.take(Data("job", "acts", seq, "G", "D", b"", None), now=0.1) is Taken.GAP
        receipt = d.next_to_write(now=0.1).receipt
        assert receipt is not None and receipt.next_seq == 1
        asks.append(receipt.resend)
    assert asks == [True] + [False] * 9
    d.take(Data("job", "acts", 12, "G", "D", b"", None), now=0.1 + ASK_AGAIN_S + 0.01)
    receipt = d.next_to_write(now=0.1 + ASK_AGAIN_S + 0.01).receipt
    assert receipt is not None and receipt.resend


def test_a_resumed_sending_connection_sends_every_unacknowledged_frame_again() -> None:
    # the connection dropped after the frames left but before any receipt came back
    pair = LinkPair(lose=lambda frame: isinstance(frame, Receipt))
    _send(pair.g, b"a", b"b")
    pair.pump()
    assert pair.delivered["D"] == [b"a", b"b"] and len(pair.g.window) == 2
    pair.lose = lambda frame: False
    pair.g.sending_resumed()
    pair.pump()
    assert pair.delivered["D"] == [b"a", b"b"]  # the second copies were dropped
    # frame 0 went again; its receipt (up to 2) then told G that frame 1 needs not
    assert [(seq, why) for _, seq, why in pair.dropped] == [(0, Taken.DUPLICATE)]
    assert len(pair.g.window) == 0


def test_a_resumed_receiving_connection_asks_for_what_was_on_its_way() -> None:
    pair = LinkPair(lose=lambda frame: isinstance(frame, Data) and frame.seq == 1)
    _send(pair.g, b"a", b"b")
    pair.pump()
    assert pair.delivered["D"] == [b"a"]  # "b" was lost with the old connection
    pair.lose = lambda frame: False
    pair.d.receiving_resumed()
    pair.pump()
    assert pair.delivered["D"] == [b"a", b"b"]


def test_frames_long_unacknowledged_are_sent_again_after_the_silence() -> None:
    # the last frame is lost and no frame follows it: no gap to see, only silence
    lost = {0}

    def lose(frame: Data | Receipt) -> bool:
        if isinstance(frame, Data) and frame.seq in lost:
            lost.discard(frame.seq)
            return True
        return False

    pair = LinkPair(lose=lose)
    _send(pair.g, b"only")
    pair.pump()
    assert pair.delivered["D"] == [] and not pair.g.has_work(pair.now)
    pair.now += RESEND_AFTER_S / 2
    assert not pair.g.has_work(pair.now)
    pair.now += RESEND_AFTER_S
    pair.pump()
    assert pair.delivered["D"] == [b"only"] and len(pair.g.window) == 0


def _frame(seq: int) -> Data:
    return Data("job", "acts", seq, "G", "D", b"", None)


def test_receipts_for_frames_in_order_wait_a_little_and_cover_several() -> None:
    d = _end("D", "G")
    for seq in range(3):
        assert d.take(_frame(seq), now=0.001 * seq) is Taken.DELIVER
    assert not d.has_work(now=0.002)  # held back, so that a reply goes first
    assert d.has_work(now=RECEIPT_DELAY_S)  # the first frame's delay is up
    receipt = d.next_to_write(now=RECEIPT_DELAY_S).receipt
    assert receipt is not None and receipt.next_seq == 3 and not receipt.resend
    assert d.receipt_at is None


def test_a_receipt_goes_at_once_when_many_frames_are_owed_one() -> None:
    d = _end("D", "G")
    for seq in range(RECEIPT_EVERY - 1):
        d.take(_frame(seq), now=0.0)
    assert not d.has_work(now=0.0)
    d.take(_frame(RECEIPT_EVERY - 1), now=0.0)
    assert d.has_work(now=0.0)


def test_a_duplicate_is_answered_at_once_so_that_the_resending_stops() -> None:
    d = _end("D", "G")
    d.take(_frame(0), now=0.0)
    d.next_to_write(now=1.0)
    assert d.take(_frame(0), now=2.0) is Taken.DUPLICATE
    assert d.has_work(now=2.0)


def test_a_closing_end_writes_the_receipt_it_held_back() -> None:
    d = _end("D", "G")
    d.take(_frame(0), now=0.0)
    d.receipt_now(now=0.0)
    receipt = d.next_to_write(now=0.0).receipt
    assert receipt is not None and receipt.next_seq == 1


def test_a_receipt_for_frames_never_sent_is_a_protocol_error() -> None:
    g = _end("G", "D")
    _send(g, b"a")
    with pytest.raises(ProtocolError):
        g.take_receipt(Receipt("job", "D", "G", 2, False), now=0.0)


def test_the_window_holds_its_frames_until_receipts_free_it() -> None:
    pair = LinkPair(g=_end("G", "D", window_frames=2))
    _send(pair.g, b"a", b"b")
    assert not pair.g.has_room(1)
    pair.pump()
    assert pair.g.has_room(1)


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=4), min_size=1, max_size=12),
    losses=st.lists(st.booleans(), max_size=60),
    resumes=st.lists(st.sampled_from(["send", "recv", "wait"]), max_size=6),
)
def test_whatever_is_lost_every_frame_arrives_once_in_order(
    bodies: list[bytes], losses: list[bool], resumes: list[str]
) -> None:
    # frames and receipts lost at random, connections resumed, time passing: the role
    # on the far end gets each frame exactly once and in order
    fate = iter(losses)
    pair = LinkPair(g=_end("G", "D", window_frames=64))
    pair.lose = lambda frame: next(fate, False)
    _send(pair.g, *bodies)
    pair.pump()
    for step in resumes:
        if step == "send":
            pair.g.sending_resumed()
        elif step == "recv":
            pair.d.receiving_resumed()
        else:
            pair.now += RESEND_AFTER_S + 1
        pair.pump()
    pair.lose = lambda frame: False  # the path is whole again: silence brings the rest
    pair.now += RESEND_AFTER_S + 1
    pair.pump()
    assert pair.delivered["D"] == bodies
    assert len(pair.g.window) == 0


def test_a_thread_that_sent_a_small_frame_may_write_it_itself_with_the_receipt_due() -> None:
    g = _end("G", "D")
    assert g.take_direct(now=0.0) is None  # nothing to write
    _send(g, b"a")
    writes = g.take_direct(now=0.0)
    assert writes is not None and writes.frame is not None and writes.frame.seq == 0
    assert writes.receipt is None and g.all_written() and not g.has_work(now=0.0)
    # a receipt owed but held back is the writer's (on its timer); once due, it goes along
    g.take(_frame(0), now=0.0)
    _send(g, b"b")
    writes = g.take_direct(now=0.0)
    assert writes is not None and writes.receipt is None and writes.frame is not None
    writes = g.take_direct(now=RECEIPT_DELAY_S)
    assert writes is not None and writes.frame is None
    assert writes.receipt is not None and writes.receipt.next_seq == 1


def test_a_frame_with_others_waiting_before_it_or_a_large_one_is_the_writers() -> None:
    g = _end("G", "D")
    _send(g, b"a", b"b")  # the writer was busy: two wait, in order, for it
    assert g.take_direct(now=0.0) is None
    assert g.next_to_write(now=0.0).frame is not None  # the writer takes "a"...
    writes = g.take_direct(now=0.0)  # ...and "b", alone now, may go directly
    assert writes is not None and writes.frame is not None and writes.frame.seq == 1
    g.sending_resumed()  # a new connection: both again, the writer's
    assert g.take_direct(now=0.0) is None and g.has_work(now=0.0)
    big = _end("G", "D")
    _send(big, bytes(DIRECT_BYTES + 1))
    assert big.take_direct(now=0.0) is None and big.has_work(now=0.0)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.sampled_from(["send", "direct", "writer"]), max_size=40))
def test_direct_writes_and_the_writers_interleaved_keep_the_order(steps: list[str]) -> None:
    # whichever thread holds the connection takes what is next: frames leave in order
    g = _end("G", "D", window_frames=64)
    left: list[int] = []
    for n, step in enumerate(steps):
        if step == "send":
            _send(g, str(n).encode())
            continue
        writes = g.take_direct(0.0) if step == "direct" else g.next_to_write(0.0)
        if writes is not None and writes.frame is not None:
            left.append(writes.frame.seq)
    while g.has_work(0.0):
        frame = g.next_to_write(0.0).frame
        assert frame is not None
        left.append(frame.seq)
    assert left == list(range(steps.count("send")))


def test_the_reader_stands_aside_while_the_role_reads_for_itself() -> None:
    # no role's thread ever read: the reader reads
    assert reader_waits(5.0, role_read_at=-1e9, role_reading=False, asked=False) is None
    # one read a moment ago: the reader looks again once LINGER_S has passed since
    assert reader_waits(5.0, role_read_at=5.0 - LINGER_S / 4, role_reading=False, asked=False) == (
        pytest.approx(LINGER_S * 3 / 4)
    )
    # one reads now, however long: the reader looks again in a while
    assert reader_waits(5.0, role_read_at=0.0, role_reading=True, asked=False) == LINGER_S
    # long gone: the reader reads again (receipts, other channels, pings)
    assert reader_waits(5.0, role_read_at=5.0 - LINGER_S, role_reading=False, asked=False) is None
    # asked (a lost connection or a waiting thread left behind, a sender short of room)
    assert reader_waits(5.0, role_read_at=5.0, role_reading=True, asked=True) is None
    # a role's thread reads on after a small frame; after a large one the reader reads
    # the next ahead while the role works on it
    assert role_reads(16) and role_reads(DIRECT_BYTES) and not role_reads(DIRECT_BYTES + 1)
