"""Which remote wheel stores a run uses.

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

How builder talks to them (timeouts, the network errors, loopback hosts, the credentials) is builder/net.py's.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from .. import redact
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
        raise _fail(where, f"{redact.describe(value)} is not a registry repository like 127.0.0.1:5000/builder/wheels "
                           "(HOST[:PORT]/path, lowercase path)")
    port = _REGISTRY_RE.fullmatch(value).group("port")
    if port and not 0 < int(port) < 65536:
        raise _fail(where, f"{redact.describe(value)}: port {port} is out of range")
    return value


def _http_url(value, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, f"expected a URL string, got {type(value).__name__}")
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise _fail(where, f"{redact.describe(value)} is not an http(s) URL of {what} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or ord(c) < 32 for c in value):
        raise _fail(where, f"{redact.describe(value)} is not an http(s) URL of {what}")
    if parts.port == 0:
        raise _fail(where, f"{redact.describe(value)}: port 0 is out of range (1-65535)")
    if parts.username or parts.password:
        raise _fail(where, f"{what}: put no credentials in the URL (use BUILDER_INDEX_USER / BUILDER_INDEX_PASSWORD)")
    if parts.query or parts.fragment:
        raise _fail(where, f"{redact.describe(value)}: {what} takes no ?query or #fragment")
    return value


def parse_spec(value, where: str, default_registry: str) -> RemoteSpec:
    """One remote, from its string or table form; UserError (exit 2) naming `where` when it is wrong."""
    if isinstance(value, str):
        kind, sep, rest = value.partition(":")
        if kind not in KINDS:
            raise _fail(where, f"{redact.describe(value)}: unknown store kind {redact.describe(kind, 30)}; write registry, "
                               "registry:HOST/REPO or index:URL")
        if kind == "index" and not sep:
            raise _fail(where, "index needs its URL: index:http://127.0.0.1:8080/simple")
        if sep and not rest:
            raise _fail(where, f"{redact.describe(value)}: nothing after the colon; write registry, registry:HOST/REPO or "
                               "index:URL")
        value = {"kind": kind, "url": rest} if sep else {"kind": kind}
    if not isinstance(value, dict):
        raise _fail(where, f"expected a string like \"registry\" or a table, got {type(value).__name__}")
    unknown = sorted(set(value) - _TABLE_KEYS)
    if unknown:
        raise _fail(where, f"unknown key {redact.describe(unknown[0])}; allowed: {', '.join(sorted(_TABLE_KEYS))}")
    kind = value.get("kind")
    if kind not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {redact.describe(kind)}")
    for key in ("push", "insecure"):
        if key in value and not isinstance(value[key], bool):
            raise _fail(f"{where}.{key}", f"expected true or false, got {redact.describe(value[key])}")
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

    dist = parse_dist(table.get("dist"), f"{where}.dist")
    cores = table.get("dist_cores", 0)
    if "dist_cores" in table:  # the build servers' cores together (`sccache --dist-status`): plan's estimates
        if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= 1_000_000:
            raise _fail(f"{where}.dist_cores", f"expected the build servers' cores as a whole number from 1, got {redact.describe(cores)}")
        if dist is None:
            raise _fail(f"{where}.dist_cores", "says the cores of sccache-dist's build servers, but no dist scheduler is set")
    return {"remotes": specs, "compile": parse_compile_cache(table.get("compile"), f"{where}.compile"), "dist": dist,
            "dist_cores": cores}


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


# -- a remote store that does not answer -----------------------------------------------------------
def down(label: str, exc: BaseException, doing: str = "") -> EnvironmentProblem:
    """A remote store that does not answer: exit 3, naming it and the way out."""
    import requests

    text = redact.redact(str(exc))
    if isinstance(exc, requests.TooManyRedirects):
        text = "it redirects in a loop (more than 30 redirects)"
    known = re.search(r"\[Errno -?\d+\] [^'\")]+|Read timed out|timed out|Connection reset by peer|Connection aborted"
                      r"|IncompleteRead\([^)]*\)|Response ended prematurely|RemoteDisconnected\([^)]*\)", text)
    reason = known.group(0) if known else (text.splitlines()[0][:200] if text else type(exc).__name__)
    return EnvironmentProblem(
        f"cache remote {label} does not answer{' ' + doing if doing else ''} ({reason}); "
        "start it or fix [defaults.cache] / --cache-remote, or build with the local wheelhouse only: --no-remote")
