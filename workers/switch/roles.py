"""The role table: worker admission, mailboxes, sending and receiving for roles.

A role's frames wait in its mailbox for the writer thread of its receiving connection;
when none waits there, the thread that has one (a peer connection's reader, or a worker's
of this cluster) writes it to the role itself (`_deliver_direct`, outlet.py), one thread
hand-off fewer per small frame. A worker's frame for a peer goes the same way
(`Peers._send_direct`) when the peer's fair queue is empty.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from contract.jobtoken import (
    JobClaims,
    JobTokenError,
    verify_job_token,
)
from workers.switch import frames
from workers.switch.core import (
    POLL_S,
    Address,
    RoleKey,
    log,
)
from workers.switch.doors import Doors
from workers.switch.outlet import Drained
from workers.switch.peers import Outbound
from workers.switch.protocol import (
    CLOSED,
    Ack,
    Data,
    Direction,
    Error,
    LinkReport,
    ProtocolError,
    Receipt,
    Routed,
    Welcome,
)
from workers.switch.rules import (
    UnclaimedMailboxes,
    admit_worker,
    channel_refusal,
    writes_directly,
)
from workers.switch.stream import FrameStream


class Mailbox(Drained):
    """A role's frames waiting for its receiving connection, at most `size`; that
    connection's writer thread drains it, and past it, while it is empty, the threads
    that have frames for the role write them on the connection themselves (`outlet`)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self._frames: collections.deque[Routed] = collections.deque()

    def put(self, frame: Routed, timeout: float) -> bool:
        """Queue `frame`; False when the mailbox stayed full for `timeout` (0: not at all)."""
        return self._put_when(
            lambda: len(self._frames) < self.size, lambda: self._frames.append(frame), timeout
        )

    def pop(self) -> Routed | None:
        """The oldest frame, or None when there is none."""
        with self._cond:
            if not self._frames:
                return None
            self._cond.notify_all()  # room for a sender that waits
            return self._frames.popleft()

    def _ready(self) -> bool:
        return bool(self._frames)

    def __len__(self) -> int:
        with self._cond:
            return len(self._frames)


@dataclass
class Role:
    """A job attempt's role on this switch: its live connections and what it holds."""

    claims: JobClaims
    peer_cluster: str | None  # where its peer role runs, when known
    connections: dict[Direction, FrameStream] = field(default_factory=dict)
    goodbye: bool = False  # it said it is done: no resume
    detached_at: float | None = None  # its connections dropped; it may come back


@dataclass
class Jobs:
    """What the switch holds per job attempt: roles, mailboxes, and the attempts over."""

    # mailboxes a peer's frames made for roles that have not connected here
    unclaimed: UnclaimedMailboxes[RoleKey]
    roles: dict[RoleKey, Role] = field(default_factory=dict)
    mailboxes: dict[RoleKey, Mailbox] = field(default_factory=dict)
    # job -> role -> cluster, learned from the job tokens of its roles that connected here
    placement: dict[str, dict[str, str]] = field(default_factory=dict)
    # (job, role)s whose attempt ended here, oldest first: their late frames are dropped
    ended: collections.OrderedDict[RoleKey, None] = field(default_factory=collections.OrderedDict)


