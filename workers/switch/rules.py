"""The switch's decisions, sans IO: what to keep for resending, and whom to admit.

Beside the frame protocol (protocol.py), and like it free of sockets, threads and
clocks, so that each rule is tested by calling it (tests/workers/switch/test_rules.py):

- `ResendWindow`: frames sent and not yet acknowledged, numbered in the order they
  were sent, bounded in frames and bytes. A switch keeps one per peer it sends to (its
  frames come again after a link cut), a role's `SwitchLink` one per link (its frames
  come again after a switch restarts or a connection drops).
- `admit_worker`: whether a worker whose job token verified may take a role's
  connection.
- `Heartbeat`: when a role's link pings its switch on a connection, and when it gives
  the switch up for gone (a path that drops every byte silently).
- `StreamTracker`: sequence numbers per stream, each delivered once and in order.
- `channel_refusal`: whether a worker's frame stays on the channel its token allows.
- `peer_frame_is_fresh` and `peer_frame_verdict`: what a switch does with a frame a
  peer sent (a duplicate after a reconnection, a late frame, a frame from the wrong
  cluster or for a role placed elsewhere, one for a role not placed here yet).
- `UnclaimedMailboxes`: the mailboxes a peer's frames made for roles that have not
  connected here: at most so many per peer, and expired when never claimed.
- `writes_directly`: whether the thread that has a frame writes it to its connection
  itself, rather than hand it to the connection's writer thread (outlet.py).
- `AckSchedule`: when a switch acknowledges the frames a peer sent it.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Collection, Hashable, Iterator, Mapping
from typing import Generic, TypeVar

from contract.jobtoken import JobClaims
from workers.switch.frames import Ack, Direction, Hello, ProtocolError, Routed

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class WindowError(ValueError):
    """An acknowledgement that no sender could have earned: of something never sent, or
    behind one already taken (out of order)."""


class WindowFull(Exception):
    """No room in the window for another frame until the far end acknowledges."""


class ResendWindow(Generic[T]):
    """Frames sent and not yet acknowledged, by sequence number.

    `push` numbers a frame (`next_seq`, then one more); `ack(n)` says the far end has
    every frame below `n` (cumulative: the same `n` twice is no news); `replay()` gives
    the frames still unacknowledged, oldest first, to send again. An empty window takes
    any one frame, however large, so that a frame above `max_bytes` cannot wedge it.
    """

    def __init__(self, *, max_frames: int, max_bytes: int, first_seq: int = 0) -> None:
        if max_frames < 1 or max_bytes < 1:
            raise ValueError("a window holds at least one frame and one byte")
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.acked = first_seq  # every frame below this one is acknowledged
        self.nbytes = 0
        self._frames: collections.deque[tuple[T, int]] = collections.deque()

    @property
    def next_seq(self) -> int:
        """The number the next pushed frame gets."""
        return self.acked + len(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    def has_room(self, nbytes: int) -> bool:
        """Whether a frame of `nbytes` fits now."""
        if not self._frames:
            return True
        return len(self._frames) < self.max_frames and self.nbytes + nbytes <= self.max_bytes

    def push(self, frame: T, nbytes: int) -> int:
        """Keep `frame` until acknowledged; returns its sequence number."""
        if not self.has_room(nbytes):
            raise WindowFull(
                f"{len(self._frames)} frames and {self.nbytes} bytes unacknowledged,"
                f" the most this window holds is {self.max_frames} and {self.max_bytes}"
            )
        self._frames.append((frame, nbytes))
        self.nbytes += nbytes
        return self.next_seq - 1

    def ack(self, upto: int) -> list[T]:
        """The far end has every frame below `upto`; returns the frames this frees."""
        if upto > self.next_seq:
            raise WindowError(
                f"acknowledgement up to {upto}, but only frames below {self.next_seq} were sent"
            )
        if upto < self.acked:
            raise WindowError(
                f"acknowledgement up to {upto} is out of order: {self.acked} was acknowledged"
            )
        freed = []
        for _ in range(upto - self.acked):
            frame, nbytes = self._frames.popleft()
            self.nbytes -= nbytes
            freed.append(frame)
        self.acked = upto
        return freed

    def get(self, seq: int) -> T:
        """The unacknowledged frame numbered `seq`."""
        if not self.acked <= seq < self.next_seq:
            raise WindowError(f"frame {seq} is not in the window [{self.acked}, {self.next_seq})")
        return self._frames[seq - self.acked][0]

    def replay(self, start: int | None = None) -> Iterator[tuple[int, T]]:
        """(seq, frame) of every unacknowledged frame from `start` (the oldest by default)."""
        first = self.acked if start is None else start
        if not self.acked <= first <= self.next_seq:
            raise WindowError(
                f"cannot replay from {first}: the window holds [{self.acked}, {self.next_seq})"
            )
        for offset, (frame, _) in enumerate(list(self._frames)[first - self.acked :]):
            yield first + offset, frame


def admit_worker(
    hello: Hello,
    claims: JobClaims,
    cluster: str,
    live: Collection[Direction] = (),
    *,
    ended: bool = False,
) -> str | None:
    """Why a worker whose token verified is refused, or None to admit it.

    `live` holds the directions this (job, attempt, role) already has connected here;
    `ended` says its attempt has come and gone here.
    """
    if claims.cluster != cluster:
        return f"job token is for cluster {claims.cluster!r}"
    if (claims.job_id, claims.role) != (hello.job_id, hello.role):
        return "hello names another job or role than its token"
    # Newest-wins would let anyone holding the token take over a live role's stream;
    # a role reconnects only once its first connection is gone.
    if hello.direction in live:
        return (
            f"role {hello.role!r} of job {hello.job_id!r} is already connected to {hello.direction}"
        )
    # What an ended attempt held is freed; its streams cannot resume from nothing, and the
    # control plane starts a new attempt (a new job id) for a role that must run again.
    if ended:
        return f"role {hello.role!r} of job {hello.job_id!r} has ended here"
    return None


class LinkMeter:
    """Bandwidth and round-trip time of a link, from what its far end acknowledged.

    `acknowledged(now, nbytes, unacked)` is told of each acknowledgement: `nbytes` newly
    acknowledged at `now`, `unacked` frames still in flight after it. Only spans during
    which frames were in flight throughout count towards the bandwidth (an idle link says
    nothing of its rate): the rate is the bytes acknowledged over the last `span_s`
    seconds of such spans. `round_trip(seconds)` adds a round-trip sample (a ping's);
    the estimate is the smallest of the last `rtt_samples`, the one least delayed by
    frames queued ahead of it.
    """

    def __init__(self, *, span_s: float = 2.0, rtt_samples: int = 8) -> None:
        self.span_s = span_s
        self._points: collections.deque[tuple[float, int]] = collections.deque()
        self._total = 0
        self._busy = False
        self._rtts: collections.deque[float] = collections.deque(maxlen=rtt_samples)
        self.bandwidth: float | None = None
        self.samples = 0  # acknowledgements the bandwidth rests on
        self.version = 0  # grows with every change of the estimate

    def acknowledged(self, now: float, nbytes: int, unacked: int) -> None:
        if nbytes <= 0:
            return
        if not self._busy:
            # the link was idle before this acknowledgement: a new span starts here
            self._points.clear()
            self._total = 0
            self._points.append((now, 0))
        else:
            self._total += nbytes
            self._points.append((now, self._total))
            while len(self._points) > 2 and now - self._points[1][0] >= self.span_s:
                self._points.popleft()
            (first, sent), (last, total) = self._points[0], self._points[-1]
            if last > first:
                self.bandwidth = (total - sent) / (last - first)
                self.samples += 1
                self.version += 1
        self._busy = unacked > 0

    def round_trip(self, seconds: float) -> None:
        self._rtts.append(max(0.0, seconds))
        self.version += 1

    @property
    def rtt(self) -> float | None:
        return min(self._rtts) if self._rtts else None

    def estimate(self) -> tuple[float, float, int] | None:
        """(bandwidth in bytes/s, round trip in s, samples), once both were measured."""
        rtt = self.rtt
        if self.bandwidth is None or rtt is None:
            return None
        return self.bandwidth, rtt, self.samples


class Heartbeat:
    """When one end of a connection pings the other, and when it gives the other up.

    A ping goes each `interval_s`, whatever else the connection carries, so that the
    far end always hears something and can cut a connection that went silent. The far
    end is gone once a ping has had nothing back for `timeout_s`: neither its answer nor
    any other byte. Anything heard counts, not the answer alone: a far end busy writing
    a long frame answers after it, and its bytes show it is there meanwhile. The caller
    tells it when bytes last came (`heard`), asks for the pings due (`ping_due`), and
    checks only while nothing is left to read (`gone`), so that time spent away from the
    connection (a reader waiting on a slow consumer) is never held against the far end.
    """

    def __init__(self, *, interval_s: float, timeout_s: float, now: float) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("a heartbeat needs a positive interval and timeout")
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.pings = 0  # the id of the last ping made
        self._last_ping_at = now
        self._waiting_since: float | None = None  # the first ping since bytes last came

    def heard(self, at: float) -> None:
        """Bytes came from the far end at `at`."""
        if self._waiting_since is not None and at >= self._waiting_since:
            self._waiting_since = None

    def ping_due(self, now: float) -> int | None:
        """The id of a ping to send now, or None before the interval is up."""
        if now - self._last_ping_at < self.interval_s:
            return None
        self.pings += 1
        self._last_ping_at = now
        if self._waiting_since is None:
            self._waiting_since = now
        return self.pings

    def gone(self, now: float) -> bool:
        """Whether a ping has had nothing back for `timeout_s`."""
        return self._waiting_since is not None and now - self._waiting_since > self.timeout_s

    def wait_s(self, now: float) -> float:
        """Seconds until the next ping is due or the far end is to be given up."""
        due = self._last_ping_at + self.interval_s
        if self._waiting_since is not None:
            due = min(due, self._waiting_since + self.timeout_s)
        return max(0.0, due - now)


class StreamTracker:
    """Sequence numbers per stream: delivers each once and in order, drops replays, spots gaps."""

    def __init__(self, *, max_streams: int = 65536) -> None:
        self.max_streams = max_streams
        self._next: dict[tuple[str, ...], int] = {}

    def is_new(self, stream: tuple[str, ...], seq: int) -> bool:
        """True if `seq` is the next on `stream`, False for a duplicate; ProtocolError on a gap."""
        expected = self._next.get(stream, 0)
        if seq < expected:
            return False
        if seq > expected:
            raise ProtocolError(f"sequence gap on {stream}: expected {expected}, got {seq}")
        if stream not in self._next and len(self._next) >= self.max_streams:
            raise ProtocolError(f"more than {self.max_streams} streams")
        return True

    def admit(self, stream: tuple[str, ...], seq: int) -> bool:
        """Like `is_new`, and a new `seq` counts as delivered."""
        if not self.is_new(stream, seq):
            return False
        self._next[stream] = seq + 1
        return True

    def forget(self, job_id: str, dst_role: str | None = None) -> int:
        """Drop the streams of a finished job (only those to `dst_role` when given).

        Keys are (job, src, dst, channel); returns how many were dropped.
        """
        doomed = [
            k
            for k in self._next
            if k and k[0] == job_id and (dst_role is None or (len(k) > 2 and k[2] == dst_role))
        ]
        for key in doomed:
            del self._next[key]
        return len(doomed)

    def __len__(self) -> int:
        return len(self._next)


def channel_refusal(frame: Routed, claims: JobClaims, peer_role: str) -> str | None:
    """Why a frame a worker sent leaves the one channel its token and hello allow, or None:
    its own job, from its own role, to the peer role it named."""
    if (frame.job_id, frame.src_role, frame.dst_role) == (claims.job_id, claims.role, peer_role):
        return None
    return (
        f"frame for job {frame.job_id!r} {frame.src_role}->{frame.dst_role} outside"
        f" its token's job {claims.job_id!r} {claims.role}->{peer_role}"
    )


def peer_frame_is_fresh(first: int, count: int, taken: int | None) -> bool:
    """Whether the `count`-th frame (from 0) of a peer connection whose first frame is
    numbered `first` in its session is new: the session's frames below `taken` (all of
    those before `first` when `taken` is None) were delivered already."""
    return first + count >= (first if taken is None else taken)


class Verdict(enum.Enum):
    """What a switch does with a frame from a peer."""

    DELIVER = "deliver"  # to the mailbox of a role connected here
    UNCLAIMED = "unclaimed"  # to a mailbox on probation for a role not connected yet
    ENDED = "ended"  # that attempt is over here: acknowledged and dropped
    PLACEMENT = "placement"  # from a cluster its role does not run on, or for a role
    # placed on another cluster: dropped


def peer_frame_verdict(
    frame: Routed,
    sender: str,
    cluster: str,
    placement: Mapping[str, str] | None,
    *,
    connected: bool,
    ended: bool,
) -> tuple[Verdict, str]:
    """The verdict on `frame` from the peer `sender` at the switch of `cluster`, and why.

    `placement` is what this switch knows of the job's placement (role -> cluster), from
    the job tokens of its roles that connected here; None when none has. `connected`
    says the destination role has connected here, `ended` that its attempt is over here.
    """
    if ended:
        return Verdict.ENDED, f"its attempt has ended for {frame.dst_role}"
    known = placement or {}
    src_at, dst_at = known.get(frame.src_role), known.get(frame.dst_role)
    if src_at is not None and src_at != sender:
        return Verdict.PLACEMENT, f"role {frame.src_role} runs on {src_at}, not {sender}"
    if dst_at is not None and dst_at != cluster:
        return Verdict.PLACEMENT, f"role {frame.dst_role} runs on {dst_at}, not here"
    if connected:
        return Verdict.DELIVER, "connected here"
    if dst_at == cluster:
        return Verdict.UNCLAIMED, f"role {frame.dst_role} is placed here, not connected yet"
    return Verdict.UNCLAIMED, f"role {frame.dst_role} is not known here yet"


class UnclaimedMailboxes(Generic[K]):
    """Mailboxes a peer's frames made for roles that have not connected here.

    A peer may name any (job, role); until a worker of this cluster claims one with its
    job token, the mailbox is on probation: each peer may hold `per_peer` of them, and
    one not claimed within `expiry_s` is given up (`expired`). A role that connects
    `claim`s its mailbox; when the table is full, the oldest unclaimed one makes way for
    a claimed one (`oldest`).
    """

    def __init__(self, *, per_peer: int, expiry_s: float) -> None:
        if per_peer < 0 or expiry_s <= 0:
            raise ValueError("a non-negative cap and a positive expiry")
        self.per_peer, self.expiry_s = per_peer, expiry_s
        self._opened: collections.OrderedDict[K, tuple[str, float]] = collections.OrderedDict()
        self._by_peer: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self._opened)

    def __contains__(self, key: object) -> bool:
        return key in self._opened

    def may_open(self, peer: str) -> bool:
        """Whether `peer` may have one more unclaimed mailbox made."""
        return self._by_peer[peer] < self.per_peer

    def open(self, key: K, peer: str, now: float) -> None:
        """A mailbox was made for `key` by `peer`'s frame at `now`."""
        if key in self._opened:
            return
        if not self.may_open(peer):
            raise ValueError(f"peer {peer} holds {self.per_peer} unclaimed mailboxes")
        self._opened[key] = (peer, now)
        self._by_peer[peer] += 1

    def claim(self, key: K) -> bool:
        """A role connected for `key`: its mailbox is no longer on probation."""
        entry = self._opened.pop(key, None)
        if entry is None:
            return False
        self._by_peer[entry[0]] -= 1
        if self._by_peer[entry[0]] <= 0:
            del self._by_peer[entry[0]]
        return True

    def expired(self, now: float) -> list[K]:
        """The mailboxes unclaimed for longer than `expiry_s`, forgotten here."""
        late = [k for k, (_, at) in self._opened.items() if now - at > self.expiry_s]
        for key in late:
            self.claim(key)
        return late

    def oldest(self) -> K | None:
        """The unclaimed mailbox opened first, forgotten here; None when there is none."""
        if not self._opened:
            return None
        key = next(iter(self._opened))
        self.claim(key)
        return key


