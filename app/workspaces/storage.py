"""Encryption at rest: envelope keys and a chunked, authenticated file format.

Keys: master key = HKDF-SHA256(platform secret); each workspace has a random data key,
stored only wrapped (AES-GCM) by the master key; each file has its own key,
HKDF(data key, salt from the file header, info bound to the dataset id).

File format (version 1):

    header  = magic "NBDS" | version u8 | chunk size u32 BE | salt 16 bytes
    chunk i = AES-GCM(file key, nonce = 4 zero bytes | i u64 BE,
                      aad = header | dataset id | i u64 BE | last u8)   (ciphertext | tag)

Every chunk but the last holds exactly `chunk size` plaintext bytes; the last holds
fewer (possibly none), so a file whose plaintext is a multiple of the chunk size ends
with an empty last chunk. The counter in the nonce and the AAD detects reordered
chunks, the last-chunk flag detects truncation at a chunk boundary and extension, the
header in the AAD detects a changed header, and the dataset id detects a file moved
under another dataset's name. Any failure raises `StorageIntegrityError`; no byte of a
chunk that fails its check is ever returned.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.errors import DomainError
from contract.text import split_lines

MAGIC = b"NBDS"
VERSION = 1
CHUNK_SIZE = 1024 * 1024
TAG_SIZE = 16
KEY_SIZE = 32
SALT_SIZE = 16
HEADER = struct.Struct(">4sBI16s")
MAX_CHUNK_SIZE = 64 * 1024 * 1024  # a reader refuses headers that ask for more

_MASTER_INFO = b"nebula/master-key/v1"
_WRAP_AAD = b"nebula/workspace-data-key/v1:"
_FILE_INFO = b"nebula/dataset-file-key/v1:"


class StorageIntegrityError(DomainError):
    """Stored bytes or a wrapped key failed authentication: tampered, truncated or wrong key."""

    status = 500

    def __init__(self, detail: str = "stored data failed its integrity check") -> None:
        super().__init__(detail)


def _hkdf(key_material: bytes, *, info: bytes, salt: bytes | None = None) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_SIZE, salt=salt, info=info).derive(
        key_material
    )


def master_key(secret: bytes) -> bytes:
    """The key that wraps every workspace's data key, derived from the platform secret."""
    return _hkdf(secret, info=_MASTER_INFO)


def new_data_key() -> bytes:
    """A fresh random workspace data key."""
    return AESGCM.generate_key(bit_length=KEY_SIZE * 8)


def wrap_data_key(master: bytes, data_key: bytes, *, workspace_id: str) -> bytes:
    """nonce | AES-GCM(master, data key), bound to the workspace id."""
    nonce = os.urandom(12)
    aad = _WRAP_AAD + workspace_id.encode()
    return nonce + AESGCM(master).encrypt(nonce, data_key, aad)


def unwrap_data_key(master: bytes, wrapped: bytes, *, workspace_id: str) -> bytes:
    """The data key inside `wrapped`; StorageIntegrityError for a wrong key or altered bytes."""
    try:
        return AESGCM(master).decrypt(wrapped[:12], wrapped[12:], _WRAP_AAD + workspace_id.encode())
    except InvalidTag:
        raise StorageIntegrityError("a workspace data key failed its integrity check") from None


def _file_key(data_key: bytes, *, dataset_id: str, salt: bytes) -> bytes:
    return _hkdf(data_key, salt=salt, info=_FILE_INFO + dataset_id.encode())


def _nonce(index: int) -> bytes:
    return b"\x00\x00\x00\x00" + index.to_bytes(8, "big")


def _aad(header: bytes, dataset_id: str, index: int, last: bool) -> bytes:
    return header + dataset_id.encode() + struct.pack(">QB", index, 1 if last else 0)


def encrypted_size(plaintext_size: int, chunk_size: int = CHUNK_SIZE) -> int:
    """The size on disk of a file holding `plaintext_size` bytes."""
    chunks = plaintext_size // chunk_size + 1  # the last chunk is always a short one
    return HEADER.size + plaintext_size + chunks * TAG_SIZE


