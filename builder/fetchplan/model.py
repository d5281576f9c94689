"""What every phase of the fetch plan shares: one external source, the errors, and what a CUDA configure
knows before the engine's own CMake code runs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import UserError

# What a CUDA configure of vLLM knows before its own code runs: torch's config found CUDA and no
# HIP. Everything else the interpreter does not know stays unknown.
CUDA_CONTEXT: Mapping[str, str] = {
    "VLLM_TARGET_DEVICE": "cuda",
    "CUDA_FOUND": "TRUE",
    "HIP_FOUND": "FALSE",
    "PYTORCH_FOUND_HIP": "FALSE",
    "CMAKE_SYSTEM_NAME": "Linux",
    "UNIX": "1",
    "WIN32": "",
    "APPLE": "",
    "MSVC": "",
}

ROOT = "/__src__"  # virtual absolute path of the source tree inside the interpreter
FETCHED = "/__fetched__"  # virtual root of the downloads: <name>_SOURCE_DIR is FETCHED/<name> once populated
HEX_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FETCH_COMMANDS = ("fetchcontent_declare", "fetchcontent_populate", "externalproject_add")


class CMakeParseError(UserError):
    """The CMake code could not be read or a download's location could not be resolved."""


class PlanUnusable(UserError):
    """A plan that was read but cannot drive a sealed compile (a download without a hash or without an override)."""


@dataclass(frozen=True)
class ExternalSource:
    """One download of the engine's CMake configure."""

    name: str  # FetchContent name, lowercased (also the directory under the fetch destination)
    repository: str  # git URL, or the archive URL when kind == "url"
    commit: str  # GIT_TAG as written after ${} expansion (a commit when reproducible); "" for URLs
    override_var: str  # the variable that, when set, skips the download ("" when none exists)
    override_kind: str  # "env" | "cmake" ("" when none): the preferred way to set it
    subdir: str | None  # SOURCE_SUBDIR
    reproducible: bool  # GIT_TAG is a full commit id / URL has URL_HASH
    # --- details -------------------------------------------------------------------------
    kind: str = "git"  # "git" | "url"
    override_kinds: tuple[str, ...] = ()  # every way the CMake code honours the override
    override_subpath: str | None = None  # the override must point at <checkout>/<this>
    override_builtin: bool = False  # the override is CMake's FETCHCONTENT_SOURCE_DIR_<NAME>
    submodules: tuple[str, ...] | None = None  # GIT_SUBMODULES; None = not given (all, recursive)
    shallow: bool | None = None  # GIT_SHALLOW
    progress: bool | None = None  # GIT_PROGRESS
    url_hash: str | None = None  # "SHA256=..." for URL downloads
    patch_command: str | None = None  # PATCH_COMMAND, tree paths relative (skipped if overridden)
    cmake_file: str = ""  # file (relative to the tree) and line of the declare
    line: int = 0
    # SOURCE_DIR inside another download's checkout ("<other>/<path>", e.g. "repo-flashmla/csrc/cutlass"): the
    # other's CMake code reads it there, so it is fetched into that place of the other's checkout
    inside: str | None = None