class Roles(Doors):
    """The role table: workers admitted by job token, their mailboxes, their end."""

    def held_state(self) -> dict[str, int]:
        """How much per-job state the switch holds now (mailboxes, roles, queues)."""
        with self._lock:
            roles = self._jobs.roles.values()
            held = {
                "mailboxes": len(self._jobs.mailboxes),
                "roles": len(self._jobs.roles),
                "detached_roles": sum(r.detached_at is not None for r in roles),
            }
            outbound = list(self._outbound.values())
        held["job_queues"] = sum(out.queue.keys() for out in outbound)
        return held

    def wait_role_ended(self, job_id: str, role: str, timeout: float) -> bool:
        """Wait until the attempt `job_id`'s `role` has no connection left here."""
        with self._changed:
            return self._changed.wait_for(lambda: (job_id, role) not in self._jobs.roles, timeout)

    def _serve_worker(self, raw: socket.socket, address: Address) -> None:
        stream = self._open_door(raw, "worker", address)
        if stream is None:
            return
        sock = stream.sock
        with self._lock:
            self._doors.workers.add(stream)
        admitted: tuple[RoleKey, Direction] | None = None
        try:
            hello = stream.read_event()
            if not isinstance(hello, frames.Hello):
                self._refuse(sock, "worker", address, "expected a hello", "protocol", stream)
                return
            try:
                claims = verify_job_token(hello.token, self._token_key)
            except JobTokenError as exc:
                self._refuse(sock, "worker", address, f"job token: {exc}", "token", stream)
                return
            key = (claims.job_id, claims.role)
            peer_cluster = self._peer_of(claims, hello.peer_role)
            with self._lock:
                role = self._jobs.roles.get(key)
                live = role.connections if role is not None else {}
                ended = key in self._jobs.ended
                refusal = admit_worker(hello, claims, self.cluster, live, ended=ended)
                if refusal is None:
                    if role is None:
                        role = self._jobs.roles[key] = Role(claims, peer_cluster)
                    if role.detached_at is not None:
                        log.info("switch %s: role %s of job %s resumes", self.cluster, *key[::-1])
                    role.connections[hello.direction] = stream
                    placed = self._jobs.placement.setdefault(claims.job_id, {})
                    placed.update(claims.placement)
                    placed[claims.role] = self.cluster
                    role.detached_at = None
                    admitted = key, hello.direction
            if refusal is not None:
                label = "token" if refusal.startswith(("job token", "hello")) else "role"
                self._refuse(sock, "worker", address, refusal, label, stream)
                return
            sock.settimeout(None)
            stream.write(Welcome())
            self._authenticated()
            if hello.direction is Direction.SEND:
                self._worker_sends(stream, claims, hello, address)
            else:
                self._worker_receives(stream, claims, hello)
        except (OSError, ProtocolError) as exc:
            if not self._stop.is_set():
                log.info(
                    "switch %s: worker connection from %s ended: %s", self.cluster, address, exc
                )
        finally:
            with self._lock:
                self._doors.workers.discard(stream)
            if admitted is not None:
                self._leave(*admitted, stream)
            stream.close()

    def _leave(self, key: RoleKey, direction: Direction, stream: FrameStream) -> None:
        """A role's connection has closed; once all have, the attempt ends here, at once
        after its goodbye, else when it has not come back within `resume_grace_s`."""
        with self._lock:
            role = self._jobs.roles.get(key)
            if role is None or role.connections.get(direction) is not stream:
                return
            del role.connections[direction]
            if role.connections:
                return
            if not role.goodbye and self.config.resume_grace_s > 0 and not self._stop.is_set():
                role.detached_at = time.monotonic()
                return
        self._end_role(key)

    def _housekeeping(self, now: float) -> None:
        self._end_detached(now)
        self._expire_unclaimed(now)

    def _expire_unclaimed(self, now: float) -> None:
        """Give up the mailboxes a peer's frames made for roles that never connected."""
        with self._lock:
            late = self._jobs.unclaimed.expired(now)
            for key in late:
                self._jobs.mailboxes.pop(key, None)
        for job_id, role in late:
            log.info(
                "switch %s: gave up the mailbox of job %s for %s: no role claimed it in %.0f s",
                self.cluster,
                job_id,
                role,
                self.config.unclaimed_mailbox_s,
            )
            self._meters.refused.labels("unclaimed_expired").inc()

    def _end_detached(self, now: float) -> None:
        """End the attempts whose roles left without a goodbye and did not come back."""
        grace = self.config.resume_grace_s
        with self._lock:
            gone = [
                key
                for key, role in self._jobs.roles.items()
                if role.detached_at is not None and now - role.detached_at > grace
            ]
        for key in gone:
            log.info("switch %s: role %s of job %s did not come back", self.cluster, *key[::-1])
            self._end_role(key)

    def _end_role(self, key: RoleKey) -> None:
        # A new attempt has a new job id, so what this one held here is freed now, not
        # when the switch restarts; its late frames are dropped.
        with self._changed:
            role = self._jobs.roles.get(key)
            if role is None or role.connections:
                return
            del self._jobs.roles[key]
            self._jobs.mailboxes.pop(key, None)
            self._jobs.unclaimed.claim(key)
            if not any(job == key[0] for job, _ in self._jobs.roles):
                self._jobs.placement.pop(key[0], None)
            self._jobs.ended[key] = None
            while len(self._jobs.ended) > self.config.ended_roles_kept:
                self._jobs.ended.popitem(last=False)
            self._changed.notify_all()
        if role.peer_cluster is not None:
            for gauge in (self._meters.bandwidth, self._meters.rtt):
                with contextlib.suppress(KeyError):
                    gauge.remove(key[0], role.peer_cluster)

    def _peer_of(self, claims: JobClaims, dst_role: str) -> str | None:
        """The cluster whose switch serves `dst_role` of the job, or None if unknown."""
        if dst_role in claims.placement:
            return claims.placement[dst_role]
        with self._lock:
            peers = list(self._outbound)
        return peers[0] if len(peers) == 1 else None

    def _route(self, claims: JobClaims, dst_role: str) -> str:
        """The cluster whose switch serves `dst_role` of the job."""
        target = self._peer_of(claims, dst_role)
        if target is None:
            raise ProtocolError(f"no placement for role {dst_role!r} among several peers")
        return target

    def _worker_sends(
        self, stream: FrameStream, claims: JobClaims, hello: frames.Hello, address: Address
    ) -> None:
        target = self._route(claims, hello.peer_role)
        stall = self.config.io_timeout_s
        count = 0  # frames taken on this connection
        said_at = time.monotonic()

        def idle() -> float:
            """Reading waits: cut a worker that sends nothing, not even its pings."""
            silent = time.monotonic() - stream.last_read_at
            if silent > stall:
                raise TimeoutError(f"the worker sent nothing for {stall:.0f} s")
            return stall - silent

        def here() -> bool:
            """Waiting on room for a frame, the worker's pings go unread: say we are here."""
            nonlocal said_at
            if time.monotonic() - said_at >= self.config.ping_interval_s:
                stream.write(Ack(count))
                said_at = time.monotonic()
            return not self._stop.is_set()

        while not self._stop.is_set():
            frame = stream.read_event(idle=idle)
            if frame is CLOSED:
                return
            if isinstance(frame, Error):  # the role's goodbye: it is done, no resume
                with self._lock:
                    role = self._jobs.roles.get((claims.job_id, claims.role))
                    if role is not None:
                        role.goodbye = True
                return
            if isinstance(frame, frames.Ping):
                stream.write(Ack(count, ping=frame.id))
                continue
            if not isinstance(frame, Data | Receipt):
                raise ProtocolError("workers send only data frames, receipts and pings")
            reason = channel_refusal(frame, claims, hello.peer_role)
            if reason is not None:
                self._refuse(stream.sock, "worker frame", address, reason, "channel", stream)
                return
            count += 1
            # sequence numbers are the roles' own, end to end: a role resending after a
            # switch restart repeats them, and its peer drops what it already has
            self._meters.count(frame, "from_worker")
            said_at = time.monotonic()
            if target == self.cluster:
                self._deliver(frame, here)
                continue
            outbound = self._outbound.get(target)
            if outbound is None:
                raise ProtocolError(f"no peer switch for cluster {target!r}")
            if self._send_direct(outbound, frame):
                continue
            item = (frame, time.monotonic())
            while not outbound.queue.put(frame.job_id, item, timeout=POLL_S):
                if not here():
                    raise OSError("switch stopping")

    def _mailbox_locked(self, key: RoleKey, peer: str | None = None) -> Mailbox | str:
        """The mailbox of (job, role), made if there is room, or why there is none; the
        caller holds the lock. With `peer`, a peer's frame asks for the mailbox of a role
        not connected here: it is made on probation (`Jobs.unclaimed`), within the peer's
        share. Without, the role (or one of its job on this cluster) asks: it claims the
        mailbox, and takes the place of the oldest on probation when the table is full."""
        jobs = self._jobs
        box = jobs.mailboxes.get(key)
        if box is not None:
            if peer is None:
                jobs.unclaimed.claim(key)
            return box
        if peer is not None and not jobs.unclaimed.may_open(peer):
            return f"{jobs.unclaimed.per_peer} unclaimed mailboxes of {peer} in use"
        if len(jobs.mailboxes) >= self.config.max_mailboxes:
            evicted = jobs.unclaimed.oldest() if peer is None else None
            if evicted is None:
                return f"{self.config.max_mailboxes} mailboxes in use"
            del jobs.mailboxes[evicted]
            log.info(
                "switch %s: the unclaimed mailbox of %s for %s made way for a role",
                self.cluster,
                *evicted,
            )
        box = jobs.mailboxes[key] = Mailbox(self.config.mailbox_frames)
        if peer is not None:
            jobs.unclaimed.open(key, peer, time.monotonic())
        return box

    def _deliver(
        self, frame: Routed, alive: Callable[[], bool] | None, *, peer: str | None = None
    ) -> bool:
        """Put `frame` in its role's mailbox; False when dropped: that attempt has ended
        here, no mailbox is left for a new one, or (with `alive` None, for frames from a
        peer, which never wait on one job) the mailbox is full. The roles' end-to-end
        resend makes good a dropped frame. With `alive`, waits for room (OSError when
        stopping or `alive()` turns false). With `peer`, the frame came from that peer for
        a role not connected here (`_mailbox_locked`)."""
        key = (frame.job_id, frame.dst_role)
        while not self._stop.is_set() and (alive is None or alive()):
            with self._lock:
                if key in self._jobs.ended:
                    return False
                box = self._mailbox_locked(key, peer)
            if isinstance(box, str):
                log.warning(
                    "switch %s: dropped a frame of job %s: %s", self.cluster, frame.job_id, box
                )
                self._meters.refused.labels("mailboxes").inc()
                return False
            if self._deliver_direct(box, frame):
                return True
            # a poll at a time, so that an attempt ending meanwhile is noticed
            if box.put(frame, POLL_S if alive is not None else 0):
                return True
            if alive is None:
                self._meters.refused.labels("mailbox_full").inc()
                return False
        raise OSError("switch stopping or connection closed")

    def _deliver_direct(self, box: Mailbox, frame: Routed) -> bool:
        """Write `frame` to its role's receiving connection on this thread, when nothing
        waits in the mailbox ahead of it (outlet.py); False: put it in the mailbox (also
        when the connection broke in the write: the role's next connection takes it)."""
        nbytes = len(frame.body) if isinstance(frame, Data) else 0

        def take() -> list[Routed] | None:
            return [frame] if writes_directly(nbytes, queued=bool(len(box))) else None

        if not box.outlet.try_write(take):
            return False
        self._meters.count(frame, "to_worker")
        self._meters.direct["to_worker"].inc()
        return True

    def _worker_receives(self, stream: FrameStream, claims: JobClaims, hello: frames.Hello) -> None:
        with self._lock:
            box = self._mailbox_locked((claims.job_id, claims.role))
        if isinstance(box, str):
            raise ProtocolError(f"no mailbox: {box}")
        peer = self._peer_of(claims, hello.peer_role)
        outbound = self._outbound.get(peer) if peer is not None else None
        stall = self.config.io_timeout_s
        answers: list[Ack] = []  # pings read, to answer between frames

        def hear() -> bool:
            """Take the worker's pings (it sends nothing else here); False once it has
            closed; cut a worker that sends nothing, not even them. Writes nothing: it
            may run in the middle of a frame."""
            while (event := stream.read_event(block=False)) is not None:
                if event is CLOSED or isinstance(event, Error):
                    return False
                if not isinstance(event, frames.Ping):
                    raise ProtocolError("a receiving worker sends only pings")
                answers.append(Ack(0, ping=event.id))
            if time.monotonic() - stream.last_read_at > stall:
                raise TimeoutError(f"the worker sent nothing for {stall:.0f} s")
            return True

        def hear_while_blocked() -> None:
            if not hear():
                raise OSError("the worker closed the connection")

        reported = -1
        outlet = box.outlet
        with outlet.lock:
            outlet.attach(stream)
        try:
            while not self._stop.is_set():
                # each step holding the outlet's lock: between them, the threads that have
                # frames for the role write them on the connection themselves (outlet.py)
                with outlet.lock:
                    if outbound is not None and outbound.meter.version != reported:
                        reported = outbound.meter.version
                        self._report_link(stream, claims.job_id, outbound)
                    outlet.finish(while_blocked=hear_while_blocked, poll_s=POLL_S)
                    # taken under the lock: no frame written directly overtakes it
                    frame = box.pop()
                    if frame is not None:
                        stream.write(frame, while_blocked=hear_while_blocked, poll_s=POLL_S)
                        self._meters.count(frame, "to_worker")
                    if not hear():
                        return
                    for ack in answers:
                        stream.write(ack)
                    answers.clear()
                if frame is None:
                    box.wait(POLL_S)
        finally:
            with outlet.lock:
                if outlet.stream is stream:
                    outlet.attach(None)

    def _report_link(self, stream: FrameStream, job_id: str, out: Outbound) -> None:
        """Tell a role what was measured of the link its own frames leave on (and /metrics)."""
        estimate = out.meter.estimate()
        if estimate is None:
            return
        bandwidth, rtt, samples = estimate
        self._meters.bandwidth.labels(job_id, out.cluster).set(bandwidth)
        self._meters.rtt.labels(job_id, out.cluster).set(rtt)
        stream.write(LinkReport(bandwidth, rtt, samples))