class EncryptedWriter:
    """Encrypts a stream of plaintext into `out`, one authenticated chunk at a time.

    Holds at most one chunk of plaintext in memory. Call `close()` once at the end: it
    writes the last chunk; a file without it fails the reader's truncation check.
    """

    def __init__(
        self, out: BinaryIO, *, data_key: bytes, dataset_id: str, chunk_size: int = CHUNK_SIZE
    ) -> None:
        if not 0 < chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError("chunk size out of range")
        self._out = out
        self._dataset_id = dataset_id
        self._chunk_size = chunk_size
        salt = os.urandom(SALT_SIZE)
        self._header = HEADER.pack(MAGIC, VERSION, chunk_size, salt)
        self._aead = AESGCM(_file_key(data_key, dataset_id=dataset_id, salt=salt))
        self._buffer = bytearray()
        self._index = 0
        self._closed = False
        self.plaintext_bytes = 0
        out.write(self._header)

    def _seal(self, chunk: bytes | bytearray, *, last: bool) -> None:
        aad = _aad(self._header, self._dataset_id, self._index, last)
        self._out.write(self._aead.encrypt(_nonce(self._index), bytes(chunk), aad))
        self._index += 1

    def write(self, data: bytes) -> None:
        """Add plaintext; full chunks are encrypted and written as they fill."""
        if self._closed:
            raise ValueError("write to a closed EncryptedWriter")
        self.plaintext_bytes += len(data)
        self._buffer += data
        size = self._chunk_size
        if len(self._buffer) < size:
            return
        view = memoryview(self._buffer)
        offset = 0
        while len(self._buffer) - offset >= size:
            self._seal(view[offset : offset + size].tobytes(), last=False)
            offset += size
        view.release()
        del self._buffer[:offset]

    def close(self) -> None:
        """Write the last (short, possibly empty) chunk; the output is then complete."""
        if self._closed:
            return
        self._seal(self._buffer, last=True)
        self._buffer = bytearray()
        self._closed = True


def _read_exactly(src: BinaryIO, size: int) -> bytes:
    parts: list[bytes] = []
    missing = size
    while missing:
        part = src.read(missing)
        if not part:
            break
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)


def decrypt_chunks(src: BinaryIO, *, data_key: bytes, dataset_id: str) -> Iterator[bytes]:
    """The plaintext of an encrypted file, chunk by chunk, each authenticated before use."""
    header = _read_exactly(src, HEADER.size)
    if len(header) != HEADER.size:
        raise StorageIntegrityError("stored data is truncated")
    magic, version, chunk_size, salt = HEADER.unpack(header)
    if magic != MAGIC or version != VERSION or not 0 < chunk_size <= MAX_CHUNK_SIZE:
        raise StorageIntegrityError("stored data has an unknown or damaged header")
    aead = AESGCM(_file_key(data_key, dataset_id=dataset_id, salt=salt))
    block_size = chunk_size + TAG_SIZE
    index = 0
    while True:
        block = _read_exactly(src, block_size)
        last = len(block) < block_size
        if len(block) < TAG_SIZE:
            raise StorageIntegrityError("stored data is truncated")
        try:
            plain = aead.decrypt(_nonce(index), block, _aad(header, dataset_id, index, last))
        except InvalidTag:
            raise StorageIntegrityError() from None
        if last:
            if src.read(1):
                raise StorageIntegrityError("stored data has bytes after its last chunk")
            yield plain
            return
        yield plain
        index += 1


@dataclass(frozen=True)
class DatasetReader:
    """Decrypting access to one stored dataset; holds no database session.

    `size_bytes` and `sha256` are what the upload recorded; the reader also checks that
    the decrypted length matches.
    """

    dataset_id: str
    name: str
    kind: str
    size_bytes: int
    sha256: str
    path: Path
    data_key: bytes

    def iter_chunks(self) -> Iterator[bytes]:
        """Plaintext chunks (up to 1 MiB each), authenticated one by one."""
        seen = 0
        with self.path.open("rb") as src:
            for chunk in decrypt_chunks(src, data_key=self.data_key, dataset_id=self.dataset_id):
                seen += len(chunk)
                if seen > self.size_bytes:
                    raise StorageIntegrityError("stored data is longer than recorded")
                if chunk:
                    yield chunk
        if seen != self.size_bytes:
            raise StorageIntegrityError("stored data is shorter than recorded")

    def iter_lines(self) -> Iterator[str]:
        """UTF-8 lines without their line ending, decoded as they stream."""
        return split_lines(self.iter_chunks())

    def read_all(self) -> bytes:
        """The whole plaintext in memory: only for small files such as model checkpoints."""
        return b"".join(self.iter_chunks())
