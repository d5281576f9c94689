"""External sources a package's build would download on its own (vLLM's and sglang-kernel's CMake
FetchContent, cargo): fetched in a separate, cacheable stage at the commits its release pins, so the compile
needs no network.

The face of builder/fetchplan/ (which reads the plans from the engines' CMake files): `builder lock` reads and
commits plans through it, render asks it for a package's deps stage. Where the fetched sources go is one value,
DEPS_DIR, handed to the templates as `pkg.deps.dir` (and so part of the wheel's cache key)."""

from __future__ import annotations

import dataclasses
import shlex
from functools import cache
from pathlib import Path

from . import fetchplan
from .engines import Recipe
from .errors import UserError

PLAN_DIR = Path(__file__).resolve().parent / "data" / "fetchplans"
DEPS_DIR = "/opt/deps"  # in the deps stage and the compile stage that copies it
TOOLCHAIN_FILE = f"{DEPS_DIR}/overrides.cmake"


def plan_path(name: str, version: str) -> Path:
    return PLAN_DIR / f"{name}-{version}.json"


def committed_plan(name: str, version: str) -> dict | None:
    """The plan document committed for a release, read afresh (None when there is none)."""
    path = plan_path(name, version)
    return fetchplan.load_plan_file(path) if path.is_file() else None


def read_plan_from_sdist(sdist: Path, name: str, version: str) -> dict:
    """The plan document of a release, read from its sdist's CMake files."""
    return fetchplan.plan_document(sdist, engine=name, version=version)


def read_plan_from_tree(root: Path, name: str, version: str, *, repository: str, commit: str, subdir: str,
                        cuda: str = "") -> dict:
    """The plan document of a git source, read from its checkout at `commit`."""
    return fetchplan.plan_document_from_tree(root, engine=name, version=version, repository=repository,
                                             commit=commit, subdir=subdir, cuda=cuda)


def commit_plan(doc: dict, name: str, version: str) -> Path:
    """Write a release's plan document where builds read it; what was read of the old one is forgotten."""
    target = plan_path(name, version)
    fetchplan.write_plan_file(doc, target)
    _plan_doc.cache_clear()
    deps_context.cache_clear()
    return target


@cache
def _plan_doc(name: str, version: str) -> dict:
    path = plan_path(name, version)
    if not path.is_file():
        raise UserError(f"{name} {version}: no fetch plan at {path.name}; run `builder lock` to read it from the sdist")
    return fetchplan.load_plan_file(path)


def plan_sources(name: str, version: str) -> list:
    """The external sources of one release, as its fetch plan lists them."""
    return fetchplan.plan_from_document(_plan_doc(name, version))


def has_plan(name: str, version: str) -> bool:
    return plan_path(name, version).is_file()


def tags_to_pin(name: str, version: str) -> list[tuple[str, str, str]]:
    """(source, repository, tag) for every source the engine's CMake names by tag or branch, not commit
    (none while no plan was read: for_package reports that)."""
    if not has_plan(name, version):
        return []
    return [(s.name, s.repository, s.commit) for s in plan_sources(name, version) if s.kind == "git" and not s.reproducible]


def with_fetchcontent_overrides(plan: list, names: tuple[str, ...], where: str) -> list:
    """The plan with CMake's own FETCHCONTENT_SOURCE_DIR_<NAME> as the override of the named sources (engine
    data `fetch_overrides`: where the engine's variable takes a branch that differs from its download)."""
    known = {s.name for s in plan}
    missing = [n for n in names if n not in known]
    if missing:
        raise UserError(f"{where}: fetch_overrides names {', '.join(missing)}, which its fetch plan does not list "
                        f"(known: {', '.join(sorted(known))}); the engine data is out of date")
    return [dataclasses.replace(s, override_var=f"FETCHCONTENT_SOURCE_DIR_{s.name.upper()}", override_kind="cmake",
                                override_kinds=("cmake",), override_builtin=True, override_subpath=None)
            if s.name in names else s for s in plan]


