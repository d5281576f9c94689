"""Which remote wheel stores a run uses, and how it logs in to them.

matrix.toml:

    [defaults.cache]
    remotes = [
        "registry",                                    # the images' own registry: {defaults.registry}/wheels
        "index:http://127.0.0.1:8080/simple",          # a PEP 503 index (pypiserver, devpi, Nexus)
        { kind = "registry", url = "ghcr.io/acme/wheels", push = false },   # pull only
        { kind = "index", url = "https://nexus.example.com/repository/wheels/simple",
          upload = "https://nexus.example.com/repository/wheels/" },
    ]

A string is `registry`, `registry:HOST[:PORT]/REPO` or `index:URL`; a table has `kind`, `url` (optional for
a registry) and optionally `push` (default true: builds are written through to it), `upload` (an index's
upload URL; default: the simple URL without its trailing `simple/`) and `insecure` (a registry over plain
HTTP; default: only for 127.0.0.1 / localhost). On the command line `--cache-remote SPEC` (the string form,
repeatable) replaces the matrix's list and `--no-remote` empties it.

Credentials are read, never written: a registry's from BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD, else
from the docker login of its host (DOCKER_CONFIG/config.json or ~/.docker/config.json: `auths`,
`credHelpers`, `credsStore`); an index's from BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD (else ~/.netrc, as
requests reads it).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from .. import net
from ..errors import EnvironmentProblem, UserError

KINDS = ("registry", "index")
_TABLE_KEYS = {"kind", "url", "push", "upload", "insecure"}
# HOST[:PORT]/repo/path, lowercase path components as the distribution spec allows
_REGISTRY_RE = re.compile(
    r"(?P<host>(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:]+\])(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+)", re.ASCII)


@dataclass(frozen=True)
class RemoteSpec:
    kind: str  # "registry" | "index"
    url: str  # registry: HOST[:PORT]/REPO (artifacts at REPO/<package>:<key>); index: its simple URL
    push: bool = True  # write builds through to it
    upload: str | None = None  # index: where twine uploads (None: derived from url)
    insecure: bool | None = None  # registry: plain HTTP (None: only for loopback hosts)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.url}"

    def spelled(self) -> str:
        return f"{self.kind}:{self.url}"


def _fail(where: str, msg: str) -> UserError:
    return UserError(f"{where}: {msg}")


def _registry_url(value: str, where: str) -> str:
    if not isinstance(value, str) or not _REGISTRY_RE.fullmatch(value):
        raise _fail(where, f"{value!r} is not a registry repository like 127.0.0.1:5000/builder/wheels "
                           "(HOST[:PORT]/path, lowercase path)")
    port = _REGISTRY_RE.fullmatch(value).group("port")
    if port and not 0 < int(port) < 65536:
        raise _fail(where, f"{value!r}: port {port} is out of range")
    return value


def _http_url(value, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, f"expected a URL string, got {type(value).__name__}")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise _fail(where, f"{value!r} is not an http(s) URL of {what} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or ord(c) < 32 for c in value):
        raise _fail(where, f"{value!r} is not an http(s) URL of {what}")
    if parts.username or parts.password:
        raise _fail(where, f"{what}: put no credentials in the URL (use BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD)")
    if parts.query or parts.fragment:
        raise _fail(where, f"{value!r}: {what} takes no ?query or #fragment")
    return value


def parse_spec(value, where: str, default_registry: str) -> RemoteSpec:
    """One remote, from its string or table form; UserError (exit 2) naming `where` when it is wrong."""
    if isinstance(value, str):
        kind, sep, rest = value.partition(":")
        if kind not in KINDS:
            raise _fail(where, f"{value!r}: unknown store kind {kind!r}; write registry, registry:HOST/REPO or index:URL")
        if kind == "index" and not sep:
            raise _fail(where, "index needs its URL: index:http://127.0.0.1:8080/simple")
        if sep and not rest:
            raise _fail(where, f"{value!r}: nothing after the colon; write registry, registry:HOST/REPO or index:URL")
        value = {"kind": kind, "url": rest} if sep else {"kind": kind}
    if not isinstance(value, dict):
        raise _fail(where, f"expected a string like \"registry\" or a table, got {type(value).__name__}")
    unknown = sorted(set(value) - _TABLE_KEYS)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_TABLE_KEYS))}")
    kind = value.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    for key in ("push", "insecure"):
        if key in value and not isinstance(value[key], bool):
            raise _fail(f"{where}.{key}", f"expected true or false, got {value[key]!r}")
    if kind == "registry":
        if "upload" in value:
            raise _fail(f"{where}.upload", "only an index has an upload URL")
        url = value.get("url") or f"{default_registry}/wheels"
        return RemoteSpec("registry", _registry_url(url, f"{where}.url" if "url" in value else where),
                          push=value.get("push", True), insecure=value.get("insecure"))
    if "insecure" in value:
        raise _fail(f"{where}.insecure", "an index's scheme is in its URL (http:// or https://)")
    if "url" not in value:
        raise _fail(where, "an index needs its url (the simple URL, e.g. http://127.0.0.1:8080/simple)")
    url = _http_url(value["url"], f"{where}.url", "a PEP 503 index")
    upload = _http_url(value["upload"], f"{where}.upload", "an upload endpoint") if "upload" in value else None
    return RemoteSpec("index", url, push=value.get("push", True), upload=upload)


def parse_cache_table(table, where: str, default_registry: str) -> dict:
    """[defaults.cache] → {"remotes": (RemoteSpec, ...), "compile": CompileCache | None}. Its shape (keys, types)
    is schema.CACHE, checked with the rest of matrix.toml; here: what the values mean."""
    remotes = table.get("remotes", [])
    specs = tuple(parse_spec(r, f"{where}.remotes[{i}]", default_registry) for i, r in enumerate(remotes))
    seen = set()
    for i, s in enumerate(specs):
        if s.spelled() in seen:
            raise _fail(f"{where}.remotes[{i}]", f"{s.spelled()} is listed twice")
        seen.add(s.spelled())
    from ..compile_cache import parse as parse_compile_cache, parse_dist

    return {"remotes": specs, "compile": parse_compile_cache(table.get("compile"), f"{where}.compile"),
            "dist": parse_dist(table.get("dist"), f"{where}.dist")}


def selected_remotes(configured: tuple[RemoteSpec, ...], flags: tuple[str, ...], no_remote: bool,
                     default_registry: str) -> tuple[RemoteSpec, ...]:
    """--no-remote: none; --cache-remote: those (they replace the matrix's); else the matrix's."""
    if no_remote and flags:
        raise UserError("--no-remote and --cache-remote contradict each other: give one")
    if no_remote:
        return ()
    if flags:
        return tuple(parse_spec(f, f"--cache-remote {f}", default_registry) for f in flags)
    return tuple(configured)


# -- HTTP ------------------------------------------------------------------------------------------------
def timeouts() -> tuple[float, float]:
    """(connect, read) seconds for every request to a remote store (builder/net.py: BUILDER_REMOTE_TIMEOUT)."""
    return net.timeouts()


def _timeout_adapter():
    """The HTTPAdapter every session to a remote uses (requests is imported only by verbs that talk to one)."""
    from requests.adapters import HTTPAdapter

    class TimeoutAdapter(HTTPAdapter):
        """Every request gets a timeout: a store that stops answering is an error, never a hang. And every answer
        read whole (not streamed: oras' own requests, token endpoints) is read here under the document cap,
        before requests would buffer it without limit (builder/net.py)."""

        def __init__(self, timeout: tuple[float, float]):
            super().__init__()
            self._timeout = timeout

        def send(self, request, **kwargs):
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = self._timeout
            resp = super().send(request, **kwargs)
            if not kwargs.get("stream"):
                try:
                    resp._content = net.read_document(resp, f"{request.method} {request.url}")
                finally:
                    resp.close()
                resp._content_consumed = True
            return resp

    return TimeoutAdapter


def with_timeouts(session):
    adapter = _timeout_adapter()(timeouts())
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def __getattr__(name: str):
    """NETWORK_ERRORS, made on first use: importing requests costs a third of a second that plan, render and
    every refusal of bad input need not pay."""
    if name == "NETWORK_ERRORS":
        import requests

        value = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
                 requests.exceptions.ContentDecodingError, requests.TooManyRedirects)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def down(label: str, exc: BaseException, doing: str = "") -> EnvironmentProblem:
    """A remote store that does not answer: exit 3, naming it and the way out."""
    import requests

    text = net.redact(str(exc))
    if isinstance(exc, requests.TooManyRedirects):
        text = "it redirects in a loop (more than 30 redirects)"
    known = re.search(r"\[Errno -?\d+\] [^'\")]+|Read timed out|timed out|Connection reset by peer|Connection aborted"
                      r"|IncompleteRead\([^)]*\)|Response ended prematurely|RemoteDisconnected\([^)]*\)", text)
    reason = known.group(0) if known else (text.splitlines()[0][:200] if text else type(exc).__name__)
    return EnvironmentProblem(
        f"cache remote {label} does not answer{' ' + doing if doing else ''} ({reason}); "
        "start it or fix [defaults.cache] / --cache-remote, or build with the local wheelhouse only: --no-remote")


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
