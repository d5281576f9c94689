"""The bounds of every answer builder reads from a remote (a registry, an index, a download), in one place.

- a timeout: BUILDER_REMOTE_TIMEOUT seconds (default 60) per socket read, connect at most 5 s of it, and a
  document (an index page, a manifest, metadata, a registry's /v2/) must arrive whole within that time too;
- a size cap, enforced while the body streams (a Content-Length above it is refused before reading):
  BUILDER_REMOTE_MAX_BYTES (default 64 MiB) for a document, which is held in memory, and for a download
  (streamed to disk) the size the manifest records, else BUILDER_REMOTE_MAX_DOWNLOAD_BYTES (default 16 GiB);
- messages name the remote with any user:password@ in a URL redacted (`redact`).

And how builder talks to a remote at all: the HTTP sessions (`with_timeouts`: every request bounded as above),
the errors that mean a remote does not answer (`NETWORK_ERRORS`), which hosts are this machine (`is_loopback`:
plain HTTP and no TLS check there), and the credentials, read, never written: a registry's from
BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD, else from the docker login of its host
(DOCKER_CONFIG/config.json or ~/.docker/config.json: `auths`, `credHelpers`, `credsStore`); an index's from
BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD (else ~/.netrc, as requests reads it). Streamed downloads are
`stream_into` (pinned ones: builder/download.py).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import os
import re
import subprocess
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
        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return False


# -- HTTP clients ----------------------------------------------------------------------------------------
def _timeout_adapter():
    """The HTTPAdapter every session to a remote uses (requests is imported only by verbs that talk to one)."""
    from requests.adapters import HTTPAdapter

    class TimeoutAdapter(HTTPAdapter):
        """Every request gets a timeout: a store that stops answering is an error, never a hang. And every answer
        read whole (not streamed: oras' own requests, token endpoints) is read here under the document cap,
        before requests would buffer it without limit (above)."""

        def __init__(self, timeout: tuple[float, float]):
            super().__init__()
            self._timeout = timeout

        def send(self, request, **kwargs):
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = self._timeout
            resp = super().send(request, **kwargs)
            if not kwargs.get("stream"):
                try:
                    resp._content = read_document(resp, f"{request.method} {request.url}")
                finally:
                    resp.close()
                resp._content_consumed = True
            return resp

    return TimeoutAdapter


def with_timeouts(session):
    """`session` (a requests.Session) with every request bounded: timeouts, and a whole answer under the cap."""
    adapter = _timeout_adapter()(timeouts())
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def __getattr__(name: str):
    """NETWORK_ERRORS (what a request raises when the remote does not answer), made on first use: importing
    requests costs a third of a second that plan, render and every refusal of bad input need not pay."""
    if name == "NETWORK_ERRORS":
        import requests

        value = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                 requests.exceptions.ContentDecodingError, requests.TooManyRedirects)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- loopback hosts --------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether a registry host is this machine: `localhost`, `127.0.0.1`, `[::1]`, each with or without :PORT."""
    if host.startswith("["):  # [v6] or [v6]:port
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # name:port or v4:port (a bare v6 address has more colons)
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- credentials -----------------------------------------------------------------------------------------
def _env_pair(user_var: str, password_var: str) -> tuple[str, str] | None:
    user, password = os.environ.get(user_var), os.environ.get(password_var)
    if bool(user) != bool(password):
        missing = password_var if user else user_var
        raise UserError(f"{missing} is not set but {user_var if user else password_var} is: set both or neither")
    return (user, password) if user else None


def docker_config_path() -> Path:
    return Path(os.environ["DOCKER_CONFIG"]) / "config.json" if os.environ.get("DOCKER_CONFIG") \
        else Path.home() / ".docker" / "config.json"


def _credential_helper(helper: str, host: str) -> tuple[str, str] | None:
    try:
        proc = subprocess.run([f"docker-credential-{helper}", "get"], input=host, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
        return (data["Username"], data["Secret"]) if data.get("Secret") else None
    except (ValueError, KeyError, TypeError):
        return None


def registry_credentials(host: str) -> tuple[tuple[str, str] | None, str]:
    """(user, password) for a registry host, or None; and where they came from (for messages, never the secret)."""
    env = _env_pair("BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD")
    if env:
        return env, "BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD"
    path = docker_config_path()
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as exc:
        raise EnvironmentProblem(f"{path}: cannot read the docker credentials ({exc})") from None
    if not isinstance(cfg, dict):
        return None, ""
    names = [host, f"http://{host}", f"https://{host}", f"https://{host}/v1/", f"http://{host}/v2/", f"https://{host}/v2/"]
    auths = cfg.get("auths") if isinstance(cfg.get("auths"), dict) else {}
    for name in names:
        entry = auths.get(name)
        if isinstance(entry, dict):
            if entry.get("auth"):
                try:
                    user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    raise EnvironmentProblem(f"{path}: the auth of {name} is not base64 user:password") from None
                return (user, password), f"docker login ({path})"
            if entry.get("username") and entry.get("password"):
                return (entry["username"], entry["password"]), f"docker login ({path})"
    helpers = cfg.get("credHelpers") if isinstance(cfg.get("credHelpers"), dict) else {}
    helper = helpers.get(host) or cfg.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _credential_helper(helper, host)
        if found:
            return found, f"docker-credential-{helper}"
    return None, ""


def index_credentials() -> tuple[str, str] | None:
    return _env_pair("BUILDER_INDEX_USER", "BUILDER_INDEX_PASSWORD")
