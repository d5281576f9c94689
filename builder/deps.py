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
def deps_context(name: str, version: str) -> dict:
    """What the templates need for one package's deps stage (empty script when nothing to fetch)."""
    path = plan_path(name, version)
    if not path.is_file():
        raise UserError(f"{name} {version}: no fetch plan at {path.name}; run `builder lock` to read it from the sdist")
    doc = fetchplan.load_plan_file(path)
    plan = fetchplan.plan_from_document(doc)
    ignored = doc.get("cmake_args") == "ignored"
    overrides = TOOLCHAIN_FILE if ignored and any(s.override_kind == "cmake" for s in plan) else None
    script = fetchplan.render_fetch_script(plan, DEPS_DIR, cmake_overrides=overrides)
    env = fetchplan.override_env(plan, DEPS_DIR, cmake_args=doc.get("cmake_args", "unknown"), cmake_overrides=overrides)
    cargo_dirs = sorted({str(Path(g["lockfile"]).parent) for g in doc.get("cargo_git_sources", [])})
    return {
        "plan_file": path.name,
        "sources": [(s.name, s.repository, s.commit, s.reproducible) for s in plan],
        "script_lines": [shlex.quote(line) for line in script.splitlines()],
        "env": sorted(env.items()),
        "rust_toolchain": doc.get("rust_toolchain") or "",
        "cargo_dirs": cargo_dirs,
        "notes": list(doc.get("notes", [])),
    }


def for_recipe(r: Recipe) -> dict | None:
    return deps_context(r.name, r.version) if r.fetch_plan else None
