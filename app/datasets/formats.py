"""Streaming validators of dataset formats: feed bytes as they arrive, then finish.

Each validator holds at most one line (or the safetensors header) in memory and raises
`Invalid` (422) naming the line on the first problem.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any, Protocol

from app.errors import Invalid
from app.workspaces.models import DatasetKind
from contract.model_limits import ModelTooLarge, check_bert_config

MAX_LINE_BYTES = 1024 * 1024
NEBULA_ARCHITECTURES = frozenset({"electra-discriminator", "electra-generator"})
MAX_SAFETENSORS_HEADER = 16 * 1024 * 1024
# C0 controls other than TAB, LF and CR, and DEL: not text
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
_CONTROL = re.compile(b"[" + re.escape(_CONTROL_BYTES) + b"]")
SAFETENSORS_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


class Validator(Protocol):
    """Checks one file's bytes as they stream."""

    def feed(self, data: bytes) -> None:
        """The next bytes of the file."""

    def finish(self) -> None:
        """The file ended; raise if what came is not a whole, valid file."""


class LinesValidator:
    """UTF-8 lines: `text` (any non-blank content) or `parallel` (source<TAB>target)."""

    def __init__(self, kind: DatasetKind) -> None:
        self.kind = kind
        self._pending = b""
        self._lines = 0  # complete lines checked so far
        self._has_content = False

    def _fail(self, line: int, why: str) -> Invalid:
        return Invalid(f"line {line}: {why}")

    def _check_block(self, block: bytes) -> None:
        """`block` is whole lines, each ending with a newline except maybe the last."""
        base = self._lines
        try:
            block.decode("utf-8")
        except UnicodeDecodeError as exc:
            at_line = base + block.count(b"\n", 0, exc.start) + 1
            raise self._fail(at_line, "not valid UTF-8") from None
        # Whole-block operations in C; a Python loop per line, or a regex scan, would cap
        # validation well under 100 MB/s. The slow searches run only to name a bad line.
        if len(block.translate(None, _CONTROL_BYTES)) != len(block):
            bad = _CONTROL.search(block)
            at_line = base + block.count(b"\n", 0, bad.start() if bad else 0) + 1
            raise self._fail(at_line, "contains a control character")
        self._check_line_lengths(block, base)
        count = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        if self.kind == DatasetKind.parallel:
            lines = block.split(b"\n")
            if block.endswith(b"\n"):
                lines.pop()
            for number, line in enumerate(lines, base + 1):
                self._check_pair(number, line)
            self._has_content = True
        elif not self._has_content:
            self._has_content = bool(block.strip())
        self._lines += count

    def _check_line_lengths(self, block: bytes, base: int) -> None:
        # Every window of MAX_LINE_BYTES + 1 bytes must hold a newline; jump from the last
        # newline of one window to the next, so the cost is one pass over the block.
        position, size = 0, len(block)
        while size - position > MAX_LINE_BYTES:
            newline = block.rfind(b"\n", position, position + MAX_LINE_BYTES + 1)
            if newline < 0:
                line = base + block.count(b"\n", 0, position) + 1
                raise self._fail(line, f"longer than {MAX_LINE_BYTES} bytes")
            position = newline + 1

    def _check_pair(self, number: int, line: bytes) -> None:
        fields = line.removesuffix(b"\r").split(b"\t")
        if len(fields) != 2:
            raise self._fail(number, f"expected source<TAB>target, found {len(fields) - 1} tab(s)")
        if not fields[0].strip() or not fields[1].strip():
            raise self._fail(number, "empty source or target")

    def feed(self, data: bytes) -> None:
        """Check every line completed by `data`; keep the unfinished one."""
        data = self._pending + data
        end = data.rfind(b"\n")
        if end < 0:
            self._pending = data
        else:
            self._pending = data[end + 1 :]
            self._check_block(data[: end + 1])
        if len(self._pending) > MAX_LINE_BYTES:
            raise self._fail(self._lines + 1, f"longer than {MAX_LINE_BYTES} bytes")

    def finish(self) -> None:
        """Check the last line (it may lack a newline) and that there was content."""
        if self._pending:
            self._check_block(self._pending)
            self._pending = b""
        if not self._has_content:
            raise Invalid("the file has no lines" if self._lines == 0 else "the file is blank")


