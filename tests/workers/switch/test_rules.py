"""The switch's pure rules, without sockets: the resend window, admission, the link meter.

In the style of h11's ConnectionPair tests: a pair of protocol ends joined by bytes in
memory, driven step by step, where a test can lose whatever is in flight.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.jobtoken import JobClaims
from workers.switch import protocol as p
from workers.switch.rules import (
    ACK_EVERY,
    ACK_HOLD_S,
    DIRECT_BYTES,
    AckSchedule,
    Heartbeat,
    LinkMeter,
    ResendWindow,
    StreamTracker,
    UnclaimedMailboxes,
    Verdict,
    WindowError,
    WindowFull,
    admit_worker,
    channel_refusal,
    peer_frame_is_fresh,
    peer_frame_verdict,
    writes_directly,
)


def window(frames: int = 4, nbytes: int = 100) -> ResendWindow[str]:
    return ResendWindow(max_frames=frames, max_bytes=nbytes)


def test_push_numbers_frames_and_ack_frees_them_in_order() -> None:
    w = window()
    assert [w.push(name, 10) for name in "abc"] == [0, 1, 2]
    assert (len(w), w.nbytes, w.next_seq) == (3, 30, 3)
    assert w.ack(2) == ["a", "b"]
    assert w.ack(2) == []  # the same cumulative acknowledgement twice is no news
    assert (w.acked, len(w), w.nbytes) == (2, 1, 10)
    assert list(w.replay()) == [(2, "c")]
    assert w.get(2) == "c"


def test_the_window_is_bounded_in_frames_and_bytes() -> None:
    w = window(frames=2, nbytes=50)
    w.push("a", 10)
    w.push("b", 10)
    with pytest.raises(WindowFull, match="2 frames and 20 bytes unacknowledged"):
        w.push("c", 1)
    w.ack(1)
    assert not w.has_room(41) and w.has_room(40)
    w.ack(2)
    w.push("huge", 10_000)  # an empty window takes any one frame: nothing can wedge it
    assert not w.has_room(1)


def test_acks_of_what_was_never_sent_or_out_of_order_are_refused() -> None:
    w = window()
    w.push("a", 1)
    with pytest.raises(WindowError, match="only frames below 1 were sent"):
        w.ack(2)
    w.ack(1)
    with pytest.raises(WindowError, match="out of order: 1 was acknowledged"):
        w.ack(0)
    with pytest.raises(WindowError, match="cannot replay from 0"):
        list(w.replay(0))
    with pytest.raises(WindowError, match="not in the window"):
        w.get(0)


class Pair:
    """A sending role's window and a receiving role's expected number, joined by a
    client and a server `Connection` over bytes in memory that a test can lose."""

    def __init__(self) -> None:
        self.window: ResendWindow[p.Data] = ResendWindow(max_frames=8, max_bytes=1 << 20)
        self.client, self.server = p.Connection(p.Side.CLIENT), p.Connection(p.Side.SERVER)
        self.wire: list[bytes] = []
        self._handshake()
        self.expected = 0
        self.delivered: list[bytes] = []

    def _handshake(self) -> None:
        self.server.receive_data(
            _bytes(self.client.send(p.Hello("t", "j", "G", "D", p.Direction.SEND)))
        )
        assert isinstance(self.server.next_event(), p.Hello)
        self.client.receive_data(_bytes(self.server.send(p.Welcome())))
        assert self.client.next_event() == p.Welcome()

    def send(self, body: bytes) -> None:
        seq = self.window.next_seq
        frame = p.Data("j", "c", seq, "G", "D", body)
        self.window.push(frame, len(body))
        self.wire.append(_bytes(self.client.send(frame)))

    def lose_in_flight(self) -> None:
        """A switch restarts: what was on its way is gone, both ends dial again."""
        self.wire.clear()
        self.client, self.server = p.Connection(p.Side.CLIENT), p.Connection(p.Side.SERVER)
        self._handshake()

    def deliver(self, count: int | None = None) -> p.Receipt:
        """Let `count` frames through (all by default); the receiver's receipt."""
        through, self.wire = self.wire[:count], self.wire[len(self.wire[:count]) :]
        gap = False
        for chunk in through:
            self.server.receive_data(chunk)
            frame = self.server.next_event()
            assert isinstance(frame, p.Data)
            if frame.seq == self.expected:
                self.delivered.append(bytes(frame.body))
                self.expected += 1
            elif frame.seq > self.expected:
                gap = True  # dropped; the receipt asks for it again
        return p.Receipt("j", "D", "G", self.expected, resend=gap)

    def take(self, receipt: p.Receipt) -> None:
        self.window.ack(receipt.next_seq)
        if receipt.resend:
            self.replay(receipt.next_seq)

    def replay(self, start: int | None = None) -> None:
        for _, frame in self.window.replay(start):
            self.wire.append(_bytes(self.client.send(frame)))


