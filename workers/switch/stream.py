"""The thin shell between a blocking TLS socket and a protocol `Connection`."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Callable, Sequence

from workers.switch.protocol import NEED_DATA, Buffer, Connection, Event, Frame
from workers.switch.shaper import Shaper

READ_CHUNK = 256 * 1024
# a body this small goes out in one write with its header: one TLS record and one system
# call instead of two (an SSLSocket has no sendmsg); a larger one is never copied
COALESCE_BYTES = 64 * 1024
# the shortest wait for bytes in the middle of a body (an idle callback's 0 means "now")
MIN_WAIT_S = 0.001


def tune(sock: socket.socket, *, keepalive_s: int = 5) -> None:
    """No Nagle delay, and TCP keepalive probes after `keepalive_s` idle seconds, so that a
    peer host gone without a word is noticed within seconds, not hours."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", keepalive_s), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def cut(sock: socket.socket) -> None:
    """Shut a connection down from a thread other than its reader's; the reader then
    sees the end of the stream and closes the socket.

    Not `SSLSocket.shutdown`: it drops the TLS state first, and a reader in the middle
    of a frame would go on with a plain `recv_into`, taking the ciphertext of the TLS
    records still queued as the frame's bytes. The descriptor's own shutdown leaves
    the TLS layer in place to see the end of the stream.
    """
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _due(idle: Callable[[], float | None], now: float) -> float | None:
    """Call `idle()`; when it is to be called again (None: once bytes come)."""
    wait = idle()
    return None if wait is None else now + wait


