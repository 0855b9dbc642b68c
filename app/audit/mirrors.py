"""The anchor mirror over HTTP(S): the control plane's client, and the second host's server.

`NEBULA_AUDIT_ANCHOR_MIRROR` names a folder (app/audit/anchor.py `AnchorMirror`) or the URL
of a server that `nebula audit mirror-serve` runs on another host. The protocol is small:

- `PUT /anchors/<seq>` with one anchor line and `Authorization: Bearer <token>`: 201 when
  stored, 200 when the same anchor was there already, 409 when another anchor holds that
  seq (nothing is ever replaced), 401 without the writer's token, 422 for a body that is
  not an anchor of that seq (or, with `--public-key`, not signed by a listed key);
- `GET /anchors/<seq>`: the anchor line, or 404; `GET /anchors`: `{"seqs": [...]}`, newest
  first. Reads need no token: an anchor is a signed hash, public by design, and an auditor
  may read the mirror without any credential of the platform.

The server keeps each anchor as an O_EXCL file in its folder, as the folder mirror does, so
that the control plane's host, whatever it does, can add anchors and never change one.
Plain http is refused off loopback: the writer's token would cross in clear.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import ssl
import urllib.error
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.audit.anchor import Anchor, AnchorMirror, Mirror, MirrorConflict, signed_by_any
from app.settings import Settings
from common.urls import http_url

log = logging.getLogger("nebula.audit")

TIMEOUT_S = 10.0
MAX_ANCHOR_BYTES = 4096  # a line is ~250 bytes


class MirrorSettingError(ValueError):
    """The mirror's URL, token or CA cannot be used as configured."""


