"""Git mirrors: upstream git URL prefixes rewritten to mirrors, with git's own `url.<mirror>.insteadOf=<upstream>`
semantics (the longest matching upstream prefix wins), for every git command builder runs on the host (`lock`
resolving a tag to a commit and reading a fetch plan at the commit; `build` pinning a source known only by tag).

The upstream URL and the commit stay the identity: the lock records the upstream URL, the rendered Dockerfiles
name it, and no cache key, label or digest reads a mirror. The map reaches git only as configuration in its
environment (GIT_CONFIG_COUNT / GIT_CONFIG_KEY_n / GIT_CONFIG_VALUE_n), never on its command line (so never in a
logged argv) and never in a file. A mirror URL may carry credentials (https://user:token@host/...): git sends them
to that host only, and every message that could show a mirror is redacted (builder/redact.py).

Where the map comes from, the first that is given: --git-mirror UPSTREAM=MIRROR (repeatable), the environment's
BUILDER_GIT_MIRRORS (UPSTREAM=MIRROR pairs separated by spaces), [defaults] git_mirrors of the matrix.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from . import redact
from .errors import UserError

ENV = "BUILDER_GIT_MIRRORS"
# inside a build: the map as a git config file, BuildKit secret SECRET_ID (a tmpfs mount of the RUNs that fetch,
# never a layer, no part of a cache key), read from this environment variable of the buildx process
SECRET_ID = "gitmirrors"
SECRET_ENV = "BUILDER_GIT_MIRRORS_GITCONFIG"
# the schemes a mirror may use; an upstream prefix may also be ssh:// (what a recipe names)
MIRROR_SCHEMES = ("http", "https", "git", "file")
UPSTREAM_SCHEMES = (*MIRROR_SCHEMES, "ssh")
_CONTROL = re.compile(r"[\x00-\x20\x7f\"\\\\]")

_active: tuple[tuple[str, str], ...] = ()


def check_url(value, what: str, *, mirror: bool) -> str:
    """`value` as an upstream prefix (mirror=False) or a mirror (mirror=True), or UserError naming `what` in one
    line that never shows a credential."""
    if not isinstance(value, str):
        raise UserError(f"{what}: {redact.describe(value)} is not a URL (a string like https://github.com/)")
    if "\n" in value or "\r" in value:
        raise UserError(f"{what}: {redact.describe(value)} holds a newline: one URL on one line")
    if _CONTROL.search(value):
        raise UserError(f"{what}: {redact.describe(value)} holds a space, a quote, a backslash or a control character")
    schemes = MIRROR_SCHEMES if mirror else UPSTREAM_SCHEMES
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise UserError(f"{what}: {redact.describe(value)} is not a URL ({exc})") from None
    if parts.scheme not in schemes or not value.startswith(parts.scheme + "://"):
        raise UserError(f"{what}: {redact.describe(value)} is not a URL of {', '.join(s + '://' for s in schemes)} "
                        f"(a relative path or a bare host is not a mirror)")
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise UserError(f"{what}: {redact.describe(value)}: a file:// URL names an absolute path (file:///srv/git/)")
    elif not parts.hostname:
        raise UserError(f"{what}: {redact.describe(value)} names no host")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise UserError(f"{what}: {redact.describe(value)}: a git URL prefix takes no ?query or #fragment")
    if not mirror and (parts.username is not None or parts.password is not None):
        raise UserError(f"{what}: {redact.describe(value)}: an upstream prefix carries no credentials (the mirror may)")
    return value


def parse_pair(text, what: str) -> tuple[str, str]:
    """UPSTREAM=MIRROR, each checked."""
    if not isinstance(text, str) or "=" not in text:
        raise UserError(f"{what}: {redact.describe(text)} is not UPSTREAM=MIRROR "
                        f"(like https://github.com/=http://127.0.0.1:9418/github/)")
    upstream, mirror = text.split("=", 1)
    return check_url(upstream, what, mirror=False), check_url(mirror, what, mirror=True)


def from_table(table, what: str = "[defaults] git_mirrors") -> tuple[tuple[str, str], ...]:
    """The matrix's { UPSTREAM = MIRROR } table, checked."""
    if not isinstance(table, dict):
        raise UserError(f"{what}: {redact.describe(table)} is not a table of UPSTREAM = MIRROR")
    return _unique([(check_url(k, what, mirror=False), check_url(v, f"{what}.{redact.describe(k)}", mirror=True))
                    for k, v in table.items()], what)


