"""The direct-write fast path without a network: an `Outlet` over a fake stream, the
queues its writer thread drains (a role's mailbox, the fair queue to a peer), and a
writer thread that drains them as the switch's do: under the outlet's lock."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence

import pytest

from workers.switch.frames import Data, Frame
from workers.switch.outlet import Outlet
from workers.switch.peers import FairQueue
from workers.switch.roles import Mailbox
from workers.switch.rules import writes_directly


class FakeStream:
    """Records what is written; `hold` keeps a writer thread in the middle of its write,
    `full` makes a direct write leave its rest, `broken` makes one fail."""

    def __init__(self) -> None:
        self.sock, self._far = socket.socketpair()
        self.written: list[int] = []  # the seq of each frame, in the order it went out
        self.hold = threading.Event()
        self.hold.set()
        self.writing = threading.Event()
        self.full = False
        self.broken = False
        self._rest: list[int] = []

    def write(self, frame: Data, **_: object) -> None:
        self.writing.set()
        assert self.hold.wait(10)
        self.written.append(frame.seq)

    def write_now(self, frames: Sequence[Frame]) -> memoryview | None:
        if self.broken:
            raise OSError("connection reset")
        seqs = [f.seq for f in frames if isinstance(f, Data)]
        if self.full:
            self._rest = seqs
            return memoryview(b"rest")
        self.written.extend(seqs)
        return None

    def write_rest(self, rest: memoryview, **_: object) -> None:
        self.written.extend(self._rest)

    def close(self) -> None:
        self.sock.close()
        self._far.close()


@pytest.fixture
def stream() -> Iterator[FakeStream]:
    fake = FakeStream()
    yield fake
    fake.close()


def _frame(seq: int, body: bytes = b"x") -> Data:
    return Data("job", "c", seq, "G", "D", body, None)


def _box(stream: FakeStream, size: int = 4) -> Mailbox:
    box = Mailbox(size)
    box.outlet.attach(stream)  # type: ignore[arg-type]
    return box


def _direct(box: Mailbox, frame: Data) -> bool | None:
    """A frame for the role, as the switch delivers one: directly if it may, else None."""

    def take() -> list[Data] | None:
        queued = bool(len(box))
        return [frame] if writes_directly(len(frame.body), queued=queued) else None

    return box.outlet.try_write(take)


def _drain_once(box: Mailbox, stream: FakeStream) -> Data | None:
    """One step of the mailbox's writer thread, as roles.py takes it."""
    with box.outlet.lock:
        box.outlet.finish(poll_s=0.1)
        frame = box.pop()
        if frame is not None:
            stream.write(frame)
        return frame


def test_a_frame_never_overtakes_one_the_writer_took_and_is_still_writing(
    stream: FakeStream,
) -> None:
    box = _box(stream)
    assert box.put(_frame(0), 0)
    stream.hold.clear()  # the writer takes frame 0 and stays in the middle of its write
    writer = threading.Thread(target=_drain_once, args=(box, stream))
    writer.start()
    assert stream.writing.wait(10)
    assert len(box) == 0  # nothing queued now: only the lock tells frame 1 to wait
    assert _direct(box, _frame(1)) is None  # without waiting for the lock
    assert box.put(_frame(1), 0)
    stream.hold.set()
    writer.join(10)
    assert _drain_once(box, stream) is not None
    assert stream.written == [0, 1]


def test_a_frame_queued_ahead_goes_first_and_an_idle_outlet_writes_at_once(
    stream: FakeStream,
) -> None:
    box = _box(stream)
    assert _direct(box, _frame(0)) is True  # nothing waits: written on this thread
    assert box.put(_frame(1), 0)  # (a frame the outlet was too busy for)
    assert _direct(box, _frame(2)) is None  # behind frame 1
    assert box.put(_frame(2), 0)
    while _drain_once(box, stream) is not None:
        pass
    assert stream.written == [0, 1, 2] and box.outlet.direct == 1
    assert _direct(box, _frame(3, bytes(70_000))) is None  # large: the writer's


def test_what_the_socket_did_not_take_goes_before_anything_else(stream: FakeStream) -> None:
    woken: list[bool] = []
    box = _box(stream)
    box.outlet = Outlet(wake=lambda: woken.append(True))
    box.outlet.attach(stream)  # type: ignore[arg-type]
    stream.full = True
    assert _direct(box, _frame(0)) is True
    assert woken == [True]  # the writer thread is told to finish it
    stream.full = False
    # until the writer finished it, the frames that follow wait in the mailbox
    assert _direct(box, _frame(1)) is None and box.put(_frame(1), 0)
    assert _drain_once(box, stream) is not None
    assert stream.written == [0, 1]
    assert _direct(box, _frame(2)) is True and stream.written == [0, 1, 2]


def test_a_direct_write_that_fails_is_the_writer_threads_error_next(stream: FakeStream) -> None:
    box = _box(stream)
    stream.broken = True
    assert _direct(box, _frame(0)) is False  # the caller queues it for the next connection
    assert _direct(box, _frame(1)) is None  # the connection is done for direct writes
    with pytest.raises(OSError, match="connection reset"):
        _drain_once(box, stream)
    assert stream._far.recv(1) == b""  # cut: its reader sees the end of the stream
    box.outlet.attach(None)  # the writer thread leaves; no connection until the next
    assert _direct(box, _frame(1)) is None


def test_the_queues_stay_bounded_whatever_the_outlet(stream: FakeStream) -> None:
    box = _box(stream, size=2)
    assert box.put(_frame(0), 0) and box.put(_frame(1), 0)
    assert not box.put(_frame(2), 0)  # full: a peer's frame is dropped, a worker waits
    assert _direct(box, _frame(2)) is None  # and no direct write passes the queue
    fair: FairQueue[str, int] = FairQueue(per_key=1)
    assert fair.put("job1", 1, 0) and not fair.put("job1", 2, 0)
    assert fair.put("job2", 3, 0)  # another job has its own bound
    assert [fair.pop(), fair.pop(), fair.pop()] == [1, 3, None]


def _waits(wait: Callable[[float], None]) -> threading.Thread:
    thread = threading.Thread(target=wait, args=(10,), daemon=True)
    thread.start()
    return thread


def test_the_writer_thread_waits_for_an_item_or_a_nudge(stream: FakeStream) -> None:
    for queue, put in (
        (Mailbox(4), lambda q: q.put(_frame(0), 0)),
        (FairQueue(per_key=4), lambda q: q.put("job", 0, 0)),
    ):
        waiter = _waits(queue.wait)
        queue.nudge()
        waiter.join(5)
        assert not waiter.is_alive()
        waiter = _waits(queue.wait)
        put(queue)
        waiter.join(5)
        assert not waiter.is_alive()
