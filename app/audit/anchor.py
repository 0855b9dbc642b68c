"""Signed heads of the audit chain, kept outside the database in an append-only file.

Someone with rights over the database can delete the newest events and leave a chain
that still verifies; they cannot reach the data directory nor sign. Each line of
`<data dir>/audit/anchors.jsonl` is one head `(seq, hash)` signed with an Ed25519 key
derived from the platform secret for this purpose alone (not the CA's, not the
job-token key), so the table is checked against the newest line.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from app.keyring import Purpose, subkey
from app.settings import Settings

# Lines are ~250 bytes; reading the tail in blocks this size finds the last one at once.
_TAIL_BLOCK = 4096


@dataclass(frozen=True)
class Anchor:
    """One signed head: the chain held `hash` at `seq` when it was signed."""

    seq: int
    hash: str
    # events up to this seq predate the keyed chain (plain sha256; their head is anchored)
    legacy_through: int
    signed_at: datetime
    signature: str  # base64 of Ed25519 over `signed_bytes()`

    def signed_bytes(self) -> bytes:
        """What the signature covers: every field but the signature, canonical JSON."""
        body = {
            "seq": self.seq,
            "hash": self.hash,
            "legacy_through": self.legacy_through,
            "signed_at": self.signed_at.isoformat(timespec="microseconds"),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def to_line(self) -> bytes:
        """The anchor as one JSON line of the anchor file."""
        body = json.loads(self.signed_bytes())
        body["signature"] = self.signature
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Anchor:
        """Parse one line; ValueError when it is not an anchor at all."""
        try:
            body = json.loads(line)
            return cls(
                seq=int(body["seq"]),
                hash=str(body["hash"]),
                legacy_through=int(body["legacy_through"]),
                signed_at=datetime.fromisoformat(body["signed_at"]),
                signature=str(body["signature"]),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an anchor line: {exc}") from exc


def anchor_signing_key(settings: Settings) -> Ed25519PrivateKey:
    """The control plane's anchor key, derived from the platform secret (never stored)."""
    return Ed25519PrivateKey.from_private_bytes(subkey(settings, Purpose.audit_anchor))


def public_key_b64(key: Ed25519PublicKey) -> str:
    """The raw public key, base64, for outside parties checking copies of anchors."""
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def sign(
    key: Ed25519PrivateKey, *, seq: int, hash: str, legacy_through: int, at: datetime
) -> Anchor:
    """A signed anchor of `(seq, hash)`."""
    unsigned = Anchor(seq, hash, legacy_through, signed_at=at, signature="")
    signature = base64.b64encode(key.sign(unsigned.signed_bytes())).decode()
    return dataclasses.replace(unsigned, signature=signature)


def signature_holds(anchor: Anchor, key: Ed25519PublicKey) -> bool:
    """Whether `anchor` was signed by `key` as it reads now."""
    try:
        key.verify(base64.b64decode(anchor.signature, validate=True), anchor.signed_bytes())
    except (InvalidSignature, ValueError):
        return False
    return True


class MirrorConflict(Exception):
    """The mirror already holds a different anchor for the same seq."""


class AnchorMirror:
    """A write-once copy of the anchors in a folder on another mount or host.

    Each anchor is its own file `<seq>.json`, created with O_EXCL and never opened for
    writing again: the writer cannot replace or cut back what it pushed, whatever happens
    to the local file. Point it at a folder on storage the control plane's host cannot
    rewrite (an NFS export with an append-only/immutable policy, a mounted write-once
    bucket, a second server's share) so that rewriting history needs that host too.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_settings(cls, settings: Settings) -> AnchorMirror | None:
        """The configured mirror (NEBULA_AUDIT_ANCHOR_MIRROR), or None."""
        where = settings.audit_anchor_mirror.strip()
        if not where:
            return None
        return cls(Path(where.removeprefix("file://")))

    def _file(self, seq: int) -> Path:
        return self.path / f"{seq:012d}.json"

    def push(self, anchor: Anchor) -> bool:
        """Copy `anchor` once; True if written now, False if the same one was there already.

        MirrorConflict when a different anchor already holds its seq; OSError when the
        mirror cannot be reached.
        """
        line = anchor.to_line()
        try:
            fd = os.open(
                self._file(anchor.seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444
            )
        except FileExistsError:
            if self.get(anchor.seq) != anchor:
                raise MirrorConflict(
                    f"the anchor mirror {self.path} holds another anchor for seq {anchor.seq}"
                ) from None
            return False
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def get(self, seq: int) -> Anchor | None:
        """The mirrored anchor of `seq`, or None (absent, or torn by a crash mid-write)."""
        try:
            return Anchor.from_line(self._file(seq).read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            return None

    def seqs(self) -> list[int]:
        """Every mirrored seq, newest first (OSError when the mirror cannot be read)."""
        found = []
        for name in os.listdir(self.path):
            stem, _, ext = name.partition(".")
            if ext == "json" and stem.isdigit():
                found.append(int(stem))
        return sorted(found, reverse=True)

    def newest(self, valid: Callable[[Anchor], bool]) -> Anchor | None:
        """The newest mirrored anchor that `valid` accepts (its signature holds), or None."""
        for seq in self.seqs():
            anchor = self.get(seq)
            if anchor is not None and valid(anchor):
                return anchor
        return None


class AnchorLog:
    """The append-only anchor file; appends from several processes are serialized by flock."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_settings(cls, settings: Settings) -> AnchorLog:
        """The anchor file of this deployment, under its data directory."""
        return cls(settings.resolved_data_dir / "audit" / "anchors.jsonl")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the file's exclusive lock: read the newest anchor and append without a race."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def append(self, anchor: Anchor) -> None:
        """Write one anchor durably at the end (the caller holds `locked()`)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, anchor.to_line())  # one write of one short line: never interleaved
            os.fsync(fd)
        finally:
            os.close(fd)

    def first(self) -> Anchor | None:
        """The oldest anchor (it fixes where the keyed chain begins), or None."""
        try:
            with self.path.open("rb") as f:
                line = f.readline()
        except FileNotFoundError:
            return None
        return Anchor.from_line(line) if line.endswith(b"\n") else None

    def newest(self) -> Anchor | None:
        """The newest complete anchor line, or None when there is none."""
        try:
            with self.path.open("rb") as f:
                pos = f.seek(0, os.SEEK_END)
                tail = b""
                while pos > 0:
                    step = min(_TAIL_BLOCK, pos)
                    pos -= step
                    f.seek(pos)
                    tail = f.read(step) + tail
                    # the piece after the last newline is a torn line (a crash mid-write), and
                    # the first piece may be cut by the block: only whole lines count
                    whole = tail.split(b"\n")[:-1]
                    if len(whole) >= (1 if pos == 0 else 2):
                        return Anchor.from_line(whole[-1])
                return None
        except FileNotFoundError:
            return None