def from_env(value: str, what: str = ENV) -> tuple[tuple[str, str], ...]:
    if "\n" in value or "\r" in value:
        raise UserError(f"{what}: {redact.describe(value)} holds a newline: UPSTREAM=MIRROR pairs separated by spaces")
    return _unique([parse_pair(word, what) for word in value.split()], what)


def _unique(pairs, what: str) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for upstream, mirror in pairs:
        if upstream in seen and seen[upstream] != mirror:
            raise UserError(f"{what}: {redact.describe(upstream)} is given two mirrors")
        seen[upstream] = mirror
    return tuple(seen.items())


def choose(flags=(), env: str | None = None, table=None) -> tuple[tuple[str, str], ...]:
    """The map in force: --git-mirror (all of them), else BUILDER_GIT_MIRRORS, else [defaults] git_mirrors."""
    if flags:
        return _unique([parse_pair(f, "--git-mirror") for f in flags], "--git-mirror")
    env = os.environ.get(ENV) if env is None else env
    if env and env.strip():
        return from_env(env)
    if table:
        return from_table(table)
    return ()


def rewrite(url: str, mirrors=None) -> str:
    """`url` as git reads it under the map: the longest matching upstream prefix replaced by its mirror."""
    mirrors = _active if mirrors is None else mirrors
    best = max((u for u, _ in mirrors if url.startswith(u)), key=len, default=None)
    return url if best is None else dict(mirrors)[best] + url[len(best):]


def git_env(mirrors=None) -> dict[str, str]:
    """The map as git configuration in the environment: url.<mirror>.insteadOf=<upstream> for each pair (git picks
    the longest match itself)."""
    mirrors = _active if mirrors is None else mirrors
    env = {"GIT_CONFIG_COUNT": str(len(mirrors))} if mirrors else {}
    for n, (upstream, mirror) in enumerate(mirrors):
        env[f"GIT_CONFIG_KEY_{n}"] = f"url.{mirror}.insteadOf"
        env[f"GIT_CONFIG_VALUE_{n}"] = upstream
    return env


def gitconfig(mirrors=None) -> str:
    """The map as a git config file (what the build's fetches read through GIT_CONFIG_GLOBAL)."""
    mirrors = _active if mirrors is None else mirrors
    return "".join(f'[url "{mirror}"]\n\tinsteadOf = {upstream}\n' for upstream, mirror in mirrors)


def activate(mirrors) -> None:
    """Set the map every later host git command of this process uses; a mirror's password is remembered as a
    secret, so no message shows it."""
    global _active
    _active = tuple(mirrors)
    if _active:
        os.environ[SECRET_ENV] = gitconfig(_active)
    else:
        os.environ.pop(SECRET_ENV, None)
    for _, mirror in _active:
        parts = urlsplit(mirror)
        for secret in (parts.password, parts.username if parts.password is None else None):
            if secret:
                redact.remember(secret)


def active() -> tuple[tuple[str, str], ...]:
    return _active


LOOPBACK = re.compile(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|::1")


def on_loopback(mirrors=None) -> bool:
    """Whether some mirror is served on this host's loopback interface (only the host's network reaches it)."""
    mirrors = _active if mirrors is None else mirrors
    return any(LOOPBACK.fullmatch(urlsplit(m).hostname or "") for _, m in mirrors)
