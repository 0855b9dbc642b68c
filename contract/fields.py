"""The base of every request body both sides validate: strict, no unknown fields, no NUL."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

NO_NUL_PATTERN = r"^[^\x00]*$"


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


def _integral_floats_as_ints(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer, strict validation would refuse it; a float field
    # takes an int as well, so no field loses by this
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    return value


class StrictIn(BaseModel):
    """A request body: unknown fields are refused and nothing is coerced (`false` is no integer,
    `"1"` no number), so the server accepts exactly what the document describes.

    No string may hold a NUL character (PostgreSQL text cannot store one); the document states
    it as a pattern on every request string (app.openapi.document).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _as_json_schema_reads(cls, data: Any) -> Any:
        if _holds_nul(data):
            raise ValueError("text must not contain NUL characters")
        return _integral_floats_as_ints(data)