class HttpAnchorMirror(Mirror):
    """The client of a `nebula audit mirror-serve` server."""

    def __init__(self, url: str, *, token: str, ca_file: Path | None = None) -> None:
        try:
            parts = http_url(url, why_https="the anchor mirror's writer token would cross in clear")
        except ValueError as exc:
            raise MirrorSettingError(f"the anchor mirror {url}: {exc}") from None
        self.where = url.rstrip("/")
        self._token = token
        self._context = (
            ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if parts.scheme == "https"
            else None
        )

    def _call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.where}{path}", data=body, method=method)
        if body is not None:
            request.add_header("Authorization", f"Bearer {self._token}")
            request.add_header("Content-Type", "application/x-ndjson")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self._context) as r:
                return r.status, r.read(MAX_ANCHOR_BYTES * 1024)
        except urllib.error.HTTPError as answer:
            return answer.code, answer.read(MAX_ANCHOR_BYTES)

    def push(self, anchor: Anchor) -> bool:
        """PUT the anchor; see Mirror.push (a refusal other than 409 is an OSError)."""
        status, body = self._call("PUT", f"/anchors/{anchor.seq}", anchor.to_line())
        if status == HTTPStatus.CREATED:
            return True
        if status == HTTPStatus.OK:
            return False
        if status == HTTPStatus.CONFLICT:
            raise MirrorConflict(
                f"the anchor mirror {self.where} holds another anchor for seq {anchor.seq}"
            )
        raise OSError(f"the anchor mirror {self.where} answered {status}: {body[:200]!r}")

    def get(self, seq: int) -> Anchor | None:
        """GET one anchor; None when the mirror has none for `seq`."""
        status, body = self._call("GET", f"/anchors/{seq}")
        if status == HTTPStatus.NOT_FOUND:
            return None
        if status != HTTPStatus.OK:
            raise OSError(f"the anchor mirror {self.where} answered {status}")
        try:
            return Anchor.from_line(body)
        except ValueError:
            return None

    def seqs(self) -> list[int]:
        """Every seq the server holds, newest first."""
        status, body = self._call("GET", "/anchors")
        if status != HTTPStatus.OK:
            raise OSError(f"the anchor mirror {self.where} answered {status}")
        try:
            return sorted((int(s) for s in json.loads(body)["seqs"]), reverse=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise OSError(f"the anchor mirror {self.where} sent no list of seqs") from exc


def mirror_for(settings: Settings) -> Mirror | None:
    """The configured mirror (NEBULA_AUDIT_ANCHOR_MIRROR): a folder, a server, or None."""
    where = settings.audit_anchor_mirror.strip()
    if not where:
        return None
    if not where.startswith(("http://", "https://")):
        return AnchorMirror(Path(where.removeprefix("file://")))
    token_file = settings.audit_anchor_mirror_token_file
    if token_file is None:
        raise MirrorSettingError(
            "NEBULA_AUDIT_ANCHOR_MIRROR is a URL: set NEBULA_AUDIT_ANCHOR_MIRROR_TOKEN_FILE"
            " to the file holding the mirror's writer token"
        )
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise MirrorSettingError(f"the anchor mirror's token file cannot be read: {exc}") from exc
    return HttpAnchorMirror(where, token=token, ca_file=settings.audit_anchor_mirror_ca)


class MirrorServer(ThreadingHTTPServer):
    """`nebula audit mirror-serve`: a write-once store of anchors for one control plane."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        *,
        folder: Path,
        token: str,
        public_keys: list[Ed25519PublicKey] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, _MirrorHandler)
        self.store = AnchorMirror(folder)
        self.token_digest = hashlib.sha256(token.encode()).digest()
        self.public_keys = public_keys or []
        if tls is not None:
            # the handshake runs on each request's thread (_MirrorHandler.setup), never in
            # the accepting one, where a client that stalls in it would block every other
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def writer_allowed(self, authorization: str) -> bool:
        """Whether the request carries the writer's token (compared in constant time)."""
        if not authorization.lower().startswith("bearer "):
            return False
        offered = hashlib.sha256(authorization[7:].strip().encode()).digest()
        return hmac.compare_digest(offered, self.token_digest)


class _MirrorHandler(BaseHTTPRequestHandler):
    server: MirrorServer
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT_S  # a client that stalls mid-request is dropped

    def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def setup(self) -> None:
        """The TLS handshake here, on the request's thread, under its timeout."""
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def _error(self, status: int, detail: str) -> None:
        self.close_connection = True  # an unread body must not be taken for a request
        self._answer(status, json.dumps({"detail": detail}).encode())

    def _seq(self) -> int | None:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "anchors" and parts[1].isdigit():
            return int(parts[1])
        return None

    def do_GET(self) -> None:
        """An anchor, or the list of seqs."""
        if self.path.split("?", 1)[0].rstrip("/") == "/anchors":
            body = json.dumps({"seqs": self.server.store.seqs()}).encode()
            self._answer(HTTPStatus.OK, body)
            return
        seq = self._seq()
        anchor = self.server.store.get(seq) if seq is not None else None
        if anchor is None:
            self._error(HTTPStatus.NOT_FOUND, "no such anchor")
            return
        self._answer(HTTPStatus.OK, anchor.to_line(), "application/x-ndjson")

    def do_PUT(self) -> None:
        """Store one anchor, once."""
        seq = self._seq()
        if seq is None:
            self._error(HTTPStatus.NOT_FOUND, "PUT /anchors/<seq>")
            return
        if not self.server.writer_allowed(self.headers.get("Authorization", "")):
            self._error(HTTPStatus.UNAUTHORIZED, "the writer's token is required")
            log.warning("anchor %d refused from %s: no writer token", seq, self.client_address[0])
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
            return
        if not 0 < length <= MAX_ANCHOR_BYTES:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "one anchor line, at most 4 KiB")
            return
        try:
            anchor = Anchor.from_line(self.rfile.read(length))
        except ValueError:
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, "the body is not an anchor line")
            return
        if anchor.seq != seq:
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, f"the anchor's seq is not {seq}")
            return
        if self.server.public_keys and not signed_by_any(anchor, self.server.public_keys):
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, "not signed by a listed anchor key")
            return
        try:
            created = self.server.store.push(anchor)
        except MirrorConflict:
            log.error(
                "anchor %d refused from %s: another anchor holds that seq (an attempt to"
                " rewrite history?)",
                seq,
                self.client_address[0],
            )
            self._error(HTTPStatus.CONFLICT, f"another anchor holds seq {seq}; never replaced")
            return
        if created:
            log.info("anchor %d stored from %s", seq, self.client_address[0])
        self._answer(HTTPStatus.CREATED if created else HTTPStatus.OK, b"{}")

    def log_message(self, format: str, *args: object) -> None:
        """Requests are logged by the handlers above, not line by line to stderr."""
