"""Files a role leaves on its cluster's disk, sealed under the job's checkpoint key.

Checkpoints, the job's tokenizer and the artifact before upload are all derived from
the job's data; on a cluster they are written as `NBS1 | nonce | AES-GCM(key, data)`
with the file's name as associated data (a sealed file cannot be passed off as
another), under a key the control plane hands the role with its claim and stops
handing out once the job has ended. Without a key (local runs, tests) files are plain.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAGIC = b"NBS1"
NONCE_BYTES = 12


class SealError(ValueError):
    """A sealed file is damaged, or belongs to another job or another name."""


def seal(key: bytes, name: str, data: bytes) -> bytes:
    """`data` sealed for the file `name`."""
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, data, name.encode())


def unseal(key: bytes, name: str, blob: bytes) -> bytes:
    """The plaintext of a sealed file `name`; SealError when it is not one of this key's."""
    if not blob.startswith(MAGIC):
        raise SealError(f"{name} is not a sealed file")
    nonce = blob[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES :], name.encode())
    except InvalidTag:
        raise SealError(f"{name} failed its integrity check (another job's key?)") from None


def write(path: Path, data: bytes, key: bytes | None) -> None:
    """Write `data` to `path` atomically, sealed when there is a key."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(seal(key, path.name, data) if key is not None else data)
    os.replace(tmp, path)


def read(path: Path, key: bytes | None) -> bytes:
    """What `write` wrote to `path`."""
    blob = path.read_bytes()
    return unseal(key, path.name, blob) if key is not None else blob
