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
# references to a buffer the pool alone holds: its list's, and getrefcount's argument
_POOL_ONLY: Final = 2


class BufferPool:
    """Large `bytearray`s, handed out again once no one else refers to them."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._kept: list[bytearray] = []
        self._kept_bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # buffers handed out again (what the pool saved)

    def take(self, nbytes: int) -> bytearray:
        """A buffer of exactly `nbytes`, its contents unspecified: the caller fills it."""
        if nbytes < POOLED_BYTES:
            return bytearray(nbytes)
        kept = self._kept
        with self._lock:
            spare = -1  # a free buffer of another size, given up if room is needed
            for i in range(len(kept)):
                if sys.getrefcount(kept[i]) != _POOL_ONLY:
                    continue
                if len(kept[i]) == nbytes:
                    self.reused += 1
                    return kept[i]
                spare = i
            if self._kept_bytes + nbytes > self.max_bytes and spare >= 0:
                self._kept_bytes -= len(kept.pop(spare))
            buf = bytearray(nbytes)
            if self._kept_bytes + nbytes <= self.max_bytes:
                kept.append(buf)
                self._kept_bytes += nbytes
            return buf

    def kept_bytes(self) -> int:
        """Bytes of the buffers the pool keeps, in use or free."""
        with self._lock:
            return self._kept_bytes


# the process's pool for frame bodies: every connection's decoder and every link's
# resend copies; 32 frames of 4 MiB, in use or free
BODIES: Final = BufferPool(max_bytes=128 * 1024 * 1024)
