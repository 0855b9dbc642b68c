"""A `model` upload that is a tar (plain or gzip) of a Hugging Face folder, checked as it streams.

The archive is parsed block by block as the bytes arrive: nothing is extracted, no member
is written anywhere, and only the small members (config, tokenizer) and each
safetensors header are held in memory; tensor data is only counted. Deny by default:
a member is accepted only if it is one of the files of a Hugging Face folder Nebula
reads (or a harmless text beside them), only regular files and folders, no links, no
path that leaves the folder, no pickle (`pytorch_model.bin` and the like: nothing is
ever unpickled, here or on a worker). At the end, config.json must name an importable
architecture within the model limits, and the safetensors headers must hold exactly
the tensors it implies, with its shapes (contract/hf_layout.py).

A file that is neither gzip nor tar is a Nebula checkpoint (one safetensors file).
"""

from __future__ import annotations

import json
import math
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from app.datasets.formats import SafetensorsValidator
from app.errors import Invalid
from contract.hf_layout import (
    MAX_MEMBERS,
    WEIGHTS_INDEX,
    HfConfig,
    LayoutError,
    archive_kind,
    check_tensors,
    file_member,
    is_weights_file,
    parameter_count,
    parse_config,
    refuse_unsafe_file,
    tokenizer_file,
    weights_layout,
)
from contract.hf_layout import member_path as layout_member_path
from contract.model_limits import ModelTooLarge
from contract.model_limits import check_bert_config as check_nebula_config

BLOCK = 512
MAX_PAX_BYTES = 64 * 1024
MAX_UNPACKED_BYTES = 24 << 30  # 2e9 float32 weights (the model limit) and their files
KiB, MiB = 1024, 1024 * 1024
# basename -> the most bytes it may have; their contents are read and checked
_READ = {
    "config.json": MiB,
    "model.safetensors.index.json": 16 * MiB,
    "tokenizer.json": 64 * MiB,
    "tokenizer_config.json": MiB,
    "vocab.txt": 16 * MiB,
    "special_tokens_map.json": MiB,
    "added_tokens.json": MiB,
    "generation_config.json": MiB,
}
# accepted beside them and not read by Nebula (text, or sentencepiece's protobuf)
_IGNORED = {
    "vocab.json": 64 * MiB,
    "merges.txt": 64 * MiB,
    "sentencepiece.bpe.model": 64 * MiB,
    "spiece.model": 64 * MiB,
    "README.md": MiB,
    "LICENSE": MiB,
    ".gitattributes": 64 * KiB,
}
TOKENIZER_MODELS = frozenset({"WordPiece", "BPE", "Unigram", "WordLevel"})


def _refuse(why: str) -> Invalid:
    return Invalid(f"model archive refused: {why}")


@contextmanager
def _layout_refused() -> Iterator[None]:
    """The shared layout checks' LayoutError as this upload's refusal (400)."""
    try:
        yield
    except LayoutError as exc:
        raise _refuse(str(exc)) from None


def member_path(name: str) -> list[str]:
    """The parts of a member's path; Invalid if it is absolute, leaves the folder or is odd."""
    with _layout_refused():
        return layout_member_path(name)


