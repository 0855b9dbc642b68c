"""Errors raised by the compression codecs."""

from __future__ import annotations


class CodecError(ValueError):
    """A tensor or a blob that a codec cannot handle."""


class SpecError(CodecError):
    """A codec spec string that does not parse or names impossible parameters."""


class NonFiniteError(CodecError):
    """The input holds NaN or Inf, or a value the wire dtype cannot represent."""


class WireError(CodecError):
    """A blob that is not a well-formed Nebula codec wire form."""