def _bytes(buffers: list[p.Buffer]) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def test_a_restart_in_between_loses_nothing_and_delivers_nothing_twice() -> None:
    pair = Pair()
    for i in range(5):
        pair.send(b"frame %d" % i)
    pair.take(pair.deliver(2))  # 0 and 1 arrive and are acknowledged
    pair.lose_in_flight()  # 2..4 are lost with the switch
    pair.send(b"frame 5")
    pair.replay()  # the sender dials again and sends all it holds: 2..5, then 5 again
    pair.take(pair.deliver())
    assert pair.delivered == [b"frame %d" % i for i in range(6)]
    assert len(pair.window) == 0


def test_a_gap_asks_for_the_missing_frames_again() -> None:
    pair = Pair()
    for i in range(3):
        pair.send(b"%d" % i)
    pair.wire.pop(0)  # frame 0 lost: 1 and 2 come after a gap
    receipt = pair.deliver()
    assert receipt == p.Receipt("j", "D", "G", 0, resend=True)
    pair.take(receipt)
    pair.take(pair.deliver())
    assert pair.delivered == [b"0", b"1", b"2"]


@given(st.lists(st.sampled_from(["send", "deliver_one", "lose", "replay"]), max_size=40))
@settings(max_examples=100, deadline=None)
def test_any_order_of_sends_losses_and_replays_delivers_in_order_once(steps: list[str]) -> None:
    pair, sent = Pair(), 0
    for step in steps:
        if step == "send" and pair.window.has_room(1):
            pair.send(b"%d" % sent)
            sent += 1
        elif step == "deliver_one":
            pair.take(pair.deliver(1))
        elif step == "lose":
            pair.lose_in_flight()
        elif step == "replay":
            pair.replay()
    pair.lose_in_flight()
    pair.replay()
    pair.take(pair.deliver())
    assert pair.delivered == [b"%d" % i for i in range(sent)]


def test_admission_is_a_pure_decision() -> None:
    claims = JobClaims(job_id="j.1", role="G", cluster="a", expires_at=0)
    hello = p.Hello("t", "j.1", "G", "D", p.Direction.SEND)
    assert admit_worker(hello, claims, "a") is None
    assert "already connected" in str(admit_worker(hello, claims, "a", (p.Direction.SEND,)))
    assert "has ended here" in str(admit_worker(hello, claims, "a", ended=True))
    assert "for cluster 'a'" in str(admit_worker(hello, claims, "b"))


def test_the_meter_reads_the_rate_of_busy_spans_and_the_least_delayed_round_trip() -> None:
    meter = LinkMeter(span_s=2.0)
    assert meter.estimate() is None
    meter.acknowledged(0.0, 1000, unacked=3)  # after an idle link: where a span starts
    for i in range(1, 11):
        meter.acknowledged(i * 0.1, 125_000, unacked=3)  # 1.25 MB/s
    meter.round_trip(0.050)
    meter.round_trip(0.041)
    meter.round_trip(0.300)  # behind a long frame
    estimate = meter.estimate()
    assert estimate is not None
    bandwidth, rtt, samples = estimate
    assert bandwidth == pytest.approx(1_250_000) and rtt == pytest.approx(0.041)
    assert samples == 10
    meter.acknowledged(1.1, 125_000, unacked=0)  # the last in flight: the span ends
    meter.acknowledged(60.0, 125_000, unacked=1)  # after a minute idle: not a slow link
    meter.acknowledged(60.1, 125_000, unacked=1)
    assert meter.bandwidth == pytest.approx(1_250_000)


