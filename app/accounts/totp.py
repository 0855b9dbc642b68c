"""TOTP (RFC 6238) over HOTP (RFC 4226), recovery codes and otpauth URIs: pure functions."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct
from urllib.parse import quote, urlencode

DIGITS = 6
PERIOD_S = 30
# codes of the step before and after the current one pass too: phone clocks drift, and a
# code typed in the last seconds of its step arrives in the next
WINDOW_STEPS = 1
SECRET_BYTES = 20  # 160 bits, RFC 4226's recommended length for HMAC-SHA1
MIN_SECRET_BYTES = 16  # the shortest secret accepted from a hardware token's seed
RECOVERY_CODES = 10
# ten characters from a 32-letter alphabet without look-alikes: 50 bits each
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"


def new_secret() -> str:
    """A fresh random secret in base32, as authenticator apps take it."""
    return base64.b32encode(secrets.token_bytes(SECRET_BYTES)).decode().rstrip("=")


def decode_secret(secret_b32: str) -> bytes:
    """The key bytes of a base32 secret (any case, spaces and padding optional); ValueError."""
    cleaned = secret_b32.replace(" ", "").upper().rstrip("=")
    try:
        key = base64.b32decode(cleaned + "=" * (-len(cleaned) % 8))
    except (binascii.Error, ValueError):
        raise ValueError("the secret is not base32") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"the secret must have at least {MIN_SECRET_BYTES * 8} bits")
    return key


def hotp(key: bytes, counter: int, digits: int = DIGITS) -> str:
    """RFC 4226: HMAC-SHA1 of the counter, dynamically truncated to `digits` decimals."""
    mac = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    binary = struct.unpack(">I", mac[offset : offset + 4])[0] & 0x7FFFFFFF
    return str(binary % 10**digits).zfill(digits)


def step_at(unix_time: float) -> int:
    """The TOTP time step that `unix_time` falls in (T0 = 0)."""
    return int(unix_time // PERIOD_S)


def totp(key: bytes, unix_time: float) -> str:
    """RFC 6238: the code for the step of `unix_time`."""
    return hotp(key, step_at(unix_time))


def matching_step(key: bytes, code: str, unix_time: float) -> int | None:
    """The step within the window whose code is `code`, or None (compared in constant time)."""
    if len(code) != DIGITS or not (code.isascii() and code.isdigit()):
        return None
    now = step_at(unix_time)
    found = None
    for step in range(now - WINDOW_STEPS, now + WINDOW_STEPS + 1):
        if hmac.compare_digest(hotp(key, step), code):
            found = step
    return found


def otpauth_uri(secret_b32: str, *, account: str, issuer: str) -> str:
    """The key URI authenticator apps read from a QR code."""
    label = quote(f"{issuer}:{account}", safe="@:")
    query = urlencode(
        {
            "secret": secret_b32,
            "issuer": issuer,
            "algorithm": "SHA1",
            "digits": DIGITS,
            "period": PERIOD_S,
        }
    )
    return f"otpauth://totp/{label}?{query}"


def new_recovery_codes() -> list[str]:
    """Ten fresh single-use codes, shown to the user once (`xxxxx-xxxxx`)."""
    codes = []
    for _ in range(RECOVERY_CODES):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(10))
        codes.append(f"{raw[:5]}-{raw[5:]}")
    return codes


def normalize_recovery_code(code: str) -> str:
    """A recovery code as typed (any case, dashes and spaces optional) in its canonical form."""
    return "".join(ch for ch in code.lower() if ch not in " -")


def keyed_digest(key: bytes, value: str) -> str:
    """What the database keeps of a recovery code or secret: an HMAC under a key it lacks."""
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()
