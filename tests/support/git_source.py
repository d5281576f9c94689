"""What the two halves of test_git_source.py share: tests/unit/matrix/test_git_source.py (its tests that need no
Docker) and tests/docker/matrix/test_git_source.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.helpers import KERNEL_PYPROJECT

VERSION = "0.5.23"
CUTLASS_TGZ = b"not really cutlass, but bytes with a hash"

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61.0", "setuptools-scm>=8.0", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
dynamic = ["version"]
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools_scm]
root = ".."
version_file = "sglang/_version.py"
# Allow editable installs even when .git metadata is not available.
fallback_version = "0.0.0.dev0"
"""

# The kernel's project as it lies in SGLang's tree since sglang-kernel 0.4.6 (engine data source_subdir; the wheel's
# own METADATA names .../tree/main/python/sglang/kernels/aot): CMakeLists.txt there includes its cmake/ files
# through CMAKE_CURRENT_LIST_DIR, and one of the downloads is declared only in such a file (as FlashMLA's are in
# cmake/flashmla.cmake upstream).
KERNEL_DIR = "python/sglang/kernels/aot"
KERNEL_CMAKE = """\
cmake_minimum_required(VERSION 3.26 FATAL_ERROR)
project(sgl-kernel LANGUAGES CXX CUDA)
include(${{CMAKE_CURRENT_LIST_DIR}}/cmake/utils.cmake)
include(FetchContent)
FetchContent_Declare(
    repo-cutlass
    URL https://example.invalid/cutlass-4.2.1.tar.gz
    URL_HASH SHA256={sha}
)
FetchContent_Populate(repo-cutlass)
include(${{CMAKE_CURRENT_LIST_DIR}}/cmake/flashmla.cmake)
"""
KERNEL_CMAKE_UTILS = "function(clear_cuda_arches CUDA_ARCH_FLAGS)\nendfunction()\n"
KERNEL_CMAKE_FLASHMLA = """\
FetchContent_Declare(
    repo-fmt
    GIT_REPOSITORY https://github.com/fmtlib/fmt
    GIT_TAG        553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-fmt)
"""


def git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, str]:
    """A repository with SGLang's layout, the release tagged v0.5.23 and one commit after it (so a clone's
    describe would not even give the release); returns (path, commit of the tag)."""
    root = tmp_path_factory.mktemp("sglang-repo") / "sglang"
    (root / "python" / "sglang").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text(PYPROJECT)
    (root / "python" / "sglang" / "__init__.py").write_text("from sglang.version import __version__\n")
    (root / "python" / "sglang" / "version.py").write_text(
        "try:\n    from sglang._version import __version__\nexcept ImportError:\n    __version__ = '0.0.0.dev0'\n")
    kernel = root / KERNEL_DIR
    (kernel / "cmake").mkdir(parents=True)
    (kernel / "CMakeLists.txt").write_text(KERNEL_CMAKE.format(sha=hashlib.sha256(CUTLASS_TGZ).hexdigest()))
    (kernel / "cmake" / "utils.cmake").write_text(KERNEL_CMAKE_UTILS)
    (kernel / "cmake" / "flashmla.cmake").write_text(KERNEL_CMAKE_FLASHMLA)
    (kernel / "pyproject.toml").write_text(KERNEL_PYPROJECT)
    git("init", "-q", "-b", "main", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "release", cwd=root)
    git("tag", "-a", f"v{VERSION}", "-m", f"v{VERSION}", cwd=root)
    commit = git("rev-parse", "HEAD", cwd=root)
    (root / "README.md").write_text("after the release\n")
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "after", cwd=root)
    return root, commit
