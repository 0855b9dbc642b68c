"""The streaming format validators, fed in arbitrary pieces."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.datasets.formats import MAX_LINE_BYTES, LinesValidator
from app.datasets.validators import validator_for
from app.errors import Invalid
from app.workspaces.models import DatasetKind


def check(kind: DatasetKind, data: bytes, cuts: list[int]) -> str | None:
    """Feed `data` cut at `cuts`; the error message, or None when valid."""
    validator = validator_for(kind)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for start, end in itertools.pairwise(edges):
            validator.feed(data[start:end])
        validator.finish()
    except Invalid as exc:
        return exc.detail
    return None


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"])), max_size=8),
    bad_at=st.integers(min_value=0, max_value=7),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
)
def test_the_line_number_does_not_depend_on_how_the_bytes_arrive(
    lines: list[str], bad_at: int, cuts: list[int]
) -> None:
    lines = [line or "x" for line in lines]
    good = "".join(line + "\n" for line in lines).encode()
    assert check(DatasetKind.text, good, cuts) in (
        None,
        "the file is blank",
        "the file has no lines",
    )
    if bad_at < len(lines):
        broken = list(lines)
        broken[bad_at] = "bad \x00 byte"
        data = "".join(line + "\n" for line in broken).encode()
        assert (
            check(DatasetKind.text, data, cuts)
            == f"line {bad_at + 1}: contains a control character"
        )


@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_a_line_longer_than_the_limit_is_named(pieces: int) -> None:
    data = b"short\n" + b"x" * (MAX_LINE_BYTES + 1) + b"\nshort again\n"
    step = len(data) // pieces + 1
    validator = LinesValidator(DatasetKind.text)
    with pytest.raises(Invalid, match="line 2: longer than"):
        for start in range(0, len(data), step):
            validator.feed(data[start : start + step])
        validator.finish()


def test_lines_at_the_limit_are_fine() -> None:
    data = (b"y" * MAX_LINE_BYTES + b"\n") * 3
    assert check(DatasetKind.text, data, [5, MAX_LINE_BYTES + 3]) is None


def test_parallel_lines_and_crlf() -> None:
    assert check(DatasetKind.parallel, b"a\tb\r\nc\td\r\n", [3]) is None
    assert check(DatasetKind.parallel, b"a\tb\nc\td", []) is None  # no final newline
    assert check(DatasetKind.parallel, b"a\tb\nc d\n", [1]) == (
        "line 2: expected source<TAB>target, found 0 tab(s)"
    )
    assert check(DatasetKind.parallel, b"", []) == "the file has no lines"