def test_a_heartbeat_pings_each_interval_and_gives_up_a_ping_with_nothing_back() -> None:
    beat = Heartbeat(interval_s=1.0, timeout_s=3.0, now=0.0)
    assert beat.ping_due(0.5) is None and beat.wait_s(0.5) == 0.5
    assert beat.ping_due(1.0) == 1
    assert beat.ping_due(1.5) is None  # one an interval, answered or not
    assert beat.ping_due(2.0) == 2
    assert not beat.gone(4.0)  # 3 s since the first ping without an answer, not more
    assert beat.wait_s(2.5) == 0.5  # the next ping (before the give-up at 4.0)
    assert beat.ping_due(4.0) == 3 and beat.wait_s(4.0) == 0.0
    assert beat.gone(4.01)  # the first ping counts, not the latest


def test_a_heartbeat_counts_any_byte_heard_after_a_ping_as_an_answer() -> None:
    beat = Heartbeat(interval_s=1.0, timeout_s=3.0, now=0.0)
    assert beat.ping_due(1.0) == 1
    beat.heard(0.9)  # before the ping: no answer to it
    assert beat.gone(4.5)
    beat.heard(1.0)  # a frame's bytes, or the answer
    assert not beat.gone(100.0)  # and nothing is out until the next ping
    assert beat.ping_due(100.0) == 2
    assert not beat.gone(103.0) and beat.gone(103.5)
    with pytest.raises(ValueError):
        Heartbeat(interval_s=0, timeout_s=1, now=0)


def frame(job: str = "j.1", src: str = "G", dst: str = "D") -> p.Data:
    return p.Data(job, "c", 0, src, dst, b"x")


def test_a_worker_frame_stays_on_its_tokens_channel() -> None:
    claims = JobClaims(job_id="j.1", role="G", cluster="a", expires_at=0)
    assert channel_refusal(frame(), claims, "D") is None
    assert "outside its token's job 'j.1' G->D" in str(
        channel_refusal(frame(job="j.2"), claims, "D")
    )
    assert channel_refusal(frame(src="D", dst="G"), claims, "D") is not None
    assert channel_refusal(frame(dst="X"), claims, "D") is not None
    receipt = p.Receipt("j.1", "G", "D", 3)
    assert channel_refusal(receipt, claims, "D") is None


def test_a_peer_frame_is_fresh_from_where_its_session_left_off() -> None:
    assert peer_frame_is_fresh(first=0, count=0, taken=None)
    # a reconnection resumes from 5 while 7 were taken: frames 5 and 6 are duplicates
    assert not peer_frame_is_fresh(first=5, count=0, taken=7)
    assert not peer_frame_is_fresh(first=5, count=1, taken=7)
    assert peer_frame_is_fresh(first=5, count=2, taken=7)


def test_the_peer_frame_verdict() -> None:
    def verdict(
        placement: dict[str, str] | None, *, connected: bool = False, ended: bool = False
    ) -> Verdict:
        return peer_frame_verdict(frame(), "b", "a", placement, connected=connected, ended=ended)[0]

    assert verdict(None, connected=True) is Verdict.DELIVER
    assert verdict({"G": "b", "D": "a"}, connected=True) is Verdict.DELIVER
    # an attempt over here drops its late frames, whatever else holds
    assert verdict({"G": "b", "D": "a"}, connected=True, ended=True) is Verdict.ENDED
    # from a cluster its source role does not run on, or for a role placed elsewhere
    assert verdict({"G": "c", "D": "a"}, connected=True) is Verdict.PLACEMENT
    assert verdict({"G": "b", "D": "c"}) is Verdict.PLACEMENT
    # a role not connected here: its mailbox is on probation, placed here or unknown
    assert verdict({"G": "b", "D": "a"}) is Verdict.UNCLAIMED
    assert verdict(None) is Verdict.UNCLAIMED
    assert verdict({}) is Verdict.UNCLAIMED


def test_unclaimed_mailboxes_are_capped_per_peer_and_expire() -> None:
    boxes: UnclaimedMailboxes[tuple[str, str]] = UnclaimedMailboxes(per_peer=2, expiry_s=10)
    boxes.open(("j.1", "D"), "b", now=0)
    boxes.open(("j.2", "D"), "b", now=1)
    assert not boxes.may_open("b")
    assert boxes.may_open("c")  # another peer has its own share
    with pytest.raises(ValueError, match="unclaimed"):
        boxes.open(("j.3", "D"), "b", now=2)
    boxes.open(("j.1", "D"), "b", now=3)  # the same mailbox again: no second place
    # a role connects and claims its mailbox: off probation, and the peer's share frees
    assert boxes.claim(("j.2", "D"))
    assert not boxes.claim(("j.2", "D"))
    assert boxes.may_open("b")
    assert boxes.expired(now=10) == []
    assert boxes.expired(now=10.5) == [("j.1", "D")]
    assert len(boxes) == 0 and boxes.oldest() is None
    boxes.open(("j.4", "D"), "c", now=20)
    boxes.open(("j.5", "D"), "b", now=21)
    assert boxes.oldest() == ("j.4", "D")
    assert ("j.5", "D") in boxes and ("j.4", "D") not in boxes