def _json_object(name: str, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _refuse(f"{name} is not readable JSON") from None
    if not isinstance(value, dict):
        raise _refuse(f"{name} is not a JSON object")
    return value


def _tokenizer_json(raw: bytes) -> tuple[str, int]:
    """The kind of a tokenizer.json and its largest token id."""
    tok = _json_object("tokenizer.json (the tokenizer)", raw)
    model = tok.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if not isinstance(model, dict) or kind not in TOKENIZER_MODELS:
        raise _refuse("tokenizer.json is not a readable tokenizer (no WordPiece, BPE or Unigram)")
    vocab = model.get("vocab")
    if isinstance(vocab, dict) and vocab:
        ids = [v for v in vocab.values() if isinstance(v, int) and not isinstance(v, bool)]
        if len(ids) != len(vocab):
            raise _refuse("tokenizer.json is not readable: a token id is not an integer")
        largest = max(ids)
    elif isinstance(vocab, list) and vocab:
        largest = len(vocab) - 1
    else:
        raise _refuse("tokenizer.json is not readable: its vocabulary is empty")
    for added in tok.get("added_tokens") or []:
        token_id = added.get("id") if isinstance(added, dict) else None
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise _refuse("tokenizer.json is not readable: an added token has no id")
        largest = max(largest, token_id)
    return str(kind), largest


def _vocab_txt(raw: bytes) -> int:
    """The largest token id of a WordPiece vocab.txt (one token a line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("vocab.txt (the tokenizer) is not UTF-8") from None
    lines = text.splitlines()
    if not lines or not any(line.strip() for line in lines):
        raise _refuse("vocab.txt (the tokenizer) is empty")
    return len(lines) - 1


class _Member:
    """Where one member's data goes: a bounded buffer, a safetensors header check, or nowhere."""

    def __init__(
        self,
        name: str,
        size: int,
        *,
        keep: int = 0,
        sink: Callable[[bytes], None] | None = None,
        done: Callable[[bytes], None] | None = None,
    ) -> None:
        self.name, self.size, self.remaining = name, size, size
        self.padding = (-size) % BLOCK
        self.keep = keep  # >0: hold the data (at most this many bytes) for `done`
        self.sink, self.done = sink, done
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        if self.keep:
            self.data += data
        if self.sink is not None:
            self.sink(data)

    def end(self) -> None:
        if self.done is not None:
            self.done(bytes(self.data))


class TarReader:
    """A tar stream parsed block by block; each member's header is checked before its data."""

    def __init__(self, on_member: Callable[[tarfile.TarInfo, str], _Member | None]) -> None:
        self._on_member = on_member
        self._buf = bytearray()
        self._member: _Member | None = None  # the member whose data is being read
        self._skip = 0  # padding (or ignored data) still to pass
        self._pax: dict[str, str] = {}
        self._pending: tuple[bytes, int, bytearray] | None = None  # a pax/GNU header's data
        self._long_name: str | None = None
        self.ended = False
        self.members = 0
        self.unpacked = 0

    def feed(self, data: bytes) -> None:
        self.unpacked += len(data)
        if self.unpacked > MAX_UNPACKED_BYTES:
            raise _refuse(f"it unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        view = memoryview(data)
        while view:
            if self.ended:
                if any(view):
                    raise _refuse("data after the end-of-archive marker")
                return
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            if self._member is not None:
                n = min(self._member.remaining, len(view))
                self._member.feed(bytes(view[:n]))
                self._member.remaining -= n
                view = view[n:]
                if self._member.remaining == 0:
                    self._skip = self._member.padding
                    member, self._member = self._member, None
                    member.end()
                continue
            if self._pending is not None:
                kind, size, held = self._pending
                n = min(size - len(held), len(view))
                held += view[:n]
                view = view[n:]
                if len(held) == size:
                    self._pending = None
                    self._skip = (-size) % BLOCK
                    self._extended(kind, bytes(held))
                continue
            n = min(BLOCK - len(self._buf), len(view))
            self._buf += view[:n]
            view = view[n:]
            if len(self._buf) == BLOCK:
                block, self._buf = bytes(self._buf), bytearray()
                self._header(block)

    def _extended(self, kind: bytes, data: bytes) -> None:
        if kind == tarfile.GNUTYPE_LONGNAME:
            self._long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            return
        records = _pax_records(data)
        if kind == tarfile.XHDTYPE:
            self._pax = records
        elif "path" in records or "linkpath" in records or "size" in records:
            raise _refuse("a global pax header may not set paths, links or sizes")

    def _header(self, block: bytes) -> None:
        if not any(block):  # a zero block: the end-of-archive marker
            if self._pax or self._long_name is not None:
                raise _refuse("the archive ends inside a member's header")
            self.ended = True
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise _refuse(f"not a valid tar header ({exc})") from None
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
            if info.size > MAX_PAX_BYTES:
                raise _refuse("an extended header is too large")
            self._pending = (info.type, info.size, bytearray())
            if info.size == 0:
                self._pending = None
            return
        name = self._pax.pop("path", None) or self._long_name or info.name
        size_text = self._pax.pop("size", None)
        link = self._pax.pop("linkpath", None)
        self._pax, self._long_name = {}, None
        if size_text is not None:
            if not size_text.isdigit():
                raise _refuse(f"member {name[:120]!r} has a bad pax size")
            info.size = int(size_text)
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise _refuse(f"more than {MAX_MEMBERS} members")
        if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.GNUTYPE_LONGLINK) or link:
            raise _refuse(f"member {name[:120]!r} is a link; only regular files are accepted")
        if info.type == tarfile.DIRTYPE:
            member_path(name)
            if info.size:
                raise _refuse(f"folder {name[:120]!r} has data")
            return
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            raise _refuse(f"member {name[:120]!r} is not a regular file")
        member = self._on_member(info, name)
        if member is None:
            member = _Member(name, info.size)
        if info.size == 0:
            member.end()
        else:
            self._member = member

    def finish(self) -> None:
        """The stream ended: it must have ended with the end-of-archive marker."""
        if not self.ended:
            raise _refuse("the archive is truncated (no end-of-archive marker)")


def _pax_records(data: bytes) -> dict[str, str]:
    """The `length key=value\\n` records of a pax header."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        match = re.match(rb"(\d+) ", data[position:])
        if not match or int(match.group(1)) < len(match.group(0)) + 2:
            raise _refuse("a pax header is malformed")
        length = int(match.group(1))
        record = data[position + len(match.group(0)) : position + length]
        if len(record) != length - len(match.group(0)) or not record.endswith(b"\n"):
            raise _refuse("a pax header is malformed")
        key, sep, value = record[:-1].partition(b"=")
        if not sep:
            raise _refuse("a pax header is malformed")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


class HfFolderValidator:
    """Checks a tar of a Hugging Face folder as it streams (see the module docstring)."""

    def __init__(self, *, gzip: bool) -> None:
        self._safetensors = SafetensorsValidator
        self._inflate = zlib.decompressobj(wbits=31) if gzip else None
        self._tar = TarReader(self._member)
        self._folder: str | None = None
        self._seen: set[str] = set()
        self._texts: dict[str, bytes] = {}
        self._shards: dict[str, Any] = {}  # basename -> SafetensorsValidator
        self.config: HfConfig | None = None
        self.model_info: dict[str, Any] | None = None

    # -- the stream

    def feed(self, data: bytes) -> None:
        """The next bytes of the upload."""
        if self._inflate is None:
            self._tar.feed(data)
            return
        if self._inflate.eof:
            if data:
                raise _refuse("data after the end of the gzip stream")
            return
        try:
            while data:
                self._tar.feed(self._inflate.decompress(data, 4 * MiB))
                data = self._inflate.unconsumed_tail
                if self._inflate.eof and (data or self._inflate.unused_data):
                    raise _refuse("data after the end of the gzip stream")
        except zlib.error:
            raise _refuse("the gzip stream is corrupt") from None

    def _member(self, info: tarfile.TarInfo, name: str) -> _Member | None:
        with _layout_refused():
            folder, base = file_member(name)
        if self._folder is None:
            self._folder = folder
        elif folder != self._folder:
            raise _refuse("the archive holds more than one folder")
        if base in self._seen:
            raise _refuse(f"member {name[:120]!r} appears twice")
        self._seen.add(base)
        with _layout_refused():
            refuse_unsafe_file(base)
        if is_weights_file(base):
            shard = self._safetensors(nebula_only=False)
            self._shards[base] = shard

            def done(_: bytes) -> None:
                try:
                    shard.finish()
                except Invalid as exc:
                    raise _refuse(f"{base}: {exc.detail}") from None

            def sink(data: bytes) -> None:
                try:
                    shard.feed(data)
                except Invalid as exc:
                    raise _refuse(f"{base}: {exc.detail}") from None

            return _Member(name, info.size, sink=sink, done=done)
        limit = _READ.get(base) or _IGNORED.get(base)
        if limit is None:
            raise _refuse(
                f"unexpected member {base[:120]!r}: a Hugging Face folder of config.json,"
                " safetensors weights and the tokenizer is expected"
            )
        if info.size > limit:
            raise _refuse(f"{base} is larger than {limit} bytes")
        if base in _READ:
            return _Member(name, info.size, keep=limit, done=lambda raw: self._read(base, raw))
        return None

    def _read(self, base: str, raw: bytes) -> None:
        self._texts[base] = raw
        if base == "config.json":
            try:
                self.config = parse_config(_json_object("config.json", raw))
            except ModelTooLarge as exc:
                raise _refuse(str(exc)) from None
        elif base.endswith(".json") and base != "tokenizer.json":
            _json_object(base, raw)

    # -- the end

    def finish(self) -> None:
        """The archive is whole and its folder an importable model; sets `model_info`."""
        if self._inflate is not None and not self._inflate.eof:
            raise _refuse("the archive is truncated (the gzip stream ends early)")
        self._tar.finish()
        if self.config is None:
            raise _refuse("config.json is missing")
        cfg = self.config
        found = self._tensors()
        try:
            check_tensors(cfg, found)
        except ModelTooLarge as exc:
            raise _refuse(str(exc)) from None
        kind, largest = self._tokenizer(cfg)
        if largest >= cfg.vocab_size:
            raise _refuse(
                f"the tokenizer has token id {largest}, outside the model's vocabulary of"
                f" {cfg.vocab_size}"
            )
        self.model_info = {
            "format": "huggingface",
            "architecture": cfg.architecture,
            "parameters": parameter_count(cfg),
            "hidden_size": cfg.hidden_size,
            "layers": cfg.num_hidden_layers,
            "vocab_size": cfg.vocab_size,
            "tokenizer": kind,
        }

    def _tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        index = self._texts.get(WEIGHTS_INDEX)
        with _layout_refused():
            where = weights_layout([*self._shards, *([WEIGHTS_INDEX] if index is not None else [])])
        if where != WEIGHTS_INDEX:
            tensors: dict[str, tuple[str, tuple[int, ...]]] = self._shards[where].tensors
            return tensors
        assert index is not None  # the layout is the index's
        shards = self._shards
        weight_map = _json_object("model.safetensors.index.json", index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise _refuse("model.safetensors.index.json has no weight_map")
        found: dict[str, tuple[str, tuple[int, ...]]] = {}
        for base, shard in shards.items():
            for tensor, spec in shard.tensors.items():
                if weight_map.get(tensor) != base or tensor in found:
                    raise _refuse(f"tensor {tensor[:120]!r} in {base} contradicts the index")
                found[tensor] = spec
        missing = set(weight_map) - set(found)
        if missing:
            raise _refuse(f"the index names {sorted(missing)[0][:120]!r}, in no shard")
        return found

    def _tokenizer(self, cfg: HfConfig) -> tuple[str, int]:
        with _layout_refused():
            source = tokenizer_file(cfg, self._texts)
        if source == "tokenizer.json":
            return _tokenizer_json(self._texts["tokenizer.json"])
        return "WordPiece", _vocab_txt(self._texts["vocab.txt"])


class ModelValidator:
    """A `model` upload: a tar (plain or gzip) of a Hugging Face folder, or a Nebula checkpoint.

    The first bytes decide: gzip's magic, or tar's `ustar` at offset 257.
    """

    def __init__(self) -> None:
        self._head = bytearray()
        self._inner: Any = None
        self.model_info: dict[str, Any] | None = None

    def _choose(self) -> None:
        head = bytes(self._head)
        kind = archive_kind(head)
        if kind is not None:
            self._inner = HfFolderValidator(gzip=kind == "gzip")
        else:
            self._inner = SafetensorsValidator()
        self._head = bytearray()
        self._inner.feed(head)

    def feed(self, data: bytes) -> None:
        """The next bytes of the upload."""
        if self._inner is None:
            self._head += data
            if len(self._head) >= BLOCK:
                self._choose()
            return
        self._inner.feed(data)

    def finish(self) -> None:
        """The whole upload is a valid model; `model_info` describes it."""
        if self._inner is None:
            self._choose()
        self._inner.finish()
        info = getattr(self._inner, "model_info", None)
        self.model_info = info if info is not None else _nebula_info(self._inner)


def _nebula_info(checkpoint: Any) -> dict[str, Any] | None:
    """What a Nebula ELECTRA model file says about itself (None for other files)."""
    meta: dict[str, str] = checkpoint.metadata
    architecture = meta.get("nebula.architecture")
    if architecture not in ("electra-discriminator", "electra-generator"):
        return None
    config = check_nebula_config(json.loads(meta["config"]))
    return {
        "format": "nebula",
        "architecture": architecture,
        "parameters": sum(math.prod(shape) for _, shape in checkpoint.tensors.values()),
        "hidden_size": config["d_model"],
        "layers": config["n_layers"],
        "vocab_size": config["vocab_size"],
        "tokenizer": "WordPiece",
    }
