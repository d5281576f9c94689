"""Phase 4: the fetch script — a plan → the POSIX sh the deps stage runs (each source at its commit, checked),
the CMake file of cache entries for a setup.py that ignores CMAKE_ARGS, and the variables that point the compile
at the fetched checkouts."""

from __future__ import annotations

import re
import shlex
from typing import Mapping, Sequence

from ..errors import UserError
from .model import HEX_COMMIT, NAME_OK, ExternalSource, PlanUnusable

_HASH_TOOLS = {"SHA256": "sha256sum", "SHA512": "sha512sum", "SHA1": "sha1sum", "MD5": "md5sum",
               "SHA224": "sha224sum", "SHA384": "sha384sum"}


def _check_dest(dest: str) -> str:
    if not dest.startswith("/") or re.search(r"\s", dest):
        raise UserError(f"fetch destination must be an absolute path without spaces: {dest!r}")
    return dest.rstrip("/") or "/"


def cmake_overrides_file(plan: Sequence[ExternalSource], dest: str) -> str:
    """CMake code that sets every CMake-only override as a cache entry.

    For engines whose setup.py ignores CMAKE_ARGS: point the environment variable
    CMAKE_TOOLCHAIN_FILE (read by CMake >= 3.21 on a first configure) at a file with this content;
    CMake loads it during project(), before any FetchContent call.
    """
    dest = _check_dest(dest)
    lines = ["# Written by builder: local checkouts for the FetchContent downloads"]
    for s in plan:
        if s.override_var and s.override_kind == "cmake":
            path = _override_path(s, dest)
            lines.append(f'set({s.override_var} "{path}" CACHE PATH "" FORCE)')
    return "\n".join(lines) + "\n"


def _checkout_dir(s: ExternalSource, dest: str) -> str:
    return f"{dest}/{s.inside}" if s.inside else f"{dest}/{s.name}"


def _override_path(s: ExternalSource, dest: str) -> str:
    path = _checkout_dir(s, dest)
    if s.override_subpath:
        path += "/" + s.override_subpath.strip("/")
    return path


