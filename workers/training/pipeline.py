"""The helper threads of a role: sends, codec work and link waits off the compute thread.

A `Stage` runs `work(item)` for each queued item, in order, on its own thread, and
hands what `work` returns to the role through `results`; an error in the thread is
raised in the role at its next `put`, `get` or `close`. A `Source` produces items on
its thread until it returns None. ABNet's sending threads encode and its receiving
threads decode, so the compute thread only queues tensors and picks up decoded ones;
ELECTRA's roles send through an `AsyncSender`, a `Stage` whose work is `link.send`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from workers.switch.link import Link, Payload

In = TypeVar("In")
Out = TypeVar("Out")
_END = object()


class Stage(Generic[In, Out]):
    """One thread applying `work` to queued items in order."""

    def __init__(
        self, name: str, work: Callable[[In], Out | None], depth: int = 16, results: int = 0
    ) -> None:
        self._work = work
        self._inbox: queue.Queue[object] = queue.Queue(maxsize=depth)
        self.results: queue.Queue[object] = queue.Queue(maxsize=results)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _END:
                return
            if self._error is not None:
                continue  # drain what is queued; the role hears of the error
            try:
                out = self._work(item)  # type: ignore[arg-type]
            except BaseException as exc:  # handed to the role thread
                self._error = exc
                self.results.put(exc)
                continue
            if out is not None:
                self.results.put(out)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, item: In) -> None:
        """Queue an item; blocks only while `depth` items wait."""
        self._raise()
        self._inbox.put(item)

    def get(self, timeout: float | None) -> Out:
        """The next result, waiting up to `timeout` seconds (TimeoutError past it)."""
        try:
            out = self.results.get(timeout=timeout)
        except queue.Empty:
            self._raise()
            raise TimeoutError(f"no result from {self._thread.name} in {timeout} s") from None
        if isinstance(out, BaseException):
            raise out
        return out  # type: ignore[return-value]

    def poll(self) -> Out | None:
        """The next result if one is ready, else None."""
        try:
            out = self.results.get_nowait()
        except queue.Empty:
            return None
        if isinstance(out, BaseException):
            raise out
        return out  # type: ignore[return-value]

    def close(self, timeout: float | None = None) -> None:
        """Finish what is queued, then end the thread; raises its error, if any."""
        self._inbox.put(_END)
        self._thread.join(timeout)
        self._raise()


class Source(Generic[Out]):
    """A thread calling `produce()` until it returns None, its results queued `depth` deep."""

    def __init__(self, name: str, produce: Callable[[], Out | None], depth: int = 2) -> None:
        self._produce = produce
        self.results: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                out = self._produce()
            except BaseException as exc:  # handed to the role thread
                self.results.put(exc)
                return
            if out is None:
                return
            self.results.put(out)

    def get(self, timeout: float | None) -> Out:
        """The next result (TimeoutError past `timeout`); the producer's error is raised here."""
        try:
            out = self.results.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"nothing from {self._thread.name} in {timeout} s") from None
        if isinstance(out, BaseException):
            raise out
        return out  # type: ignore[return-value]

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after its producer returned None)."""
        self._thread.join(timeout)


class AsyncSender:
    """Sends on a background thread so the role computes micro-batch k+1 while k is on the wire.

    Order per channel is kept (one thread, one FIFO). An error in the thread is
    raised in the role at its next `send` or `close`.
    """

    def __init__(self, link: Link, depth: int = 8) -> None:
        self._stage: Stage[tuple[str, Payload], None] = Stage(
            "training-sender", lambda item: link.send(*item), depth
        )

    def send(self, channel: str, payload: Payload) -> None:
        """Queue a payload; blocks only when `depth` payloads are still waiting."""
        self._stage.put((channel, payload))

    def close(self) -> None:
        """Wait until everything queued has been handed to the link."""
        self._stage.close()
