"""A stand-in for a hostile remote (a test double: no real registry or index misbehaves on purpose), served on
127.0.0.1 from a thread of the test process. Each mode answers every request the same way:

  500       HTTP 500 with a short body
  garbage   HTTP 200, random bytes, no registry header
  hang      reads the request, never answers
  redirect  HTTP 302 to itself, forever
  401       HTTP 401 with a Basic challenge, whatever credentials come
  huge      HTTP 200 and 2 GB of bytes without a Content-Length (streamed from one 1 MiB buffer, not allocated);
            GET /v2/ answers like a registry, so the cap is met on the manifest or index page that follows
  huge-declared   the same with `Content-Length: 2147483648`
  liar      speaks the registry API's upload protocol (GET /v2/, blob uploads 202/201, manifest PUT 201) and keeps
            nothing: every other GET answers random bytes with HTTP 200
  drip      HTTP 200 and its headers at once, then the body one byte per DRIP_S seconds, forever (every read of the
            socket returns, so no per-read timeout ever fires); GET /v2/ answers like a registry, so the drip is met
            on the manifest, index page or upload that follows
  drip-v2   the same drip on every path, GET /v2/ included
  drip-headers    the status line at once, then the header lines one byte per DRIP_S seconds, forever
  drip-uploads    a registry (GET /v2/) or an index that holds nothing (every other GET and HEAD: 404) and drips
            its answer to every upload (POST, PUT, PATCH: oras' blob uploads, twine's)
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socketserver
import threading
from typing import Iterator

HUGE = 2 << 30
DRIP_S = 1.0
_BLOCK = b"x" * (1 << 20)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    mode = "500"
    stop: threading.Event
    sent: list[int]

    def log_message(self, *args) -> None:  # quiet
        pass

    def _huge(self, declared: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if declared:
            self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        sent = 0
        try:
            while sent < HUGE and not self.stop.is_set():
                self.wfile.write(_BLOCK)
                sent += len(_BLOCK)
        except OSError:  # the client stopped reading: what a cap does
            pass
        self.sent.append(sent)

    def _drip(self, body: bytes) -> None:
        """`body` one byte per DRIP_S seconds, then spaces, until the client goes or the server stops."""
        try:
            i = 0
            while not self.stop.is_set():
                self.wfile.write(body[i:i + 1] if i < len(body) else b" ")
                self.wfile.flush()
                i += 1
                self.stop.wait(DRIP_S)
        except OSError:  # the client hung up: what a deadline does
            pass

    def _dripping(self, mode: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length and self.command in ("PUT", "POST", "PATCH"):
            self.rfile.read(length)
        if mode == "drip-headers":
            self.wfile.write(b"HTTP/1.0 200 OK\r\n")
            self.wfile.flush()
            self._drip(b"Content-Type: application/json\r\nX-Slow: " + b"x" * 10000)
            return
        self.send_response(200)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.flush()
        self._drip(b'{"schemaVersion": 2, "layers": [')

    def _liar(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.command == "HEAD":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.command == "POST":
            self.send_response(202)
            self.send_header("Location", self.path.split("?")[0] + "upload-1")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.command in ("PUT", "PATCH"):
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            body = os.urandom(512)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        mode = self.mode
        if mode == "drip" and self.path.rstrip("/") == "/v2":
            mode = "huge"
        if mode == "drip-uploads" and self.command in ("GET", "HEAD"):
            mode = "huge" if self.path.rstrip("/") == "/v2" else "404"
        elif mode == "drip-uploads":
            mode = "drip-v2"
        if mode.startswith("drip"):
            return self._dripping(mode)
        if mode in ("liar",) and self.path.rstrip("/") == "/v2":
            mode = "huge"
        if mode == "liar":
            self._liar()
        elif mode.startswith("huge") and self.path.rstrip("/") == "/v2":
            self.send_response(200)
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        elif mode.startswith("huge"):
            self._huge(declared=mode == "huge-declared")
        elif mode == "500":
            self.send_response(500)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"oops\n")
        elif mode == "404":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "garbage":
            body = os.urandom(4096)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif mode == "hang":
            self.stop.wait(300)
        elif mode == "redirect":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "401":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="nobody gets in"')
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Length", "0")
            self.end_headers()

    do_HEAD = do_GET
    do_POST = do_GET
    do_PUT = do_GET
    do_PATCH = do_GET


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def _running(handler, before_stop=lambda: None) -> Iterator[str]:
    """host:port of a server of `handler` on 127.0.0.1 for the block's duration (`before_stop` runs first at its end)."""
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        before_stop()
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextlib.contextmanager
def serve(mode: str) -> Iterator[tuple[str, list[int]]]:
    """(host:port, bytes sent per huge answer) of a stand-in answering in `mode`, for the block's duration."""
    stop, sent = threading.Event(), []
    with _running(type("Handler", (_Handler,), {"mode": mode, "stop": stop, "sent": sent}), stop.set) as host:
        yield host, sent


