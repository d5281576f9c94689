"""External sources a package's build would download on its own (vLLM's CMake FetchContent, cargo):
fetched in a separate, cacheable stage at the commits its release pins, so the compile needs no network."""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

from . import fetchplan
from .engines import Recipe
from .errors import UserError

PLAN_DIR = Path(__file__).resolve().parent / "data" / "fetchplans"
DEPS_DIR = "/opt/deps"
TOOLCHAIN_FILE = f"{DEPS_DIR}/overrides.cmake"


def plan_path(name: str, version: str) -> Path:
    return PLAN_DIR / f"{name}-{version}.json"


@cache
def _plan_doc(name: str, version: str) -> dict:
    path = plan_path(name, version)
    if not path.is_file():
        raise UserError(f"{name} {version}: no fetch plan at {path.name}; run `builder lock` to read it from the sdist")
    return fetchplan.load_plan_file(path)


def plan_sources(name: str, version: str) -> list:
    """The external sources of one release, as its fetch plan lists them."""
    return fetchplan.plan_from_document(_plan_doc(name, version))


def tags_to_pin(name: str, version: str) -> list[tuple[str, str, str]]:
    """(source, repository, tag) for every source the engine's CMake names by tag or branch, not commit."""
    return [(s.name, s.repository, s.commit) for s in plan_sources(name, version) if s.kind == "git" and not s.reproducible]


@cache
def deps_context(name: str, version: str, pins: tuple[tuple[str, str], ...] = ()) -> dict:
    """What the templates need for one package's deps stage. `pins` maps a source named by tag to the commit
    that tag resolved to (matrix.lock); a tag without a pin is fetched by name and reported unpinned."""
    doc = _plan_doc(name, version)
    plan = plan_sources(name, version)
    ignored = doc.get("cmake_args") == "ignored"
    overrides = TOOLCHAIN_FILE if ignored and any(s.override_kind == "cmake" for s in plan) else None
    pin_map = dict(pins)
    script = fetchplan.render_fetch_script(plan, DEPS_DIR, pins=pin_map, cmake_overrides=overrides)
    env = fetchplan.override_env(plan, DEPS_DIR, cmake_args=doc.get("cmake_args", "unknown"), cmake_overrides=overrides)
    cargo_dirs = sorted({str(Path(g["lockfile"]).parent) for g in doc.get("cargo_git_sources", [])})
    return {
        "plan_file": plan_path(name, version).name,
        "sources": [(s.name, s.repository, pin_map.get(s.name, s.commit), s.reproducible or s.name in pin_map) for s in plan],
        "unpinned": [f"{s.name} {s.commit}" for s in plan if s.kind == "git" and not s.reproducible and s.name not in pin_map],
        "script_lines": [shlex.quote(line) for line in script.splitlines()],
        "env": sorted(env.items()),
        "rust_toolchain": doc.get("rust_toolchain") or "",
        "cargo_dirs": cargo_dirs,
        "notes": list(doc.get("notes", [])),
    }


def for_package(pkg) -> dict | None:
    r: Recipe = pkg.recipe
    return deps_context(r.name, r.version, pkg.deps_pins) if r.fetch_plan else None
