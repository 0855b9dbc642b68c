"""Signed heads of the audit chain, kept outside the database in an append-only file.

Someone with rights over the database can delete the newest events and leave a chain
that still verifies; they cannot reach the data directory nor sign. Each line of
`<data dir>/audit/anchors.jsonl` is one head `(seq, hash)` signed with an Ed25519 key
of its own, kept in a key file (NEBULA_AUDIT_ANCHOR_KEY_FILE; by default var/audit_anchor_key,
made at first start), so the table is checked against the newest line. The key is not
derived from the platform secret: whoever holds that secret alone cannot sign an anchor.
Releases before this one derived it (`derived_anchor_key`); docs/audit.md says how such a
deployment moves to a key file.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import json
import logging
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from app.keyring import Purpose, subkey
from app.settings import Settings
from common.private_files import create_private_file

log = logging.getLogger("nebula.audit")

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


class AnchorKeyError(Exception):
    """The anchor key file is missing (where configured), unreadable or readable by others."""


def derived_anchor_key(settings: Settings) -> Ed25519PrivateKey:
    """The anchor key earlier releases derived from the platform secret (migration only)."""
    return Ed25519PrivateKey.from_private_bytes(subkey(settings, Purpose.audit_anchor))


def anchor_key_path(settings: Settings) -> Path:
    """Where this deployment's anchor key file is (configured, or under var_dir)."""
    return settings.audit_anchor_key_file or settings.var_dir / "audit_anchor_key"


def create_anchor_key(path: Path) -> Ed25519PublicKey:
    """Make a new anchor key at `path`: 0600 from its first byte, never replacing a file.

    FileExistsError when `path` exists (a key is never overwritten: rotate to a new path).
    """
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    # complete before it has its name: two processes starting at once read the same key
    create_private_file(path, pem)
    return key.public_key()


def anchor_signing_key(settings: Settings) -> Ed25519PrivateKey:
    """The control plane's anchor key, read from its key file.

    With no key file configured and none under var_dir yet (a new single-host deployment),
    one is made there, with a warning that it lives on the same host as the log it signs.
    """
    path = anchor_key_path(settings)
    if not path.exists():
        if settings.audit_anchor_key_file is not None:
            raise AnchorKeyError(
                f"the audit anchor key file {path} (NEBULA_AUDIT_ANCHOR_KEY_FILE) does not"
                " exist: make it with `nebula audit anchor-key create --out PATH`"
            )
        try:
            create_anchor_key(path)
            log.warning(
                "made the audit anchor signing key %s on this host: whoever controls this host"
                " can sign anchors; keep anchors mirrored off the host (NEBULA_AUDIT_ANCHOR_MIRROR)"
                " and see docs/audit.md, key ceremony",
                path,
            )
        except FileExistsError:
            pass  # another process made it first: read that one
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_IMODE(mode) & 0o077:
            raise AnchorKeyError(
                f"the audit anchor key file {path} is readable by others"
                f" (mode {stat.S_IMODE(mode):04o}): chmod 600 it"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            pem = f.read()
    finally:
        os.close(fd)
    key = load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise AnchorKeyError(f"the audit anchor key file {path} does not hold an Ed25519 key")
    return key


def trusted_public_keys(settings: Settings) -> list[Ed25519PublicKey]:
    """The current key's public half, then the retired ones (NEBULA_AUDIT_ANCHOR_PUBLIC_KEYS)."""
    keys = [anchor_signing_key(settings).public_key()]
    for text in settings.audit_anchor_public_keys.split(","):
        if text.strip():
            keys.append(Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip())))
    return keys


def signed_by_any(anchor: Anchor, keys: list[Ed25519PublicKey]) -> bool:
    """Whether one of `keys` signed `anchor` as it reads now."""
    return any(signature_holds(anchor, key) for key in keys)


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


class Mirror(ABC):
    """A write-once store of anchors off the control plane's host: a folder, or a server."""

    where: str  # the folder or URL, for messages

    @abstractmethod
    def push(self, anchor: Anchor) -> bool:
        """Copy `anchor` once; True if written now, False if the same one was there already.

        MirrorConflict when a different anchor already holds its seq; OSError when the
        mirror cannot be reached.
        """

    @abstractmethod
    def get(self, seq: int) -> Anchor | None:
        """The mirrored anchor of `seq`, or None (OSError when the mirror cannot be read)."""

    @abstractmethod
    def seqs(self) -> list[int]:
        """Every mirrored seq, newest first (OSError when the mirror cannot be read)."""

    def newest(self, valid: Callable[[Anchor], bool]) -> Anchor | None:
        """The newest mirrored anchor that `valid` accepts (its signature holds), or None."""
        for seq in self.seqs():
            anchor = self.get(seq)
            if anchor is not None and valid(anchor):
                return anchor
        return None


class AnchorMirror(Mirror):
    """A write-once copy of the anchors in a folder on another mount or host.

    Each anchor is its own file `<seq>.json`, created with O_EXCL and never opened for
    writing again: the writer cannot replace or cut back what it pushed, whatever happens
    to the local file. Point it at a folder on storage the control plane's host cannot
    rewrite (an NFS export with an append-only/immutable policy, a mounted write-once
    bucket, a second server's share) so that rewriting history needs that host too.
    `nebula audit mirror-serve` keeps its anchors in such a folder (app/audit/mirrors.py).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def _file(self, seq: int) -> Path:
        return self.path / f"{seq:012d}.json"

    def push(self, anchor: Anchor) -> bool:
        """Copy `anchor` once (an O_EXCL file); see Mirror.push."""
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