def render_fetch_script(plan: Sequence[ExternalSource], dest: str, *,
                        pins: Mapping[str, str] | None = None,
                        cmake_overrides: str | None = None) -> str:
    """A POSIX sh snippet (for a Dockerfile RUN) that fetches every source into dest/<name>.

    Git sources: `git init` + `git fetch --depth 1 origin <commit>` + `git checkout FETCH_HEAD`,
    then the commit is verified and submodules are fetched the way FetchContent would (all,
    recursively, unless GIT_SUBMODULES names some). A tag or branch (not reproducible) is
    fetched by name unless `pins` maps the source name to a commit; the resolved commit is
    printed. URL sources are downloaded, checked against URL_HASH and unpacked. With
    `cmake_overrides` (a path), the script also writes cmake_overrides_file() there.

    Every line is one complete command or a comment, so the snippet works as a heredoc RUN or a
    script file (the deps stage writes it to fetch.sh).
    """
    dest = _check_dest(dest)
    pins = dict(pins or {})
    q = shlex.quote
    lines = ["set -eu", f"mkdir -p {q(dest)}"]
    for s in plan:
        if not NAME_OK.fullmatch(s.name):
            raise UserError(f"unusable source name {s.name!r}")
        d = _checkout_dir(s, dest)
        lines.append(f"# {s.name}: {s.repository} @ {s.commit or s.url_hash}"
                     + ("" if s.reproducible or s.name in pins else "  (NOT a commit)"))
        lines.append(f"rm -rf {q(d)} && mkdir -p {q(d)}")
        if s.kind == "url":
            algo, _, digest = (s.url_hash or "").partition("=")
            tool = _HASH_TOOLS.get(algo.upper())
            if not tool or not re.fullmatch(r"[0-9a-fA-F]+", digest):
                raise PlanUnusable(f"{s.name}: URL download without a usable URL_HASH "
                                f"({s.url_hash!r}): not reproducible")
            archive = f"{dest}/.{s.name}.archive"
            # The git mirrors (secret "gitmirrors", GIT_CONFIG_GLOBAL under with-ca) map an archive URL too:
            # `git ls-remote --get-url` applies insteadOf without any network, so an https mirror that serves
            # GitHub's archive route (scripts/git-host, an Artifactory remote) takes the download; the URL_HASH
            # below keeps the identity. A git:// or ssh:// mirror serves no archives: said, without the URL.
            url = f"$(git ls-remote --get-url {q(s.repository)})"
            lines += [
                f'u="{url}"; case "$u" in http://*|https://*|file://*) ;; *) echo "{s.name}: the git mirror '
                f'maps this archive URL to a ${{u%%://*}}:// URL, which serves no archives: map it to an http(s) '
                f'mirror" >&2; exit 1;; esac',
                f'curl -fsSL --retry 3 -o {q(archive)} "$u" || {{ echo "{s.name}: cannot download '
                f'{s.repository} (through the git mirror when one maps it)" >&2; exit 1; }}',
                f"echo {q(digest.lower() + '  ' + archive)} | {tool} -c -",
                f"tar -xf {q(archive)} -C {q(d)} --strip-components=1",
                f"rm -f {q(archive)}",
            ]
            continue
        ref = pins.get(s.name, s.commit)
        exact = bool(HEX_COMMIT.fullmatch(ref))
        g = f"git -C {q(d)}"
        lines += [
            f"{g} init -q",
            f"{g} remote add origin {q(s.repository)}",
            f"{g} fetch -q --depth 1 origin {q(ref)}",
            f"{g} -c advice.detachedHead=false checkout -q FETCH_HEAD",
        ]
        if exact:
            lines.append(f'if [ "$({g} rev-parse HEAD)" != {q(ref)} ]; then '
                         f'echo "{s.name}: fetched commit is not {ref}" >&2; exit 1; fi')
        else:
            lines.append(f'echo "{s.name}: {ref} resolved to $({g} rev-parse HEAD)"')
        if s.submodules is None:
            lines.append(f"{g} submodule update -q --init --recursive --depth 1")
        elif s.submodules:
            paths = " ".join(q(p) for p in s.submodules)
            lines.append(f"{g} submodule update -q --init --recursive --depth 1 -- {paths}")
    if cmake_overrides:
        body = cmake_overrides_file(plan, dest).splitlines()
        lines.append(f"printf '%s\\n' {' '.join(q(b) for b in body)} > {q(cmake_overrides)}")
    return "\n".join(lines) + "\n"


def override_env(plan: Sequence[ExternalSource], dest: str, *,
                 cmake_args: str = "split-on-whitespace",
                 cmake_overrides: str | None = None) -> dict[str, str]:
    """The variables that point the compile at the fetched sources.

    Environment overrides come back as NAME -> path (set them with ENV). CMake-only overrides
    are collected into one "CMAKE_ARGS" entry of -D flags (join it with any CMAKE_ARGS of your
    own). `cmake_args` is the engine's setup.py behaviour (see cmake_args_mode): with "ignored"
    -D flags cannot reach cmake; then, if `cmake_overrides` names the file that
    render_fetch_script wrote, CMAKE_TOOLCHAIN_FILE points at it, else a UserError says which
    sources cannot be redirected. A source with no override at all is an error too: the
    compile would download it.
    """
    dest = _check_dest(dest)
    env: dict[str, str] = {}
    dflags: list[str] = []
    blocked: list[str] = []
    for s in plan:
        if not s.override_var:
            blocked.append(f"{s.name} (no override variable in the CMake code)")
            continue
        path = _override_path(s, dest)
        if s.override_kind == "env":
            env[s.override_var] = path
        elif cmake_args == "split-on-whitespace":
            dflags.append(f"-D{s.override_var}={path}")
        elif cmake_overrides:
            env["CMAKE_TOOLCHAIN_FILE"] = cmake_overrides
        else:
            blocked.append(f"{s.name} ({s.override_var} is a CMake variable and setup.py "
                           f"{'ignores' if cmake_args == 'ignored' else 'may not pass'} "
                           f"CMAKE_ARGS)")
    if blocked:
        raise PlanUnusable("these sources cannot be redirected to a local checkout: "
                        + "; ".join(blocked))
    if dflags:
        env["CMAKE_ARGS"] = " ".join(dflags)
    return env
