"""The codec spec grammar: `int8`, `fp16(lowrank(0.6,method=power))`, `ef(int8)`.

    spec  := call
    call  := NAME [ "(" [ arg ("," arg)* ] ")" ]
    arg   := call | NUMBER | NAME "=" (NUMBER | NAME)

Names: none, fp16, bf16, int8 (stochastic=, seed=), each optionally wrapping one
lowrank(r, method=svd|rsvd|power|stream, iters=, oversample=, layout=flat|sample,
fallback=, seed=, refresh=) whose factors it encodes; ef(<spec>) adds error feedback, which
`check_stream_spec` refuses on per-sample streams.

Parsing and validation only: `parse_codec_spec` gives a tree of plain values, from which
the cluster side (workers.compression) builds the codec. The control plane checks a job's
specs with it without loading torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

Method = Literal["svd", "rsvd", "power", "stream"]
Layout = Literal["flat", "sample"]
Cast = Literal["none", "fp16", "bf16"]


class SpecError(ValueError):
    """A codec spec string that does not parse or names impossible parameters."""


@dataclass(frozen=True)
class CastSpec:
    """Send each value cast to `dtype` (`none`: float32 as it is)."""

    dtype: Cast


@dataclass(frozen=True)
class Int8Spec:
    """Per-row INT8 quantization, optionally with stochastic rounding."""

    stochastic: bool = False
    seed: int = 0


DenseSpec = CastSpec | Int8Spec


STREAM_REFRESH = 16
"""`lowrank(r,method=stream)` sends its basis with every this many matrices by default."""


@dataclass(frozen=True)
class LowRankSpec:
    """Rank-k factors keeping `ratio` of the rank, each factor sent with `inner`."""

    ratio: float
    inner: DenseSpec
    method: Method = "svd"
    iters: int = 1
    oversample: int | None = None  # None: the method's default
    layout: Layout = "flat"
    fallback: bool = True
    seed: int = 0
    refresh: int = STREAM_REFRESH  # method=stream: a basis with every this many matrices


@dataclass(frozen=True)
class ErrorFeedbackSpec:
    """Error feedback around one codec: what it lost is added to the next tensor."""

    inner: DenseSpec | LowRankSpec


CodecSpec = DenseSpec | LowRankSpec | ErrorFeedbackSpec

_TOKEN = re.compile(
    r"\s*(?:(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[(),=]))"
)
MAX_SPEC_LENGTH = 512


@dataclass(frozen=True)
class Call:
    """One parsed `name(args)` node."""

    name: str
    position: int
    args: list[Call | float] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None or match.lastgroup is None:
                raise self.error(pos, f"unexpected character {text[pos]!r}")
            start = match.start(match.lastgroup)
            self.tokens.append((match.lastgroup, match.group(match.lastgroup), start))
            pos = match.end()
        self.index = 0

    def error(self, position: int, message: str) -> SpecError:
        return SpecError(f"bad codec spec {self.text!r} at column {position + 1}: {message}")

    def peek(self) -> tuple[str, str, int]:
        if self.index < len(self.tokens):
            return self.tokens[self.index]
        return ("end", "", len(self.text))

    def take(self, kind: str, value: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token[0] != kind or (value is not None and token[1] != value):
            wanted = repr(value) if value is not None else kind
            got = "the end" if token[0] == "end" else repr(token[1])
            raise self.error(token[2], f"expected {wanted}, got {got}")
        self.index += 1
        return token

    def call(self) -> Call:
        _, name, position = self.take("name")
        node = Call(name=name.lower(), position=position)
        if self.peek()[1] != "(":
            return node
        self.take("punct", "(")
        if self.peek()[1] == ")":
            self.take("punct", ")")
            return node
        while True:
            kind, value, pos = self.peek()
            if kind == "number":
                self.index += 1
                node.args.append(float(value))
            elif (
                kind == "name"
                and self.index + 1 < len(self.tokens)
                and (self.tokens[self.index + 1][1] == "=")
            ):
                self.index += 2
                key = value.lower()
                if key in node.options:
                    raise self.error(pos, f"option {key!r} given twice")
                kind2, value2, pos2 = self.peek()
                if kind2 not in ("number", "name"):
                    raise self.error(pos2, f"option {key!r} needs a value")
                self.index += 1
                node.options[key] = value2
            elif kind == "name":
                node.args.append(self.call())
            else:
                got = "the end" if kind == "end" else repr(value)
                raise self.error(pos, f"expected an argument, got {got}")
            _, sep, pos = self.peek()
            if sep == ",":
                self.index += 1
                continue
            self.take("punct", ")")
            return node


def _flag(parser: _Parser, node: Call, key: str, default: bool) -> bool:
    value = node.options.pop(key, None)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise parser.error(node.position, f"{node.name}: {key} must be true or false, got {value!r}")


def _integer(parser: _Parser, node: Call, key: str, default: int, low: int) -> int:
    value = node.options.pop(key, None)
    if value is None:
        return default
    if not re.fullmatch(r"[-+]?\d+", value) or int(value) < low:
        raise parser.error(
            node.position, f"{node.name}: {key} must be an integer >= {low}, got {value!r}"
        )
    return int(value)


def _choice(parser: _Parser, node: Call, key: str, default: str, allowed: tuple[str, ...]) -> str:
    value = node.options.pop(key, default).lower()
    if value not in allowed:
        raise parser.error(
            node.position, f"{node.name}: {key} must be one of {', '.join(allowed)}, got {value!r}"
        )
    return value


def _no_leftovers(parser: _Parser, node: Call) -> None:
    if node.options:
        raise parser.error(
            node.position, f"{node.name}: unknown option(s) {', '.join(sorted(node.options))}"
        )


def _lowrank(parser: _Parser, node: Call, inner: DenseSpec) -> LowRankSpec:
    if len(node.args) != 1 or not isinstance(node.args[0], float):
        raise parser.error(
            node.position, "lowrank takes one keep ratio r in (0, 1], e.g. lowrank(0.2)"
        )
    ratio = node.args[0]
    if not (0.0 < ratio <= 1.0) or not math.isfinite(ratio):
        raise parser.error(node.position, f"lowrank ratio must be in (0, 1], got {ratio:g}")
    method = _choice(parser, node, "method", "svd", ("svd", "rsvd", "power", "stream"))
    if method == "stream":
        return _stream_lowrank(parser, node, ratio, inner)
    layout = _choice(parser, node, "layout", "flat", ("flat", "sample"))
    oversample = None
    if "oversample" in node.options:
        oversample = _integer(parser, node, "oversample", 0, 0)
    spec = LowRankSpec(
        ratio,
        inner=inner,
        method=method,  # type: ignore[arg-type]
        iters=_integer(parser, node, "iters", 1, 1),
        oversample=oversample,
        layout=layout,  # type: ignore[arg-type]
        fallback=_flag(parser, node, "fallback", True),
        seed=_integer(parser, node, "seed", 0, 0),
    )
    _no_leftovers(parser, node)
    return spec


def _stream_lowrank(parser: _Parser, node: Call, ratio: float, inner: DenseSpec) -> LowRankSpec:
    """`method=stream`: one basis shared by the stream's matrices, so neither a sketch
    (iters, oversample, seed) nor per-sample matrices (layout=sample) apply."""
    for key in ("iters", "oversample", "seed"):
        if key in node.options:
            raise parser.error(node.position, f"{node.name}: method=stream takes no {key}")
    if _choice(parser, node, "layout", "flat", ("flat", "sample")) != "flat":
        raise parser.error(node.position, f"{node.name}: method=stream needs layout=flat")
    spec = LowRankSpec(
        ratio,
        inner=inner,
        method="stream",
        fallback=_flag(parser, node, "fallback", True),
        refresh=_integer(parser, node, "refresh", STREAM_REFRESH, 1),
    )
    _no_leftovers(parser, node)
    return spec


_CASTS: dict[str, Cast] = {"none": "none", "fp32": "none", "fp16": "fp16", "bf16": "bf16"}


def _build(parser: _Parser, node: Call, top: bool) -> CodecSpec:
    if node.name == "ef":
        if not top:
            raise parser.error(node.position, "ef must be the outermost codec")
        if len(node.args) != 1 or not isinstance(node.args[0], Call) or node.options:
            raise parser.error(node.position, "ef wraps exactly one codec, e.g. ef(int8)")
        inner = _build(parser, node.args[0], top=False)
        assert not isinstance(inner, ErrorFeedbackSpec)  # refused above: ef is outermost
        return ErrorFeedbackSpec(inner)
    dense: DenseSpec
    if node.name in _CASTS:
        dense = CastSpec(_CASTS[node.name])
    elif node.name == "int8":
        dense = Int8Spec(
            stochastic=_flag(parser, node, "stochastic", False),
            seed=_integer(parser, node, "seed", 0, 0),
        )
    elif node.name == "lowrank":
        return _lowrank(parser, node, CastSpec("none"))
    else:
        raise parser.error(
            node.position,
            f"unknown codec {node.name!r}; known: none, fp16, bf16, int8, lowrank, ef",
        )
    _no_leftovers(parser, node)
    if not node.args:
        return dense
    child = node.args[0]
    if len(node.args) != 1 or not isinstance(child, Call) or child.name != "lowrank":
        raise parser.error(
            node.position,
            f"{node.name} can only wrap one lowrank(...), e.g. {node.name}(lowrank(0.2))",
        )
    return _lowrank(parser, child, dense)


def parse_codec_spec(spec: str) -> CodecSpec:
    """What `spec` describes; SpecError saying where and why when it does not parse."""
    if not isinstance(spec, str):
        raise SpecError(f"a codec spec is a string, got {type(spec).__name__}")
    if len(spec) > MAX_SPEC_LENGTH:
        raise SpecError(f"codec spec longer than {MAX_SPEC_LENGTH} characters")
    parser = _Parser(spec)
    if not parser.tokens:
        raise SpecError("empty codec spec; use 'none' to send float32")
    node = parser.call()
    kind, value, pos = parser.peek()
    if kind != "end":
        raise parser.error(pos, f"unexpected {value!r} after the codec")
    return _build(parser, node, top=True)


StreamKind = Literal["per-sample", "parameter"]
PER_SAMPLE: StreamKind = "per-sample"
PARAMETER: StreamKind = "parameter"


def check_stream_spec(spec: str, stream: str, kind: StreamKind) -> CodecSpec:
    """`parse_codec_spec`, and a SpecError for error feedback on a per-sample stream.

    Error feedback adds the residual of one tensor to the next one of its stream. On a
    parameter-like stream (weight gradients, weight deltas) the next tensor updates the
    same numbers, so the residual is delivered late but delivered. On a per-sample stream
    (activations, activation gradients) the next tensor belongs to other samples: one
    micro-batch's error lands on another's, which is bias, not compensation.
    """
    parsed = parse_codec_spec(spec)
    if kind == PER_SAMPLE and isinstance(parsed, ErrorFeedbackSpec):
        raise SpecError(
            f"{stream}: ef(...) is refused on a per-sample stream (activations, activation "
            "gradients): its residual would land on other samples; use it only on "
            f"parameter-like streams, or drop ef from {spec!r}"
        )
    return parsed
