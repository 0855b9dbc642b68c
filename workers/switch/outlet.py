"""A connection written by more than one thread: the direct-write fast path.

Each connection that carries frames has a writer thread of its own, which takes them from
a queue: a switch's fair queue to a peer (peers.py), a role's mailbox (roles.py), a role
link's resend window (client.py). A hand-off to it costs a wake-up and a context switch
(with the GIL on two cores, often more than one). A frame from role G (cluster a) to role
D (cluster b) crossed four such hand-offs, eight threads, each way:

1. G's thread -> G's link writer (the resend window), which writes to switch A;
2. A's reader of G's sending connection -> the fair queue -> A's sender to B;
3. B's reader of A's connection -> D's mailbox -> B's writer to D's receiving connection;
4. D's link reader -> the channel's queue -> D's thread.

With the outlets, 1 to 3 are written on by the thread that has the frame when nothing
is queued; and a role's thread waiting in `recv` reads its connection itself while the
link's reader stands aside (client.py, `linkstate.reader_waits`), which takes 4 away: a
small frame then crosses no hand-off and four threads each way (G's, A's reader, B's
reader, D's), as many as three raw TLS relays. An `Outlet` lets the thread that has a
frame write it itself, when that changes nothing another thread could see:

- it holds the outlet's `lock`, which every use of the connection takes, its reads too (a
  TLS connection is one state both ways, for one thread at a time). The writer thread
  takes a frame from its queue only under that lock, so that a frame it took and has not
  finished writing is never overtaken. `try_write` does not wait for the lock: a
  connection in use means the frame goes into the queue, as before;
- nothing waits in the queue ahead of the frame, the link plays no shaper and the frame is
  small (`rules.writes_directly`);
- the write never waits on the socket (`FrameStream.write_now`): what the socket does not
  take at once stays here (`rest`), and the writer thread, woken, writes it before
  anything else (`finish`). The thread that had the frame (a peer connection's reader,
  which serves every job on the link) is never held up by a slow reader at the far end,
  and back-pressure stays the queue's, bounded as before.

A direct write that fails leaves its error here: the writer thread raises it at its next
`finish` and goes the way of a failed write of its own.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from workers.switch.frames import Frame, ProtocolError
from workers.switch.stream import FrameStream, cut


class Outlet:
    """The right to use one connection (`lock`), and what a direct write left for the
    connection's writer thread: its unwritten bytes, or its failure."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.lock = threading.Lock()
        self.stream: FrameStream | None = None  # None: no connection to write on
        self.rest: memoryview | None = None
        self.broken: Exception | None = None
        self.direct = 0  # frames written by the threads that had them
        self._wake = wake  # wakes the writer thread

    def attach(self, stream: FrameStream | None) -> None:
        """Write on `stream` from now (None: on none); the caller holds the lock."""
        self.stream, self.rest, self.broken = stream, None, None

    def try_write(self, take: Callable[[], Sequence[Frame] | None]) -> bool | None:
        """Write what `take()` gives on the caller's thread, if the connection is free now.

        `take` is called holding the lock, once nothing is left unwritten: it decides
        (`rules.writes_directly`) and takes the frames from where they would wait, or
        returns None. Returns None when nothing was written (the connection is in use,
        broken or gone, or `take` declined): the caller queues its frame. True: written,
        or what the socket did not take now left to the writer thread. False: the
        connection broke in the write (the writer thread hears of it), and what went of
        the frames, if anything, is lost with it.
        """
        if not self.lock.acquire(blocking=False):
            return None
        try:
            if self.stream is None or self.rest is not None or self.broken is not None:
                return None
            frames = take()
            if not frames:
                return None
            try:
                self.rest = self.stream.write_now(frames)
            except (OSError, ProtocolError) as exc:
                self.fail(exc)
                return False
            self.direct += len(frames)
            if self.rest is not None:
                self._wake()
            return True
        finally:
            self.lock.release()

    def fail(self, exc: Exception) -> None:
        """The connection broke in a thread other than its writer's (the caller holds the
        lock): cut it, and the writer thread raises `exc` at its next `finish`."""
        self.broken = exc
        if self.stream is not None:
            cut(self.stream.sock)
        self._wake()

    def finish(self, *, while_blocked: Callable[[], None] | None = None, poll_s: float) -> None:
        """The writer thread's first step each time it holds the lock: raise what broke a
        direct write, or write what one left (`FrameStream.write` for `while_blocked`)."""
        if self.broken is not None:
            raise OSError(str(self.broken)) from self.broken
        if self.rest is not None and self.stream is not None:
            rest, self.rest = self.rest, None
            self.stream.write_rest(rest, while_blocked=while_blocked, poll_s=poll_s)


class Drained(ABC):
    """What a queue that a connection's writer thread drains shares, whatever its items:
    the condition its waiters wait on, a nudge that wakes the writer thread for something
    else than an item (a direct write's rest or failure), and the connection's `outlet`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._nudged = False
        self.outlet = Outlet(wake=self.nudge)

    @abstractmethod
    def _ready(self) -> bool:
        """Whether an item waits (the caller holds `_cond`)."""

    def _put_when(self, room: Callable[[], bool], add: Callable[[], None], timeout: float) -> bool:
        """Add an item (`add()`) once `room()` holds, waiting at most `timeout` seconds for
        it (0: not at all); False when it did not hold: the queue's bound pushes back."""
        with self._cond:
            if not self._cond.wait_for(room, timeout):
                return False
            add()
            self._cond.notify_all()
            return True

    def wait(self, timeout: float) -> None:
        """Wait at most `timeout` seconds for an item, or a nudge."""
        with self._cond:
            self._cond.wait_for(lambda: self._nudged or self._ready(), timeout)
            self._nudged = False

    def nudge(self) -> None:
        """Wake the writer thread waiting for an item."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()