class FrameStream:
    """Reads and writes frames on one socket; the owner keeps it to one thread."""

    def __init__(self, sock: ssl.SSLSocket | socket.socket, conn: Connection) -> None:
        self.sock = sock
        self.conn = conn
        self._scratch = bytearray(READ_CHUNK)
        self.last_read_at = time.monotonic()
        # bytes TLS has decrypted and holds are not the socket's: a readiness check asks
        # it first. A poll object made once costs less per check than `select` (a list
        # and a descriptor look-up each time); a descriptor closed under it answers
        # POLLNVAL, and the read after it fails as any read of a closed socket does.
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def read_event(
        self, *, block: bool = True, idle: Callable[[], float | None] | None = None
    ) -> Event | None:
        """The next event; with `block=False`, None when nothing has arrived yet.

        With `idle`, a read that would block calls `idle()` first (a frame's body: once
        before it) and waits at most the seconds it returns (None: until bytes come)
        before calling it again, so that the reading thread can do its own timed work
        (acknowledgements due, pings, stall checks) on its socket.
        """
        while True:
            event = self.conn.next_event()
            if event is not NEED_DATA:
                return event
            if not block and not self._readable():
                return None
            body = self.conn.body_view()
            if body is not None:
                got = self._fill(body, idle)
                self.conn.advance_body(got)
                if got < len(body):
                    self.conn.receive_data(b"")
            else:
                self._wait_readable(idle)
                count = self.sock.recv_into(self._scratch)
                self.last_read_at = time.monotonic()
                self.conn.receive_data(memoryview(self._scratch)[:count])

    def _fill(self, body: memoryview, idle: Callable[[], float | None] | None) -> int:
        """Receive into the whole of `body` (one protocol step per frame, not per TLS
        record); the bytes received, fewer at the end of the stream.

        The wait for bytes is the socket's own: with `idle`, the socket's timeout is set
        to the seconds `idle()` allows, and `idle()` is called again when they are up (a
        record that did not come within them, or a clock check after each record). A
        readiness check before every 16 KiB record instead (a `select` and a `pending`,
        each releasing the GIL) cost about 0.3 ms of CPU per 4 MiB frame on each of the
        three sockets a frame is read from on its way (bench/results/switch_profiles).
        """
        got, size = 0, len(body)
        if idle is None:
            while got < size and (count := self.sock.recv_into(body[got:])):
                got += count
                self.last_read_at = time.monotonic()
            return got
        restore = timeout = self.sock.gettimeout()
        now = time.monotonic()
        due = _due(idle, now)
        try:
            while got < size:
                if due is None:
                    wanted = None
                else:
                    # a timeout of 0 would make the socket non-blocking: wait a little
                    wanted = due - now if due - now > MIN_WAIT_S else MIN_WAIT_S
                    # setting the timeout is a system call: not for each record, so the
                    # wait may end a little after the due time (1 ms and a twentieth)
                    if timeout is not None and wanted <= timeout <= wanted * 1.05 + 0.001:
                        wanted = timeout
                if wanted != timeout:
                    self.sock.settimeout(wanted)
                    timeout = wanted
                try:
                    count = self.sock.recv_into(body[got:])
                except TimeoutError:  # nothing within the wait: the reader's timed work
                    now = time.monotonic()
                    due = _due(idle, now)
                    continue
                if not count:
                    break
                got += count
                self.last_read_at = now = time.monotonic()
                if due is not None and now >= due:
                    due = _due(idle, now)
        finally:
            if timeout != restore:
                with contextlib.suppress(OSError):  # a socket cut meanwhile
                    self.sock.settimeout(restore)
        return got

    def _wait_readable(self, idle: Callable[[], float | None] | None) -> None:
        while idle is not None and not self._readable():
            wait = idle()
            if wait is None or self._readable(wait):
                return

    def wait_readable(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for bytes to read; whether some came."""
        return self._readable(timeout)

    def _readable(self, timeout: float = 0) -> bool:
        if self._tls and self.sock.pending():  # type: ignore[union-attr]
            return True
        return bool(self._poll.poll(max(timeout, 0.0) * 1000))

    def write(
        self,
        frame: Frame,
        shaper: Shaper | None = None,
        *,
        while_blocked: Callable[[], None] | None = None,
        poll_s: float = 0.2,
    ) -> int:
        """Write one frame (paced by `shaper` if given); returns the bytes written.

        With `while_blocked`, a write the peer does not take is not a blind wait: every
        `poll_s` it is called, so that it can read what the peer sent meanwhile and raise
        when the peer has gone (an end of stream is otherwise unseen until the socket's
        timeout); it is also called between paced chunks. The socket's timeout still
        bounds a write that makes no progress.
        """
        buffers = self.conn.send(frame)
        if len(buffers) == 2 and memoryview(buffers[1]).nbytes <= COALESCE_BYTES:
            buffers = [b"".join(buffers)]
        total = 0
        pieces = shaper.chunks(buffers) if shaper is not None else buffers
        for piece in pieces:
            if while_blocked is None:
                self.sock.sendall(piece)
            else:
                self._send_watching(piece, while_blocked, poll_s)
                if shaper is not None:
                    while_blocked()
            total += memoryview(piece).nbytes
        return total

    def write_now(self, frames: Sequence[Frame]) -> memoryview | None:
        """Write small frames in one send that does not wait on the socket: None once all
        of it went, else the bytes the socket did not take now.

        Those bytes must be the next written on this stream (`write_rest`), before any
        other: TLS takes a write it could not finish only again, with the same bytes (a
        record may be half out). The thread that has a frame writes it so without ever
        waiting on a slow reader at the other end (outlet.py).
        """
        data = b"".join(buf for frame in frames for buf in self.conn.send(frame))
        view = memoryview(data)
        restore = self.sock.gettimeout()
        self.sock.settimeout(0.0)
        sent = 0
        try:
            while sent < len(view):
                sent += self.sock.send(view[sent:])
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            return view[sent:]
        finally:
            self.sock.settimeout(restore)
        return None

    def write_rest(
        self,
        rest: memoryview,
        *,
        while_blocked: Callable[[], None] | None = None,
        poll_s: float = 0.2,
    ) -> None:
        """Write what `write_now` left, waiting on the socket as `write` does."""
        if while_blocked is None:
            self.sock.sendall(rest)
        else:
            self._send_watching(rest, while_blocked, poll_s)

    def _send_watching(
        self, piece: Buffer, while_blocked: Callable[[], None], poll_s: float
    ) -> None:
        view = memoryview(piece).cast("B")
        limit = self.sock.gettimeout()
        step = poll_s if limit is None else min(poll_s, limit)
        sent = 0
        progress_at = time.monotonic()
        while sent < len(view):
            self.sock.settimeout(step)
            try:
                # a timed-out TLS write is retried with the same bytes, as OpenSSL requires
                count = self.sock.send(view[sent:])
            except TimeoutError:
                count = 0
            finally:
                self.sock.settimeout(limit)
            if count:
                sent += count
                progress_at = time.monotonic()
                continue
            if limit is not None and time.monotonic() - progress_at >= limit:
                raise TimeoutError("the peer took no bytes within the timeout")
            while_blocked()

    def close(self) -> None:
        """Close the socket, ignoring errors of an already broken connection."""
        with contextlib.suppress(OSError):
            self.sock.close()