def test_the_stream_tracker_lives_with_the_rules() -> None:
    assert p.StreamTracker is StreamTracker


def test_a_frame_is_written_directly_only_past_an_empty_queue_with_nothing_to_keep() -> None:
    assert writes_directly(16, queued=False)
    assert writes_directly(DIRECT_BYTES, queued=False, shaped=False, room=True)
    # a frame queued ahead of it, of its stream or another job's, goes first
    assert not writes_directly(16, queued=True)
    # the shaper's delay and rate are the writer's to keep
    assert not writes_directly(16, queued=False, shaped=True)
    # a full window: the frame waits for acknowledgements in the queue
    assert not writes_directly(16, queued=False, room=False)
    # a large frame goes to the writer thread, which the reading thread then overlaps
    assert not writes_directly(DIRECT_BYTES + 1, queued=False)


def test_on_a_played_link_each_acknowledgement_leaves_after_the_delay() -> None:
    acks = AckSchedule(0.030)
    acks.took(1.000, 16)
    acks.took(1.010, 16)
    acks.pinged(1.015, 7)
    assert acks.due(1.029) == [] and acks.next_at() == pytest.approx(1.030)
    assert acks.due(1.030) == [p.Ack(1)]
    # due together: the ping's answer, whose count says as much as the frame's
    assert acks.due(1.050) == [p.Ack(2, ping=7)]
    assert acks.due(2.0) == [] and acks.next_at() is None


def test_on_an_unplayed_link_small_frames_share_an_acknowledgement() -> None:
    acks = AckSchedule(0.0)
    for i in range(ACK_EVERY - 1):
        acks.took(1.0 + i * 1e-4, 16)
        assert acks.due(1.0 + i * 1e-4) == []
    # held no longer than ACK_HOLD_S after the oldest it covers
    assert acks.next_at() == pytest.approx(1.0 + ACK_HOLD_S)
    assert acks.due(1.0 + ACK_HOLD_S) == [p.Ack(ACK_EVERY - 1)]
    assert acks.next_at() is None
    # or until ACK_EVERY frames wait for one
    for _ in range(ACK_EVERY):
        acks.took(2.0, 16)
    assert acks.due(2.0) == [p.Ack(2 * ACK_EVERY - 1)]


def test_a_large_frame_or_a_ping_is_answered_at_once_and_covers_what_was_held() -> None:
    acks = AckSchedule(0.0)
    acks.took(1.0, 16)
    acks.took(1.0, DIRECT_BYTES + 1)
    assert acks.due(1.0) == [p.Ack(2)] and acks.next_at() is None
    acks.took(1.1, 16)
    acks.pinged(1.1, 3)
    assert acks.due(1.1) == [p.Ack(3, ping=3)] and acks.next_at() is None


@given(st.lists(st.tuples(st.sampled_from(["small", "large", "ping", "wait"]), st.floats(0, 0.01))))
def test_no_frame_waits_past_the_hold_for_its_acknowledgement(
    steps: list[tuple[str, float]],
) -> None:
    acks, now, written = AckSchedule(0.0), 0.0, 0
    taken_at: list[float] = []
    for what, dt in steps:
        now += dt
        for ack in acks.due(now):  # what a receiver writes before it waits again
            assert ack.count >= written
            written = ack.count
        assert all(now - t <= ACK_HOLD_S + 1e-12 for t in taken_at[written:])
        if what in ("small", "large"):
            acks.took(now, 16 if what == "small" else DIRECT_BYTES + 1)
            taken_at.append(now)
        elif what == "ping":
            acks.pinged(now, 1)
        # the receiver is woken in time for the oldest frame not acknowledged
        unacked = taken_at[written:]
        next_at = acks.next_at()
        assert not unacked or (next_at is not None and next_at <= unacked[0] + ACK_HOLD_S)
