"""Field types shared by every domain's request schemas, each stating in the OpenAPI
document exactly what its validation accepts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from email_validator import EmailNotValidError, validate_email
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
)

from app.accounts.passwords import MAX_LENGTH as PASSWORD_MAX
from app.accounts.passwords import MIN_LENGTH as PASSWORD_MIN

# the base of request bodies lives in the contract, which the clusters validate with too
from contract.fields import NO_NUL_PATTERN as NO_NUL_PATTERN
from contract.fields import StrictIn as StrictIn

UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
EXAMPLE_ID = "3f2b8c1e-5d4a-4e6b-9a7c-2d1e0f9b8a76"
ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 36,
    "maxLength": 36,
    "pattern": UUID_PATTERN,
    "examples": [EXAMPLE_ID],
}

# Every id the platform hands out is a lower-case UUID (app.db.new_id).
Id = Annotated[str, Field(min_length=36, max_length=36, pattern=UUID_PATTERN)]


def example(**body: Any) -> ConfigDict:
    """The model config of a request body that the OpenAPI document shows with `body`."""
    return ConfigDict(json_schema_extra={"examples": [body]})


# RFC 3339 date-time with an offset: what `format: date-time` means. Pydantic alone would also
# take a bare date, a naive time or a number of seconds (`until=0.5`).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_timestamp(value: object) -> datetime:
    """An aware datetime from an RFC 3339 string (or an aware datetime)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a date-time needs a time zone offset")
        return value
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise ValueError("must be an RFC 3339 date-time, e.g. 2026-05-01T12:00:00Z")
    text = value.upper().replace("Z", "+00:00")
    # fromisoformat takes at most microseconds
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("not a real date-time (month, day or hour out of range)") from None


Timestamp = Annotated[
    datetime,
    PlainValidator(parse_timestamp),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-05-01T12:00:00Z"]}),
]


def _check_email(value: str) -> str:
    # The platform sends no mail: an address is an identity, so reserved names such as
    # example.test are as good as any, while the syntax stays strict.
    try:
        checked = validate_email(
            value, check_deliverability=False, globally_deliverable=False, test_environment=True
        )
        return checked.normalized
    except EmailNotValidError as exc:
        raise ValueError(f"not a valid email address: {exc}") from None


Email = Annotated[
    str,
    Field(min_length=3, max_length=320),
    AfterValidator(_check_email),
    WithJsonSchema(
        {
            "type": "string",
            "format": "email",
            "minLength": 3,
            "maxLength": 320,
            "examples": ["ada@example.org"],
        }
    ),
]

# `format: password` tells clients to mask it; the lengths are the policy's
# (app.accounts.passwords), which further refuses the email and common passwords with 422.
NewPassword = Annotated[
    str,
    Field(
        min_length=PASSWORD_MIN,
        max_length=PASSWORD_MAX,
        json_schema_extra={"format": "password"},
        description=(
            f"{PASSWORD_MIN} to {PASSWORD_MAX} characters, at least 4 distinct; "
            "not the email address, not a common password"
        ),
    ),
]

PEM_MAX = 16_384


def pem(label: str, what: str) -> Any:
    """A PEM-armoured text field carrying `label` (e.g. CERTIFICATE REQUEST)."""
    return Field(
        min_length=1,
        max_length=PEM_MAX,
        pattern=rf"^\s*-----BEGIN {label}-----\r?\n[A-Za-z0-9+/=\r\n]+-----END {label}-----\s*$",
        json_schema_extra={"contentMediaType": "application/x-pem-file"},
        description=f"{what}, PEM-encoded (RFC 7468)",
    )


CsrPem = Annotated[str, pem("CERTIFICATE REQUEST", "A PKCS#10 certificate signing request")]
CertificatePem = Annotated[str, pem("CERTIFICATE", "An X.509 certificate")]