class SafetensorsValidator:
    """A safetensors file whose header is sound and whose metadata says Nebula wrote it.

    With `nebula_only=False` (a shard of a Hugging Face folder) any string metadata, or
    none, is accepted. `tensors` holds each tensor's dtype and shape once the header came.
    """

    def __init__(self, *, nebula_only: bool = True) -> None:
        self.nebula_only = nebula_only
        self.tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.metadata: dict[str, str] = {}
        self._head = bytearray()
        self._header_len: int | None = None
        self._data_expected: int | None = None
        self._data_seen = 0

    def feed(self, data: bytes) -> None:
        """Buffer until the header is complete, check it, then only count data bytes."""
        if self._data_expected is not None:
            self._data_seen += len(data)
            return
        self._head += data
        if self._header_len is None and len(self._head) >= 8:
            (self._header_len,) = struct.unpack("<Q", self._head[:8])
            if not 2 <= self._header_len <= MAX_SAFETENSORS_HEADER:
                raise Invalid("not a safetensors file: header size out of range")
        if self._header_len is not None and len(self._head) >= 8 + self._header_len:
            end = 8 + self._header_len
            self._data_expected = self._check_header(bytes(self._head[8:end]))
            self._data_seen = len(self._head) - end
            self._head = bytearray()

    def _check_header(self, raw: bytes) -> int:
        try:
            header: Any = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise Invalid("not a safetensors file: the header is not JSON") from None
        except RecursionError:
            raise Invalid("not a safetensors file: the header is nested too deeply") from None
        if not isinstance(header, dict):
            raise Invalid("not a safetensors file: the header is not a JSON object")
        meta = header.pop("__metadata__", None if self.nebula_only else {})
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise Invalid("not a checkpoint written by Nebula: no string metadata")
        self.metadata = meta
        nebula = any(key == "nebula" or key.startswith("nebula.") for key in meta)
        if self.nebula_only and not nebula:
            raise Invalid("not a checkpoint written by Nebula: no nebula metadata")
        if self.nebula_only and meta.get("nebula.architecture") in NEBULA_ARCHITECTURES:
            _check_model_config(meta.get("config"))
        spans: list[tuple[int, int]] = []
        for name, info in header.items():
            spans.append(self._check_tensor(name, info))
            self.tensors[name] = (info["dtype"], tuple(info["shape"]))
        spans.sort()
        position = 0
        for begin, end in spans:
            if begin != position:
                raise Invalid("not a safetensors file: tensor data overlaps or leaves holes")
            position = end
        return position

    def _check_tensor(self, name: str, info: Any) -> tuple[int, int]:
        if not isinstance(info, dict):
            raise Invalid(f"tensor {name[:80]!r}: not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise Invalid(f"tensor {name[:80]!r}: unknown dtype")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise Invalid(f"tensor {name[:80]!r}: bad shape")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise Invalid(f"tensor {name[:80]!r}: bad data offsets")
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
            raise Invalid(f"tensor {name[:80]!r}: size does not match its shape")
        return offsets[0], offsets[1]

    def finish(self) -> None:
        """The data section must be exactly as long as the header says."""
        if self._data_expected is None:
            raise Invalid("not a safetensors file: truncated header")
        if self._data_seen != self._data_expected:
            raise Invalid(
                f"not a safetensors file: {self._data_seen} data bytes, "
                f"the header describes {self._data_expected}"
            )


def _check_model_config(raw: str | None) -> None:
    """A pre-trained model's config must describe a body a worker may build (see limits)."""
    try:
        check_bert_config(json.loads(raw or "null"))
    except (ValueError, RecursionError) as exc:  # ModelTooLarge is a ValueError too
        detail = str(exc) if isinstance(exc, ModelTooLarge) else "the model config is not JSON"
        raise Invalid(f"model refused: {detail}") from None
