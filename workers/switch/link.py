"""The link between two roles of a job: the one interface training code sees.

A role never opens a socket to its peer. It holds a `Link`, which delivers
payloads in order and exactly once per channel. `LocalLink` joins two roles in
one process (the single-process reference runs and unit tests); the switch
client (`workers/switch/client.py`) implements the same interface over mutual
TLS through the two clusters' switches.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

import torch

Payload = bytes | torch.Tensor


def payload_nbytes(payload: Payload) -> int:
    """Bytes a payload occupies on the wire, headers excluded."""
    if isinstance(payload, torch.Tensor):
        return payload.element_size() * payload.numel()
    return len(payload)


@dataclass(frozen=True)
class LinkEstimate:
    """What the switches measured of the link between two clusters.

    Measured on the live link from acknowledged bytes: `bandwidth_bytes_per_s` is the rate
    at which the far switch acknowledged payload bytes while the sender had data queued,
    `rtt_s` the time from a frame leaving to its acknowledgement coming back. `samples`
    counts the acknowledgements the figures rest on (0: nothing measured yet).
    """

    bandwidth_bytes_per_s: float
    rtt_s: float
    samples: int


class LinkClosed(Exception):
    """The link was closed while a role was sending or waiting to receive."""


class Link(Protocol):
    """An ordered, exactly-once, per-channel pipe between two roles of one job."""

    def send(self, channel: str, payload: Payload) -> None:
        """Queue a payload for the peer on `channel` (may block for backpressure)."""
        ...

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        """Next payload from the peer on `channel`; raises TimeoutError or LinkClosed."""
        ...

    def bytes_sent(self) -> dict[str, int]:
        """Payload bytes sent so far, per channel."""
        ...

    def close(self) -> None:
        """Stop the link; blocked receivers get LinkClosed."""
        ...

    def link_estimate(self) -> LinkEstimate | None:
        """The latest measurement of the link to the peer, or None while there is none."""
        ...


_CLOSED = object()


@dataclass
class _Mailbox:
    queues: defaultdict[str, queue.Queue[object]] = field(
        default_factory=lambda: defaultdict(lambda: queue.Queue(maxsize=64))
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def queue_for(self, channel: str) -> queue.Queue[object]:
        with self.lock:
            return self.queues[channel]


class LocalLink:
    """Both ends of a link inside one process, with the same semantics as the switch."""

    def __init__(self, inbox: _Mailbox, outbox: _Mailbox) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self._sent: defaultdict[str, int] = defaultdict(int)
        self._closed = threading.Event()

    @classmethod
    def pair(cls) -> tuple[LocalLink, LocalLink]:
        """Two connected ends: what one sends on a channel the other receives."""
        a_to_b, b_to_a = _Mailbox(), _Mailbox()
        return cls(inbox=b_to_a, outbox=a_to_b), cls(inbox=a_to_b, outbox=b_to_a)

    def send(self, channel: str, payload: Payload) -> None:
        """Queue a payload for the peer; tensors are copied so the sender may reuse buffers."""
        if self._closed.is_set():
            raise LinkClosed(channel)
        item: Payload = payload.detach().clone() if isinstance(payload, torch.Tensor) else payload
        self._sent[channel] += payload_nbytes(payload)
        self._outbox.queue_for(channel).put(item)

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        """Next payload on `channel`."""
        try:
            item = self._inbox.queue_for(channel).get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"nothing on channel {channel!r} within {timeout} s") from None
        if item is _CLOSED:
            raise LinkClosed(channel)
        assert isinstance(item, bytes | torch.Tensor)
        return item

    def bytes_sent(self) -> dict[str, int]:
        """Payload bytes sent so far, per channel."""
        return dict(self._sent)

    def link_estimate(self) -> LinkEstimate | None:
        """None: both ends share one process, there is no link to measure."""
        return None

    def close(self) -> None:
        """Wake every receiver blocked on this end."""
        self._closed.set()
        with self._inbox.lock:
            channels = list(self._inbox.queues.values())
        for q in channels:
            q.put(_CLOSED)
