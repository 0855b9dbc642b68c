"""A streaming multipart/form-data reader for dataset uploads.

The file part goes straight into an `IncomingFile` (size, quota, hash, format,
encryption) as its bytes arrive; nothing spools the plaintext to a temporary file or
holds the body in memory. The small text fields are kept, bounded.
"""

from __future__ import annotations

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from app.datasets.service import IncomingFile, parse_kind
from app.errors import Invalid

FIELDS = frozenset({"name", "kind", "discoverable"})
MAX_FIELD_BYTES = 1024


class UploadForm:
    """Feed the request body with `write`; `finish` returns the text fields once the body ended."""

    def __init__(self, content_type: str, incoming: IncomingFile) -> None:
        mime, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        if mime != b"multipart/form-data" or not boundary:
            raise Invalid("expected a multipart/form-data body with a boundary")
        self.incoming = incoming
        self.fields: dict[str, str] = {}
        self._file_seen = False
        self._ended = False
        self._part: str | None = None  # "file", a field name, or None between parts
        self._value = bytearray()
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        try:
            self._parser = MultipartParser(
                boundary,
                callbacks={
                    "on_part_begin": self._on_part_begin,
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_part_end": self._on_part_end,
                    "on_end": self._on_end,
                },
            )
        except ValueError as exc:
            raise Invalid(f"bad multipart boundary: {exc}") from None

    def _on_part_begin(self) -> None:
        self._disposition = b""
        self._header_name.clear()
        self._header_value.clear()

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        kind, params = parse_options_header(self._disposition)
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if kind != b"form-data" or not name:
            raise Invalid("each part needs a form-data Content-Disposition with a name")
        if name == "file":
            if self._file_seen:
                raise Invalid("only one file per upload")
            self._file_seen = True
            if "kind" in self.fields:
                self.incoming.validate_as(parse_kind(self.fields["kind"]))
        elif name in FIELDS:
            if name in self.fields:
                raise Invalid(f"the field {name} was sent twice")
        else:
            raise Invalid("unexpected form field; expected file, name, kind and discoverable")
        self._part = name
        self._value.clear()

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part == "file":
            self.incoming.write(data[start:end])
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            raise Invalid(f"the field {self._part} is too long")

    def _on_part_end(self) -> None:
        if self._part is not None and self._part != "file":
            try:
                self.fields[self._part] = self._value.decode("utf-8")
            except UnicodeDecodeError:
                raise Invalid(f"the field {self._part} is not UTF-8") from None
        self._part = None

    def _on_end(self) -> None:
        self._ended = True

    def write(self, data: bytes) -> None:
        """The next bytes of the body."""
        try:
            self._parser.write(data)
        except MultipartParseError as exc:
            raise Invalid(f"malformed multipart body: {exc}") from None

    def finish(self) -> dict[str, str]:
        """The text fields; 422 if the body was cut short or had no file."""
        if not self._ended:
            raise Invalid("the multipart body ended early")
        if not self._file_seen:
            raise Invalid("the form needs a file field")
        return self.fields
