"""RFC 4226 and RFC 6238 test vectors, the window, recovery codes and otpauth URIs."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import pytest

from app.accounts import totp

RFC_KEY = b"12345678901234567890"


def test_hotp_matches_rfc_4226_appendix_d() -> None:
    expected = ["755224", "287082", "359152", "969429", "338314", "254676", "287922"]
    assert [totp.hotp(RFC_KEY, counter) for counter in range(7)] == expected


@pytest.mark.parametrize(
    ("unix_time", "code"),
    [
        (59, "94287082"),
        (1111111109, "07081804"),
        (1111111111, "14050471"),
        (1234567890, "89005924"),
        (2000000000, "69279037"),
        (20000000000, "65353130"),
    ],
)
def test_totp_matches_rfc_6238_appendix_b_sha1(unix_time: int, code: str) -> None:
    assert totp.hotp(RFC_KEY, totp.step_at(unix_time), digits=8) == code
    assert totp.totp(RFC_KEY, unix_time) == code[-6:]


def test_codes_pass_within_one_step_only() -> None:
    now = 1_700_000_000.0
    step = totp.step_at(now)
    for offset in (-1, 0, 1):
        assert totp.matching_step(RFC_KEY, totp.hotp(RFC_KEY, step + offset), now) == step + offset
    for offset in (-3, -2, 2, 3):
        assert totp.matching_step(RFC_KEY, totp.hotp(RFC_KEY, step + offset), now) is None


@pytest.mark.parametrize("code", ["", "12345", "1234567", "12345a", " 123456", "\uff11" * 6])
def test_malformed_codes_match_nothing(code: str) -> None:
    assert totp.matching_step(RFC_KEY, code, 1_700_000_000.0) is None


def test_secrets_are_160_bit_base32_and_short_ones_are_refused() -> None:
    secret = totp.new_secret()
    assert len(totp.decode_secret(secret)) == 20
    assert totp.decode_secret(secret.lower()) == totp.decode_secret(secret)
    with pytest.raises(ValueError, match="base32"):
        totp.decode_secret("not base32 at all!")
    with pytest.raises(ValueError, match="128 bits"):
        totp.decode_secret(base64.b32encode(b"short").decode())


def test_otpauth_uri_names_issuer_account_and_secret() -> None:
    uri = totp.otpauth_uri("JBSWY3DPEHPK3PXP", account="ada@example.org", issuer="Nebula")
    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc, parts.path) == (
        "otpauth",
        "totp",
        "/Nebula:ada@example.org",
    )
    query = parse_qs(parts.query)
    assert query["secret"] == ["JBSWY3DPEHPK3PXP"] and query["issuer"] == ["Nebula"]
    assert query["digits"] == ["6"] and query["period"] == ["30"]


def test_recovery_codes_are_ten_distinct_and_typed_loosely() -> None:
    codes = totp.new_recovery_codes()
    assert len(set(codes)) == 10
    assert all(len(totp.normalize_recovery_code(c)) == 10 for c in codes)
    assert totp.normalize_recovery_code(codes[0].upper().replace("-", " ")) == (
        totp.normalize_recovery_code(codes[0])
    )