# A frame this small is written by the thread that has it when its connection is free
# (`writes_directly`): it goes out in one send with its header (stream.COALESCE_BYTES).
# A larger one is handed to the connection's writer thread as before: its write takes
# long against a hand-off (about 1 ms for 4 MiB against some 50 us), and the thread that
# read it reads the next one meanwhile.
DIRECT_BYTES = 64 * 1024


def writes_directly(nbytes: int, *, queued: bool, shaped: bool = False, room: bool = True) -> bool:
    """Whether a frame of `nbytes` is written to its connection by the thread that has it
    (a worker connection's reader, a peer connection's reader, a role's own thread),
    holding the connection's lock, instead of going into the queue its writer thread
    drains. The caller asks only once it holds that lock and no write is unfinished on
    the connection (outlet.py): no frame another thread took is mid-way.

    `queued`: anything waits in the queue, of any stream; `shaped`: the link plays a rate
    or a delay; `room`: the resend window the frame goes into has room for it.
    """
    # A frame queued ahead of it goes first: if of its own stream, the stream's order; if
    # of another job's, the fair queue's turn (a job writing directly past a queue would
    # take the link from those waiting in it).
    if queued:
        return False
    # The shaper's delay and rate are kept by the writer thread, which sleeps for them;
    # the thread that has the frame must not (a peer reader holding up every job) nor
    # skip them.
    if shaped:
        return False
    # A full resend window holds the frame back until acknowledgements come: the writer
    # thread waits for them, reading the connection; the frame waits in the queue, and
    # the queue's bound pushes back on the sender as before.
    if not room:
        return False
    return nbytes <= DIRECT_BYTES


