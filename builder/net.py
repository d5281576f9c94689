"""The bounds of every answer builder reads from a remote (a registry, an index, a download), in one place.

- a timeout: BUILDER_REMOTE_TIMEOUT seconds (default 60) per socket read, connect at most 5 s of it, and a
  document (an index page, a manifest, metadata, a registry's /v2/) must arrive whole within that time too;
- a size cap, enforced while the body streams (a Content-Length above it is refused before reading):
  BUILDER_REMOTE_MAX_BYTES (default 64 MiB) for a document, which is held in memory, and for a download
  (streamed to disk) the size the manifest records, else BUILDER_REMOTE_MAX_DOWNLOAD_BYTES (default 16 GiB);
- messages name the remote with any user:password@ in a URL redacted (`redact`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from pathlib import Path
from typing import Iterator

from .errors import EnvironmentProblem, UserError

CHUNK = 1 << 20
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 86400.0
DEFAULT_DOCUMENT_BYTES = 64 << 20
DEFAULT_DOWNLOAD_BYTES = 16 << 30

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]*@")
# a registry reference written with credentials and no scheme: user:password@host/...
_BARE_USERINFO = re.compile(r"(?<![\w/@:.-])[^\s/@'\":]+:[^\s/@'\"]*@(?=[\w\[])(?!sha256:|sha512:)")


def redact(text: str) -> str:
    """`scheme://user:password@host` → `scheme://***@host` (and `user:password@host` → `***@host`), wherever
    it appears in text."""
    return _BARE_USERINFO.sub("***@", _USERINFO.sub(r"\1***@", text))


class RedactingFilter:
    """A logging filter that redacts every record's message (see `redact`)."""

    def filter(self, record) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


def _number(var: str, default: float, low: float, high: float, integer: bool = False) -> float:
    raw = os.environ.get(var)
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise UserError(f"{var}: {raw!r} is not a {'whole number' if integer else 'number'}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise UserError(f"{var}: {raw!r} must be a finite number from {low:g} to {high:g}")
    return value


def timeouts() -> tuple[float, float]:
    """(connect, read) seconds for every request to a remote."""
    read = _number("BUILDER_REMOTE_TIMEOUT", DEFAULT_TIMEOUT, 0.001, MAX_TIMEOUT)
    return (min(5.0, read), read)


def document_limit() -> int:
    return int(_number("BUILDER_REMOTE_MAX_BYTES", DEFAULT_DOCUMENT_BYTES, 1024, 1 << 40, integer=True))


def download_limit() -> int:
    return int(_number("BUILDER_REMOTE_MAX_DOWNLOAD_BYTES", DEFAULT_DOWNLOAD_BYTES, 1024, 1 << 50, integer=True))


def check_environment() -> None:
    """Refuse a bad BUILDER_REMOTE_* value up front (exit 2), before any work."""
    timeouts()
    document_limit()
    download_limit()


class TooLarge(EnvironmentProblem):
    """A remote answered more than its cap."""


class TooSlow(EnvironmentProblem):
    """A remote drips a document slower than the timeout allows."""


def _declared(headers) -> int | None:
    try:
        return int(headers.get("Content-Length", ""))
    except (TypeError, ValueError):
        return None


def chunks(resp, what: str, limit: int, deadline: float | None = None) -> Iterator[bytes]:
    """The body of a streamed `requests` response in chunks, stopped (TooLarge / TooSlow, naming `what`) as
    soon as it passes `limit` bytes or `deadline` (time.monotonic)."""
    declared = _declared(resp.headers)
    if declared is not None and declared > limit:
        raise TooLarge(f"{redact(what)} announces {declared} bytes, more than the {limit}-byte cap "
                       "(BUILDER_REMOTE_MAX_BYTES / BUILDER_REMOTE_MAX_DOWNLOAD_BYTES); not read")
    size = 0
    for chunk in resp.iter_content(chunk_size=CHUNK):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"{redact(what)} sent more than {limit} bytes (the cap: BUILDER_REMOTE_MAX_BYTES / "
                           "BUILDER_REMOTE_MAX_DOWNLOAD_BYTES); stopped reading")
        if deadline is not None and time.monotonic() > deadline:
            raise TooSlow(f"{redact(what)} did not send its answer within {timeouts()[1]:g} s "
                          "(BUILDER_REMOTE_TIMEOUT); stopped reading")
        yield chunk


def read_document(resp, what: str, limit: int | None = None) -> bytes:
    """A whole (small) body of a streamed `requests` response: capped and within the timeout."""
    deadline = time.monotonic() + timeouts()[1]
    return b"".join(chunks(resp, what, document_limit() if limit is None else limit, deadline))


def read_urllib(resp, what: str, limit: int | None = None) -> bytes:
    """The same for a urllib response (the index reader of `builder lock`)."""
    limit = document_limit() if limit is None else limit
    declared = _declared(resp.headers)
    if declared is not None and declared > limit:
        raise TooLarge(f"{redact(what)} announces {declared} bytes, more than the {limit}-byte cap "
                       "(BUILDER_REMOTE_MAX_BYTES); not read")
    deadline = time.monotonic() + timeouts()[1]
    parts, size = [], 0
    while True:
        block = resp.read1(CHUNK) if hasattr(resp, "read1") else resp.read(CHUNK)
        if not block:
            return b"".join(parts)
        size += len(block)
        if size > limit:
            raise TooLarge(f"{redact(what)} sent more than {limit} bytes (the cap: BUILDER_REMOTE_MAX_BYTES); "
                           "stopped reading")
        if time.monotonic() > deadline:
            raise TooSlow(f"{redact(what)} did not send its answer within {timeouts()[1]:g} s "
                          "(BUILDER_REMOTE_TIMEOUT); stopped reading")
        parts.append(block)


def stream_into(resp, part: Path, what: str = "the download", limit: int | None = None) -> tuple[str, int]:
    """Write a streamed response body into `part`: (sha256 hex, bytes); at most `limit` bytes (default: the
    download cap)."""
    h, size = hashlib.sha256(), 0
    with open(part, "wb") as fh:
        for chunk in chunks(resp, what, download_limit() if limit is None else limit):
            h.update(chunk)
            size += len(chunk)
            fh.write(chunk)
    return h.hexdigest(), size


def speaks_registry_api(headers, body: bytes) -> bool:
    """Whether an answer to GET /v2/ comes from an OCI distribution registry: its API version header, or the
    JSON object the spec's endpoint answers with (random bytes with HTTP 200 are not a registry)."""
    if (headers.get("Docker-Distribution-API-Version") or "").lower().startswith("registry/2"):
        return True
    try:
        import json

        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return False
