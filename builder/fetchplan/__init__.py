"""What an engine's CMake configure downloads, read from the engine's own CMake files.

vLLM's configure step fetches external sources (CUTLASS, vllm-project/flash-attention, FlashMLA,
DeepGEMM, ...) with FetchContent at pinned revisions. Each of them can be pointed at a local
checkout through an override variable (`VLLM_FLASH_ATTN_SRC_DIR`, `FLASH_MLA_SRC_DIR`, ...),
read either from the environment (`if(DEFINED ENV{X})`) or as a CMake variable (`if(X)`).
A reproducible build fetches those sources at their pinned commits in a separate, cacheable
stage and sets the variables, so the compile itself needs no network.

The package reads CMakeLists.txt and every .cmake file it includes (tree.py: from an unpacked tree or
straight from the sdist tarball), one phase per module:

1. lexer.py: the CMake text → commands → blocks;
2. interpreter.py: walks them the way a CUDA configure would (set/include/if with three-valued
   conditions; what cannot be decided, e.g. a compiler version, is explored on both sides) and
   returns, for each git or URL download, an ExternalSource (model.py):
   - the FetchContent name, repository (``${VAR}`` resolved), GIT_TAG and whether it is a commit,
     GIT_SUBMODULES / GIT_SHALLOW / GIT_PROGRESS, SOURCE_SUBDIR, URL + URL_HASH;
   - the override variable that skips the download: the guard ``if(X)`` / ``if(DEFINED ENV{X})``
     whose branch provides the same dependency from a local path, and whether the environment
     (``set(X $ENV{X})``), the CMake variable, or both reach it. A download with no such guard
     that is made available by name falls back to CMake's own
     ``FETCHCONTENT_SOURCE_DIR_<NAME>`` cache variable;
3. document.py: the plan document `builder lock` commits under builder/data/fetchplans/;
4. script.py: ``render_fetch_script`` turns a plan into the POSIX shell the deps stage runs (shallow
   fetch of each commit), ``override_env`` into the variables the compile step sets.

The rest of builder reaches it through builder/deps.py, which also owns where the sources go (deps.DEPS_DIR).
"""

from __future__ import annotations

from .document import (
    cmake_args_mode,
    cuda_context,
    load_plan_file,
    plan_document,
    plan_document_from_tree,
    plan_from_document,
    write_plan_file,
)
from .interpreter import fetch_plan_from_sdist, fetch_plan_from_tree
from .model import CUDA_CONTEXT, CMakeParseError, ExternalSource, PlanUnusable
from .script import cmake_overrides_file, override_env, render_fetch_script

__all__ = [
    "CMakeParseError",
    "PlanUnusable",
    "ExternalSource",
    "CUDA_CONTEXT",
    "fetch_plan_from_tree",
    "fetch_plan_from_sdist",
    "plan_document",
    "plan_document_from_tree",
    "render_fetch_script",
    "cmake_overrides_file",
    "override_env",
    "cmake_args_mode",
    "cuda_context",
    "load_plan_file",
    "write_plan_file",
    "plan_from_document",
]
