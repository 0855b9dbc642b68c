"""The encrypted file format and the envelope keys, as pure functions: no database, no server."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.workspaces import storage
from app.workspaces.storage import (
    HEADER,
    TAG_SIZE,
    EncryptedWriter,
    StorageIntegrityError,
    decrypt_chunks,
    encrypted_size,
)

KEY = bytes(range(32))
DATASET = "5f0c3a8e-0000-4000-8000-000000000001"


def encrypt(data: bytes, *, chunk_size: int, key: bytes = KEY, dataset_id: str = DATASET) -> bytes:
    out = io.BytesIO()
    writer = EncryptedWriter(out, data_key=key, dataset_id=dataset_id, chunk_size=chunk_size)
    # uneven writes: chunk boundaries must not depend on how the bytes arrive
    for start in range(0, len(data), 7):
        writer.write(data[start : start + 7])
    writer.close()
    return out.getvalue()


def decrypt(blob: bytes, *, key: bytes = KEY, dataset_id: str = DATASET) -> list[bytes]:
    return list(decrypt_chunks(io.BytesIO(blob), data_key=key, dataset_id=dataset_id))


def decrypt_until_refused(blob: bytes, original: bytes) -> None:
    """Decryption must raise, and every chunk it yielded before must be the original bytes."""
    yielded = b""
    with pytest.raises(StorageIntegrityError):
        for chunk in decrypt_chunks(io.BytesIO(blob), data_key=KEY, dataset_id=DATASET):
            yielded += chunk
    assert original.startswith(yielded)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 48, 100])
def test_round_trip_around_chunk_boundaries(size: int) -> None:
    data = bytes((i * 31) % 256 for i in range(size))
    blob = encrypt(data, chunk_size=16)
    assert len(blob) == encrypted_size(size, 16)
    chunks = decrypt(blob)
    assert b"".join(chunks) == data
    assert all(len(c) == 16 for c in chunks[:-1]) and len(chunks[-1]) < 16


def test_round_trip_with_the_default_chunk_size() -> None:
    data = bytes(range(256)) * (10 * 1024 + 3)  # about 2.5 MiB
    blob = encrypt(data, chunk_size=storage.CHUNK_SIZE)
    assert b"".join(decrypt(blob)) == data
    assert data[:4096] not in blob  # nothing of the plaintext shows


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=400), chunk_size=st.integers(min_value=1, max_value=64))
def test_round_trip_property(data: bytes, chunk_size: int) -> None:
    assert b"".join(decrypt(encrypt(data, chunk_size=chunk_size))) == data


def test_any_flipped_byte_is_detected_and_never_returned() -> None:
    data = b"one sentence per line\n" * 5  # 110 bytes: 7 chunks of 16
    blob = encrypt(data, chunk_size=16)
    for position in range(len(blob)):
        tampered = bytearray(blob)
        tampered[position] ^= 0x01
        decrypt_until_refused(bytes(tampered), data)


def test_truncation_at_any_length_is_detected() -> None:
    data = bytes(100)
    blob = encrypt(data, chunk_size=16)
    for length in range(len(blob)):
        decrypt_until_refused(blob[:length], data)


def test_a_file_ending_exactly_on_a_chunk_boundary_cannot_be_cut_there() -> None:
    data = bytes(64)  # 4 full chunks and an empty last one
    blob = encrypt(data, chunk_size=16)
    without_last = blob[: len(blob) - TAG_SIZE]
    decrypt_until_refused(without_last, data)


def test_extension_is_detected() -> None:
    data = bytes(40)
    blob = encrypt(data, chunk_size=16)
    for extra in (b"\x00", bytes(16), bytes(32)):
        decrypt_until_refused(blob + extra, data)


def test_swapped_or_repeated_chunks_are_detected() -> None:
    data = bytes(range(80))
    blob = encrypt(data, chunk_size=16)
    body = blob[HEADER.size :]
    block = 16 + TAG_SIZE
    chunks = [body[i : i + block] for i in range(0, len(body), block)]
    swapped = [chunks[1], chunks[0], *chunks[2:]]
    repeated = [chunks[0], chunks[0], *chunks[2:]]
    for order in (swapped, repeated):
        decrypt_until_refused(blob[: HEADER.size] + b"".join(order), data)


def test_wrong_key_or_another_datasets_name_is_refused() -> None:
    blob = encrypt(b"secret corpus\n", chunk_size=16)
    with pytest.raises(StorageIntegrityError):
        decrypt(blob, key=bytes(32))
    with pytest.raises(StorageIntegrityError):
        decrypt(blob, dataset_id="5f0c3a8e-0000-4000-8000-000000000002")


def test_two_files_with_the_same_plaintext_differ() -> None:
    assert encrypt(b"same\n", chunk_size=16) != encrypt(b"same\n", chunk_size=16)


def test_data_keys_are_wrapped_and_bound_to_their_workspace() -> None:
    master = storage.master_key(b"platform secret")
    assert master == storage.master_key(b"platform secret")
    data_key = storage.new_data_key()
    wrapped = storage.wrap_data_key(master, data_key, workspace_id="ws-1")
    assert data_key not in wrapped
    assert storage.unwrap_data_key(master, wrapped, workspace_id="ws-1") == data_key
    with pytest.raises(StorageIntegrityError):
        storage.unwrap_data_key(master, wrapped, workspace_id="ws-2")
    with pytest.raises(StorageIntegrityError):
        storage.unwrap_data_key(storage.master_key(b"another secret"), wrapped, workspace_id="ws-1")
    tampered = bytearray(wrapped)
    tampered[-1] ^= 1
    with pytest.raises(StorageIntegrityError):
        storage.unwrap_data_key(master, bytes(tampered), workspace_id="ws-1")
