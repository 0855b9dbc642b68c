"""Body buffers used again once nothing refers to them any more.

A large body in a fresh `bytearray` costs more than the bytes it receives: the
allocator maps new pages for it (a page fault for each 4 KiB first written) and
`bytearray(n)` zeroes them all, on each of the three reads a frame takes on its way
(switch A, switch B, the receiving role), and once more for the copy a sending role
keeps for resending. A `BufferPool` keeps the buffers of large bodies and hands one
out again only when its reference count says that the pool alone holds it: no frame,
memoryview or tensor refers to it (a frame waiting in a mailbox or a resend window,
or a tensor a role kept, keeps its buffer out of use until it is dropped). What the
pool keeps is bounded by `max_bytes`; past it, buffers are made as before and freed
as before. The pool never hands out a buffer's old bytes: a decoder fills a body
entirely before it yields the frame, and a sender copies the whole payload in.
"""

from __future__ import annotations

import sys
import threading
from typing import Final

# below this a body is cheaper to allocate than to look up (the allocator's own pools)
POOLED_BYTES: Final = 64 * 1024
# buffers a pool tracks at most: each `take` looks at each of them once
MAX_BUFFERS: Final = 256
# references to a buffer the pool alone holds: its list's, and getrefcount's argument
_POOL_ONLY: Final = 2


class BufferPool:
    """Large `bytearray`s, handed out again once no one else refers to them.

    It tracks the buffers it made, up to `max_bytes` and `MAX_BUFFERS` of them (in use
    or free: a frame queued for a slow reader keeps its buffer, and on a busy link most
    are queued), and keeps no more than `max_free_bytes` of free ones: what it holds on
    to beyond what is in use. A buffer past these bounds is made and freed as before.
    """

    def __init__(self, *, max_bytes: int, max_free_bytes: int) -> None:
        self.max_bytes, self.max_free_bytes = max_bytes, max_free_bytes
        self._kept: list[bytearray] = []
        self._kept_bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # buffers handed out again (what the pool saved)

    def take(self, nbytes: int) -> bytearray:
        """A buffer of exactly `nbytes`, its contents unspecified: the caller fills it."""
        if nbytes < POOLED_BYTES:
            return bytearray(nbytes)
        with self._lock:
            kept = self._kept
            free = [i for i in range(len(kept)) if sys.getrefcount(kept[i]) == _POOL_ONLY]
            chosen = next((i for i in free if len(kept[i]) == nbytes), None)
            buf = kept[chosen] if chosen is not None else bytearray(nbytes)
            spare = [i for i in free if i != chosen]
            if spare and (
                sum(len(kept[i]) for i in spare) > self.max_free_bytes
                or (chosen is None and self._kept_bytes + nbytes > self.max_bytes)
            ):
                # free buffers beyond the bound (or of a size no longer asked for)
                # are let go, the oldest first
                self._let_go(spare)
            if chosen is not None:
                self.reused += 1
            elif self._kept_bytes + nbytes <= self.max_bytes and len(self._kept) < MAX_BUFFERS:
                self._kept.append(buf)
                self._kept_bytes += nbytes
            return buf

    def _let_go(self, spare: list[int]) -> None:
        kept, budget = self._kept, self.max_free_bytes
        drop = set()
        for i in reversed(spare):  # the newest are kept
            if len(kept[i]) <= budget:
                budget -= len(kept[i])
            else:
                drop.add(i)
        if not drop:
            drop = {spare[0]}
        self._kept_bytes -= sum(len(kept[i]) for i in drop)
        self._kept = [buf for i, buf in enumerate(kept) if i not in drop]

    def kept_bytes(self) -> int:
        """Bytes of the buffers the pool tracks, in use or free."""
        with self._lock:
            return self._kept_bytes


# the process's pool for frame bodies: every connection's decoder and every link's
# resend copies; it tracks up to 1 GiB of them (a switch's mailboxes and windows may
# hold that much on a busy link) and keeps at most 64 MiB free
BODIES: Final = BufferPool(max_bytes=1024 * 1024 * 1024, max_free_bytes=64 * 1024 * 1024)
