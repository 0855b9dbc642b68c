"""Text as it streams: lines from byte chunks cut anywhere (no storage, no database)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """UTF-8 lines without their line ending, from chunks cut anywhere."""
    pending = b""
    for chunk in chunks:
        data = pending + chunk
        lines = data.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8")
    if pending:
        yield pending.removesuffix(b"\r").decode("utf-8")