# On a link that plays no delay, the acknowledgement of a small frame waits for up to
# ACK_EVERY frames or ACK_HOLD_S, whichever comes first (one acknowledgement, cumulative,
# says as much as eight): each costs a write at the receiving switch and a read at the
# sending one, about a fifth of what a small frame costs the two switches.
ACK_EVERY = 8
ACK_HOLD_S = 0.005


class AckSchedule:
    """When a switch acknowledges what it took from a peer: the ACKs to write, and when.

    `took(now, nbytes)` counts a DATA or RECEIPT frame, `pinged(now, id)` a PING; `due(now)`
    returns the acknowledgements to write now, `next_at()` when the next falls due.

    - Where the link plays a delay (`delay_s` > 0), every frame's acknowledgement and
      every ping's answer leaves `delay_s` after it: the way back of the link. Of
      acknowledgements due together only the last is written; each ping is answered.
    - Where it does not, a ping is answered at once, a frame over DIRECT_BYTES at once
      (its acknowledgement costs nothing against its bytes, and frees the sender's
      window of them), and a small one's is held until `every` frames wait for one or
      the oldest of them has waited `hold_s`. A sender whose window is full of small
      frames thus waits at most `hold_s` for room.
    """

    def __init__(self, delay_s: float, *, every: int = ACK_EVERY, hold_s: float = ACK_HOLD_S):
        self.delay_s, self.every, self.hold_s = delay_s, every, hold_s
        self.count = 0  # frames taken on the connection
        self._due: collections.deque[tuple[float, Ack]] = collections.deque()
        self._held = 0  # frames taken whose acknowledgement is held back
        self._held_since = 0.0

    def took(self, now: float, nbytes: int) -> None:
        self.count += 1
        if self.delay_s > 0:
            self._due.append((now + self.delay_s, Ack(self.count)))
            return
        if not self._held:
            self._held_since = now
        self._held += 1
        if nbytes > DIRECT_BYTES or self._held >= self.every:
            self._release(now)

    def pinged(self, now: float, ping: int) -> None:
        self._held = 0  # the answer's count says as much
        self._due.append((now + self.delay_s, Ack(self.count, ping=ping)))

    def _release(self, now: float) -> None:
        self._held = 0
        self._due.append((now, Ack(self.count)))

    def due(self, now: float) -> list[Ack]:
        """The acknowledgements to write now, in order."""
        if self._held and now >= self._held_since + self.hold_s:
            self._release(now)
        out: list[Ack] = []
        while self._due and self._due[0][0] <= now:
            _, ack = self._due.popleft()
            # a later count due now says as much; each ping is answered
            if ack.ping is not None or not self._due or self._due[0][0] > now:
                out.append(ack)
        return out

    def next_at(self) -> float | None:
        """When the next acknowledgement falls due (None: none is owed)."""
        times = [self._due[0][0]] if self._due else []
        if self._held:
            times.append(self._held_since + self.hold_s)
        return min(times) if times else None