@cache
def deps_context(name: str, version: str, pins: tuple[tuple[str, str], ...] = (),
                 fetchcontent: tuple[str, ...] = ()) -> dict:
    """What the templates need for one package's deps stage. `pins` maps a source named by tag to the commit
    that tag resolved to (matrix.lock); a tag without a pin is fetched by name and reported unpinned.
    `fetchcontent` names the sources redirected through FETCHCONTENT_SOURCE_DIR_<NAME> instead of the
    engine's own variable.

    How the overrides reach CMake follows the plan's `cmake_args`: environment variables where the CMake
    reads them, -D flags in CMAKE_ARGS where setup.py passes that on, a CMAKE_TOOLCHAIN_FILE where it ignores
    it, and `cmake_defines` (pip's -Ccmake.define.NAME=VALUE) for scikit-build-core projects."""
    doc = _plan_doc(name, version)
    plan = with_fetchcontent_overrides(plan_sources(name, version), fetchcontent, f"{name} {version}")
    mode = doc.get("cmake_args", "unknown")
    ignored = mode == "ignored"
    overrides = TOOLCHAIN_FILE if ignored and any(s.override_kind == "cmake" for s in plan) else None
    pin_map = dict(pins)
    script = fetchplan.render_fetch_script(plan, DEPS_DIR, pins=pin_map, cmake_overrides=overrides)
    skbuild = mode == "scikit-build-core"
    env = fetchplan.override_env(plan, DEPS_DIR, cmake_args="split-on-whitespace" if skbuild else mode,
                                 cmake_overrides=overrides)
    defines: list[tuple[str, str]] = []
    if skbuild and "CMAKE_ARGS" in env:
        defines = [tuple(flag[2:].split("=", 1)) for flag in env.pop("CMAKE_ARGS").split()]
    # FetchContent itself refuses to download (the compile RUN also has no network): a dependency the plan
    # missed is an error naming it, at configure time
    if skbuild:
        defines.append(("FETCHCONTENT_FULLY_DISCONNECTED", "ON"))
    elif mode == "split-on-whitespace":
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DFETCHCONTENT_FULLY_DISCONNECTED=ON").strip()
    cargo_dirs = sorted({str(Path(g["lockfile"]).parent) for g in doc.get("cargo_git_sources", [])})
    return {
        "dir": DEPS_DIR,
        "plan_file": plan_path(name, version).name,
        "missing": "",
        "cmake_defines": defines,
        "sources": [(s.name, s.repository, pin_map.get(s.name, s.commit), s.reproducible or s.name in pin_map) for s in plan],
        "unpinned": [f"{s.name} {s.commit}" for s in plan if s.kind == "git" and not s.reproducible and s.name not in pin_map],
        "script_lines": [shlex.quote(line) for line in script.splitlines()],
        "env": sorted(env.items()),
        "rust_toolchain": doc.get("rust_toolchain") or "",
        "cargo_dirs": cargo_dirs,
        "notes": list(doc.get("notes", [])),
    }


def missing_context(name: str, version: str, why: str) -> dict:
    """A deps stage that stops the build: the plan of a git source could not be read (no git host at lock time)."""
    message = f"{name} {version}: no fetch plan ({why}); run `builder lock` where the git host answers"
    return {
        "dir": DEPS_DIR,
        "plan_file": plan_path(name, version).name,
        "missing": message,
        "cmake_defines": [],
        "sources": [],
        "unpinned": [f"all (no fetch plan: {why})"],
        "script_lines": [shlex.quote(f"echo {shlex.quote(message)} >&2"), shlex.quote("exit 1")],
        "env": [],
        "rust_toolchain": "",
        "cargo_dirs": [],
        "notes": [],
    }


def for_package(pkg) -> dict | None:
    r: Recipe = pkg.recipe
    if not r.fetch_plan:
        return None
    if pkg.source.kind == "git" and not has_plan(r.name, r.version):
        # the plan is read from the source at its commit, which `builder lock` could not fetch
        why = "source commit unknown" if not pkg.source.commit else "not read from the source yet"
        return missing_context(r.name, r.version, why)
    doc = _plan_doc(r.name, r.version)
    if doc.get("unresolved"):  # a CMake form the reader could not resolve: this package only is UNPINNED
        return missing_context(r.name, r.version, f"its CMake could not be read: {doc['unresolved']}")
    planned = doc.get("git", {}).get("commit")
    if pkg.source.kind == "git" and pkg.source.commit and planned and planned != pkg.source.commit:
        return missing_context(r.name, r.version, f"the plan was read at {planned[:12]}, the source is pinned at "
                                                  f"{pkg.source.commit[:12]}")
    try:
        return deps_context(r.name, r.version, pkg.deps_pins, tuple(n for n, _ in r.fetch_overrides))
    except fetchplan.PlanUnusable as exc:  # e.g. a download the compile cannot be pointed away from: this package only
        return missing_context(r.name, r.version, f"its plan cannot be used: {exc}")
