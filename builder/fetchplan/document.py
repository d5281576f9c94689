"""Phase 3: the plan document — the JSON file under builder/data/fetchplans/ that `builder lock` writes and
`build` reads: the sources, how setup.py passes CMAKE_ARGS, the Rust toolchain and cargo's git sources, notes,
and where the plan was read (sdist or git commit)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import UserError
from .interpreter import read_plan
from .model import CUDA_CONTEXT, CMakeParseError, ExternalSource
from .tree import Tree

def cmake_args_mode(setup_py: str | None, pyproject: str | None = None) -> str:
    """How the engine's setup.py passes $CMAKE_ARGS to cmake.

    "ignored": setup.py never reads it (vLLM up to 0.11), so -D cache variables cannot reach
    the configure; "split-on-whitespace": appended after str.split() (vLLM 0.12+), no shell
    quoting; "unknown": mentioned in a way this check does not recognise; "no-setup.py".
    Without a setup.py, a pyproject.toml whose build backend is scikit-build-core gives
    "scikit-build-core": defines reach cmake as pip's -Ccmake.define.NAME=VALUE.
    """
    if setup_py is None:
        if pyproject and re.search(r"""build-backend\s*=\s*["']scikit_build_core\.build["']""", pyproject):
            return "scikit-build-core"
        return "no-setup.py"
    if "CMAKE_ARGS" not in setup_py:
        return "ignored"
    if re.search(r"""environ\.get\(\s*["']CMAKE_ARGS["']\s*\)""", setup_py) and \
            re.search(r"\+=\s*\w+\.split\(\)", setup_py):
        return "split-on-whitespace"
    return "unknown"


def _rust_toolchain(tree: Tree) -> str | None:
    text = tree.read("rust-toolchain.toml")
    if text is not None:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise CMakeParseError(f"rust-toolchain.toml: {e}") from e
        channel = data.get("toolchain", {}).get("channel")
        return str(channel) if channel is not None else None
    text = tree.read("rust-toolchain")
    if text is not None:
        return text.strip() or None
    return None


def _cargo_git_sources(tree: Tree) -> list[dict[str, str]]:
    """Git dependencies pinned in Cargo.lock (cargo fetches them from their hosts)."""
    for rel in ("rust/Cargo.lock", "Cargo.lock"):
        text = tree.read(rel)
        if text is None:
            continue
        import tomllib

        out = []
        for pkg in tomllib.loads(text).get("package", []):
            src = pkg.get("source", "")
            if src.startswith("git+"):
                url, _, commit = src[4:].partition("#")
                out.append({"name": pkg["name"], "version": pkg.get("version", ""),
                            "repository": url.split("?", 1)[0], "commit": commit,
                            "lockfile": rel})
        return sorted(out, key=lambda d: d["name"])
    return []


def _notes(plan: Sequence[ExternalSource], mode: str) -> list[str]:
    notes = []
    for s in plan:
        if s.kind == "git" and not s.reproducible:
            notes.append(
                f"{s.name}: GIT_TAG {s.commit!r} is a tag or branch, not a commit: what it names "
                f"can move; pin the commit it resolves to when locking")
        if not s.override_var:
            notes.append(f"{s.name}: no override variable: the compile downloads it itself")
        if s.override_builtin:
            line = (f"{s.name}: the engine's CMake has no override of its own; CMake's "
                    f"FetchContent honours the cache variable {s.override_var}, which reaches "
                    f"cmake only as -D")
            if mode == "ignored":
                line += (" — and this version's setup.py ignores CMAKE_ARGS, so -D cannot pass "
                         "it; a file that sets it as a cache entry, named by the environment "
                         "variable CMAKE_TOOLCHAIN_FILE (CMake >= 3.21), does")
            notes.append(line)
        elif s.override_kind == "cmake" and mode == "ignored":
            notes.append(f"{s.name}: {s.override_var} is read only as a CMake variable and "
                         f"this version's setup.py ignores CMAKE_ARGS: pass it through a "
                         f"CMAKE_TOOLCHAIN_FILE that sets it as a cache entry")
        if s.override_subpath:
            notes.append(f"{s.name}: {s.override_var} must point at "
                         f"<checkout>/{s.override_subpath}, not at the checkout")
        if s.patch_command:
            notes.append(f"{s.name}: PATCH_COMMAND is skipped when the override is set; "
                         f"apply it in the fetch step: {s.patch_command}")
    return notes


def _jsonable(src: ExternalSource) -> dict:
    d = asdict(src)
    if d["inside"] is None:  # only nested downloads carry it (plan files written before it existed stay the same)
        del d["inside"]
    for k, v in d.items():
        if isinstance(v, tuple):
            d[k] = list(v)
    return d


def plan_document(sdist: Path, *, engine: str, version: str) -> dict:
    """Everything the fetch stage needs to know about one engine release, as plain data."""
    sdist = Path(sdist)
    return _document(Tree.from_sdist(sdist), engine, version,
                     {"sdist": {"filename": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}})


def plan_document_from_tree(root: Path, *, engine: str, version: str, repository: str, commit: str,
                            subdir: str = ".", cuda: str = "") -> dict:
    """The same for a git source: `root` is the checkout of `commit`, the package lives in `subdir` of it.
    `cuda` ("13.0") is the toolkit the configure runs with: CMake code that picks a repository by CUDA_VERSION
    (sgl-kernel: DeepGEMM from one fork on 12.8, another elsewhere) takes that branch."""
    tree = Tree.from_dir(Path(root) / subdir if subdir not in ("", ".") else Path(root))
    return _document(tree, engine, version,
                     {"git": {"repository": repository, "commit": commit, "subdir": subdir}}, cuda)


def cuda_context(cuda: str) -> dict[str, str]:
    """CUDA_CONTEXT plus the toolkit version find_package(CUDAToolkit) reports (major.minor of `cuda`)."""
    if not cuda:
        return dict(CUDA_CONTEXT)
    short = ".".join(cuda.split(".")[:2])
    return {**CUDA_CONTEXT, "CUDA_VERSION": short, "CUDAToolkit_VERSION": short}


def _document(tree: Tree, engine: str, version: str, origin: dict, cuda: str = "") -> dict:
    """The plan document; a CMake form the reader cannot resolve makes a document that says so ("unresolved",
    with the file and line), so one package is UNPINNED and every other is still planned."""
    mode = cmake_args_mode(tree.read("setup.py"), tree.read("pyproject.toml"))
    head = {"engine": engine, "version": version, **origin, "target": "cuda", **({"cuda": cuda} if cuda else {})}
    try:
        plan = read_plan(tree, cuda_context(cuda) if cuda else None)
        rust = _rust_toolchain(tree)
    except CMakeParseError as exc:
        return {**head, "cmake_args": mode, "unresolved": str(exc), "sources": [], "rust_toolchain": None,
                "cargo_git_sources": [], "notes": []}
    return {
        **head,
        "cmake_args": mode,
        "sources": [_jsonable(s) for s in plan],
        "rust_toolchain": rust,
        "cargo_git_sources": _cargo_git_sources(tree),
        "notes": _notes(plan, mode),
    }


def plan_from_document(doc: Mapping) -> list[ExternalSource]:
    out = []
    for d in doc.get("sources", []):
        d = dict(d)
        for k in ("override_kinds", "submodules"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        out.append(ExternalSource(**d))
    return out


def write_plan_file(doc: Mapping, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def load_plan_file(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise UserError(f"no fetch plan file {path}") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e}") from e