# -- a logging impostor registry: what every request carried -----------------------------------------------
class _Impostor(http.server.BaseHTTPRequestHandler):
    """A registry impostor (a test double): records every request (method, path, Authorization header) and
    answers 401 with `challenge` to everything but a token request (path starting /token), which gets a token."""

    protocol_version = "HTTP/1.0"
    challenge = 'Basic realm="impostor"'
    seen: list[tuple[str, str, str]]

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
        if self.path.startswith("/token"):
            body = b'{"token": "impostor-token"}'
            self.send_response(200)
        else:
            body = b'{"errors": [{"code": "UNAUTHORIZED"}]}'
            self.send_response(401)
            self.send_header("WWW-Authenticate", self.challenge.replace("{self}", self.headers.get("Host", "")))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET
    do_POST = do_GET
    do_PUT = do_GET
    do_PATCH = do_GET


@contextlib.contextmanager
def impostor(challenge: str = 'Basic realm="impostor"') -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """(host:port, the requests it saw: (method, path, Authorization)) of a logging impostor registry on 127.0.0.1.
    `challenge` is its WWW-Authenticate; "{self}" in it becomes the Host the request named."""
    seen: list[tuple[str, str, str]] = []
    with _running(type("Impostor", (_Impostor,), {"challenge": challenge, "seen": seen})) as host:
        yield host, seen


def carried(seen: list[tuple[str, str, str]], password: str) -> list[tuple[str, str]]:
    """The requests of an impostor's log that carried `password` (in a Basic header, decoded, or anywhere else)."""
    import base64
    import binascii

    out = []
    for method, path, auth in seen:
        text = auth + " " + path
        if auth.lower().startswith("basic "):
            try:
                text += " " + base64.b64decode(auth.split(" ", 1)[1]).decode(errors="replace")
            except (binascii.Error, ValueError):
                pass
        if password in text:
            out.append((method, path))
    return out


# -- a registry serving the documents it is given: shapes no real registry would hold -------------------------
class _Shaped(http.server.BaseHTTPRequestHandler):
    """A registry stand-in (a test double: a real registry checks what it is given) serving `documents`: a tag or
    a digest → (body, media type, Docker-Content-Digest or None for the body's own). GET /v2/ answers like a
    registry; a blob is served by its digest; anything else is 404."""

    protocol_version = "HTTP/1.0"
    documents: dict

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        import hashlib

        path = self.path.split("?")[0]
        kind, _, ref = path.rstrip("/").rpartition("/")
        found = self.documents.get(ref) if kind.endswith(("/manifests", "/blobs")) else None
        if path.rstrip("/") == "/v2":
            body, media, said = b"{}", "application/json", None
        elif found is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        else:
            body, media, said = found
        self.send_response(200)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", media)
        self.send_header("Docker-Content-Digest", said or "sha256:" + hashlib.sha256(body).hexdigest())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET


@contextlib.contextmanager
def shaped(documents: dict) -> Iterator[str]:
    """host:port of a registry stand-in serving `documents` (see _Shaped) on 127.0.0.1."""
    with _running(type("Shaped", (_Shaped,), {"documents": documents})) as host:
        yield host
