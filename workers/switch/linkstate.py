"""The decisions of a role's link, sans IO: what to send next, what to deliver, what to ask.

`SwitchLink` (client.py) is the shell: two sockets, a reader and a writer thread, the
queues the role reads. Everything it decides lives here, with no socket, thread, lock
or clock of its own (the caller passes `now` and holds the lock):

- sending: each frame the role sends is numbered and kept in a `ResendWindow` until the
  far role's RECEIPT says it arrived; `next_to_write` gives the writer a receipt due and
  the next frame to (re)send;
- writing directly: `take_direct` gives the thread that just pushed a frame (or took
  one, and owes a receipt) what it may write itself while the writer is idle, so that
  a small frame need not wake the writer;
- reading: `reader_waits` says when the reader thread stands aside for the role's own
  threads, which read the receiving connection themselves while they wait in `recv`,
  and `role_reads` that they stop after a large frame, for the reader to read ahead;
- receiving: `take` says whether a frame is the next in order (deliver it), a duplicate
  (drop it) or past a gap (drop it, and ask the far role to send again from the gap);
- resuming: a new sending connection starts again at the oldest unacknowledged frame, a
  new receiving connection asks the far role to resend what may have been lost on the old;
- silence: frames long sent with no receipt at all are sent again (a lost frame with no
  frame after it is found so), since the far role drops what it already has;
- receipts for frames delivered in order wait a little (`RECEIPT_DELAY_S`, or until
  `RECEIPT_EVERY` frames are owed one), as TCP delays its acknowledgements: one receipt
  then covers several frames, and a reply the role sends meanwhile is not queued behind
  it at every hop. Duplicates, gaps and resumed connections are answered at once.

Tests drive two of these joined by a fake switch (tests/workers/switch/test_linkstate.py),
as h11's ConnectionPair joins two connections.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from workers.switch.frames import Buffer, Data, ProtocolError, Receipt, TensorSpec
from workers.switch.rules import DIRECT_BYTES, ResendWindow, writes_directly

# a gap is asked about once, then again only this long after, not for every frame after it
ASK_AGAIN_S = 2.0
# A receipt for in-order frames is written this long after the first of them, or once so
# many are owed one. Small against the resend window (64 frames) and the silence after
# which a sender resends (15 s); long against a 16-byte frame's round trip (about 1 ms),
# so that a ping-pong of small frames no longer sends a receipt each way per round trip.
RECEIPT_DELAY_S = 0.01
RECEIPT_EVERY = 8
# A role's thread that calls `recv` again within this long reads the receiving connection
# itself, and the link's reader thread stands aside meanwhile (`reader_waits`), looking
# again this often. What no role waits for (receipts, link reports, other channels'
# frames) waits in the socket this long at most while the role is away from `recv`: far
# below the silence after which a sender resends (15 s), and a sender short of room in
# its window calls the reader at once.
LINGER_S = 0.02


class Taken(enum.Enum):
    """What became of a frame from the far role."""

    DELIVER = "deliver"  # the next in order: hand it to the role
    DUPLICATE = "duplicate"  # already delivered (a resend): dropped
    GAP = "gap"  # frames before it went missing: dropped until they come again


@dataclass(frozen=True)
class Writes:
    """What the writer sends next: a receipt for the far role, a data frame, or both."""

    receipt: Receipt | None
    frame: Data | None


class LinkState:
    """One role's end of an ordered, exactly-once link, as decisions over frames."""

    def __init__(
        self,
        *,
        job_id: str,
        role: str,
        peer_role: str,
        window_frames: int,
        window_bytes: int,
        resend_after_s: float,
        now: float,
    ) -> None:
        self.job_id, self.role, self.peer_role = job_id, role, peer_role
        self.resend_after_s = resend_after_s
        self.window: ResendWindow[Data] = ResendWindow(
            max_frames=window_frames, max_bytes=window_bytes
        )
        self.write_from = 0  # the next frame of the window the writer sends
        self.expected = 0  # the next sequence number from the far role
        self.receipt_at: float | None = None  # when the receipt owed is written (None: none)
        self._owed = 0  # frames delivered since the last receipt
        self.ask_resend = False
        self._asked: tuple[int, float] = (-1, 0.0)  # (expected, when) of the last ask
        self.heard_at = now  # the last receipt from the far role

    # sending

    def has_room(self, nbytes: int) -> bool:
        """Whether a frame of `nbytes` fits in the window now."""
        return self.window.has_room(nbytes)

    def push(self, channel: str, body: Buffer, tensor: TensorSpec | None) -> Data:
        """Number a frame the role sends and keep it until the far role has it."""
        frame = Data(
            self.job_id, channel, self.window.next_seq, self.role, self.peer_role, body, tensor
        )
        self.window.push(frame, len(body))
        return frame

    def all_written(self) -> bool:
        """Whether every frame pushed has been handed to the writer at least once."""
        return self.write_from >= self.window.next_seq

    def _pending(self, now: float) -> bool:
        """Whether a frame waits to be (re)sent; starts a resend after a silence."""
        window = self.window
        self.write_from = max(self.write_from, window.acked)
        pending = self.write_from < window.next_seq
        if len(window) and not pending and now - self.heard_at > self.resend_after_s:
            # nothing heard of frames long sent: send them again (the receiver drops
            # what it has); a lost frame with none after it is found so
            self.write_from, self.heard_at = window.acked, now
            pending = True
        return pending

    def _receipt_due(self, now: float) -> bool:
        return self.receipt_at is not None and self.receipt_at <= now

    def has_work(self, now: float) -> bool:
        """Whether `next_to_write` has something (a receipt or a frame) for the writer."""
        return self._receipt_due(now) or self._pending(now)

    def receipt_now(self, now: float) -> None:
        """Write the receipt owed (if any) without waiting: the link is closing."""
        if self.receipt_at is not None:
            self.receipt_at = min(self.receipt_at, now)

    def _owe_receipt(self, at: float) -> None:
        self.receipt_at = at if self.receipt_at is None else min(self.receipt_at, at)

    def next_to_write(self, now: float) -> Writes:
        """The receipt due (if any) and the next frame to send (if any), marked as given."""
        pending = self._pending(now)
        receipt = None
        if self._receipt_due(now):
            resend = self.ask_resend
            receipt = Receipt(self.job_id, self.role, self.peer_role, self.expected, resend)
            if resend:
                self._asked = (self.expected, now)
            self.receipt_at, self._owed, self.ask_resend = None, 0, False
        frame = None
        if pending:
            frame = self.window.get(self.write_from)
            self.write_from += 1
        return Writes(receipt, frame)

    def take_direct(self, now: float) -> Writes | None:
        """What a thread other than the writer may write itself now, holding the sending
        connection (outlet.py): the one frame waiting, if small, with the receipt due, or
        that receipt alone; marked as given. None when nothing is due, or when it is the
        writer's to write: a large frame, or frames before it waiting (a resend)."""
        if self._pending(now):
            frame = self.window.get(self.write_from)
            waiting = self.window.next_seq - self.write_from
            if not writes_directly(len(frame.body), queued=waiting > 1):
                return None
        elif not self._receipt_due(now):
            return None
        return self.next_to_write(now)

    def take_receipt(self, receipt: Receipt, now: float) -> bool:
        """The far role's word on what it has; True when it asks to have frames again."""
        self.heard_at = now
        if receipt.next_seq > self.window.next_seq:
            raise ProtocolError(
                f"receipt up to {receipt.next_seq}, but only {self.window.next_seq} sent"
            )
        if receipt.next_seq >= self.window.acked:  # an older one is no news
            self.window.ack(receipt.next_seq)
        if receipt.resend:
            self.write_from = min(self.write_from, max(receipt.next_seq, self.window.acked))
        return receipt.resend

    def sending_resumed(self) -> None:
        """A new sending connection: every unacknowledged frame again, and a receipt."""
        self.write_from = self.window.acked
        self._owe_receipt(-math.inf)

    # receiving

    def take(self, frame: Data, now: float) -> Taken:
        """Whether to deliver a frame from the far role; a receipt is owed either way."""
        if frame.seq == self.expected:
            self.expected += 1
            self._owed += 1
            self._owe_receipt(now if self._owed >= RECEIPT_EVERY else now + RECEIPT_DELAY_S)
            return Taken.DELIVER
        self._owe_receipt(now)  # a resend to stop, or a gap to report: at once
        if frame.seq < self.expected:
            return Taken.DUPLICATE
        # frames before it went missing (a switch restarted): ask for them, once a
        # while, not once per frame that follows the gap
        asked_for, asked_at = self._asked
        if asked_for != self.expected or now - asked_at > ASK_AGAIN_S:
            self.ask_resend = True
        return Taken.GAP

    def receiving_resumed(self) -> None:
        """A new receiving connection: what was on its way may be gone, ask for it."""
        self.ask_resend = True
        self._owe_receipt(-math.inf)

    def still_here(self) -> None:
        """The role reads slowly: a receipt tells the far role this end is not gone."""
        self._owe_receipt(-math.inf)


def reader_waits(
    now: float, *, role_read_at: float, role_reading: bool, asked: bool
) -> float | None:
    """How long the link's reader thread stands aside before it looks again, or None to
    read now. A role's thread waiting in `recv` reads the connection itself while no
    other thread does: each frame then wakes the thread that waits for it, and not the
    reader first, which would hand it over. The reader reads when asked (a role's thread
    left a lost connection, or another thread waiting, behind it; a sender is short of
    room), and once no role's thread has read for `LINGER_S`."""
    if asked:
        return None
    left = role_read_at + LINGER_S - now
    if left > 0:
        return left
    return LINGER_S if role_reading else None


def role_reads(nbytes: int) -> bool:
    """Whether a role's thread that read a frame of `nbytes` (or was handed one) reads
    the next itself too. A small frame's round trip is bound by its hand-offs; a large
    one's by the time to receive it, which the reader thread overlaps with the role's
    work on the frame before, reading the next meanwhile (as the writer threads keep
    large frames, `rules.DIRECT_BYTES`)."""
    return nbytes <= DIRECT_BYTES
