"""The fetch plan read from vLLM's own CMake files, checked against the real sdists from PyPI.

The sdists are downloaded once (by URL from the PEP 691 Simple API, sha256-checked) into
~/.cache/builder-tests/sdists (or $BUILDER_TEST_CACHE/sdists).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.request
from pathlib import Path

import pytest

import builder
from builder.errors import UserError
from builder.fetchplan import (
    CMakeParseError,
    ExternalSource,
    cmake_args_mode,
    cmake_overrides_file,
    fetch_plan_from_sdist,
    fetch_plan_from_tree,
    load_plan_file,
    override_env,
    plan_document,
    plan_from_document,
    render_fetch_script,
)
from builder.deps import DEPS_DIR
from builder.pypi import SimpleIndex

SDIST_SHA256 = {
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    "0.6.3.post1": "0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143",
}
PLAN_DIR = Path(builder.__file__).parent / "data" / "fetchplans"

# (name, repository, GIT_TAG, override variable, preferred kind, every kind, reproducible)
VLLM_0_33_0 = {
    ("cutlass", "https://github.com/nvidia/cutlass.git", "v4.7.1",
     "VLLM_CUTLASS_SRC_DIR", "env", ("env", "cmake"), False),
    ("triton_kernels", "https://github.com/triton-lang/triton.git", "v3.5.1",
     "TRITON_KERNELS_SRC_DIR", "env", ("env",), False),
    ("deepgemm", "https://github.com/vllm-project/DeepGEMM.git",
     "0820030756945b2daec208e8e8255268360f337d", "DEEPGEMM_SRC_DIR", "env", ("env", "cmake"), True),
    ("deepselect", "https://github.com/vllm-project/DeepSelect.git",
     "d96d33afe1fab0d6066da49cdc91e64c2bee65ea", "DEEPSELECT_SRC_DIR", "env", ("env", "cmake"),
     True),
    ("fmha_sm100", "https://github.com/vllm-project/MSA.git",
     "968061ab16cb14991a5c7d4c0e8eabf531be0dcf", "FMHA_SM100_SRC_DIR", "env", ("env", "cmake"),
     True),
    ("flashmla", "https://github.com/vllm-project/FlashMLA",
     "e2afa5fd8c220fbd05fe03fc24c9d5e64c24641b", "FLASH_MLA_SRC_DIR", "env", ("env", "cmake"), True),
    ("flashkda", "https://github.com/vllm-project/FlashKDA.git",
     "17a037d98da546deb4591e967cf961a43c034d8b", "FLASH_KDA_SRC_DIR", "env", ("env", "cmake"), True),
    ("qutlass", "https://github.com/IST-DASLab/qutlass.git",
     "e74319e3405ce6d71965732880f5dc1f52371f64", "QUTLASS_SRC_DIR", "env", ("env", "cmake"), True),
    ("tml_fa4", "https://github.com/vllm-project/tml-fa4.git",
     "75765e76a9c2c012c1f6ecd64577eb646eb4d303", "TML_FA4_SRC_DIR", "env", ("env", "cmake"), True),
    ("vllm-flash-attn", "https://github.com/vllm-project/flash-attention.git",
     "b273a02621d3c94bc747df67204f591b67f38fae", "VLLM_FLASH_ATTN_SRC_DIR", "env",
     ("env", "cmake"), True),
}
VLLM_0_6_3 = {
    # No override of vLLM's own: CMake's FETCHCONTENT_SOURCE_DIR_<NAME> cache variable.
    ("cutlass", "https://github.com/nvidia/cutlass.git", "v3.5.1",
     "FETCHCONTENT_SOURCE_DIR_CUTLASS", "cmake", ("cmake",), False),
    ("vllm-flash-attn", "https://github.com/vllm-project/flash-attention.git",
     "013f0c4fc47e6574060879d9734c1df8c5c273bd", "VLLM_FLASH_ATTN_SRC_DIR", "env",
     ("env", "cmake"), True),
}


def _cache_dir() -> Path:
    base = os.environ.get("BUILDER_TEST_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "builder-tests"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_sdist(version: str) -> Path:
    dest = _cache_dir() / "sdists" / f"vllm-{version}.tar.gz"
    if dest.exists() and _sha256(dest) == SDIST_SHA256[version]:
        return dest
    f = SimpleIndex().sdist("vllm", version)
    assert f is not None, f"vllm {version}: no sdist on the index"
    assert f.sha256 == SDIST_SHA256[version]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    with urllib.request.urlopen(f.url, timeout=300) as resp, part.open("wb") as out:
        shutil.copyfileobj(resp, out)
    assert _sha256(part) == SDIST_SHA256[version]
    part.replace(dest)
    return dest


@pytest.fixture(scope="session")
def sdist_0_33() -> Path:
    return _fetch_sdist("0.33.0")


@pytest.fixture(scope="session")
def sdist_0_6_3() -> Path:
    return _fetch_sdist("0.6.3.post1")


@pytest.fixture(scope="session")
def plan_0_33(sdist_0_33) -> list[ExternalSource]:
    return fetch_plan_from_sdist(sdist_0_33)


@pytest.fixture(scope="session")
def plan_0_6_3(sdist_0_6_3) -> list[ExternalSource]:
    return fetch_plan_from_sdist(sdist_0_6_3)


@pytest.fixture(scope="session")
def doc_0_33(sdist_0_33) -> dict:
    return plan_document(sdist_0_33, engine="vllm", version="0.33.0")


@pytest.fixture(scope="session")
def doc_0_6_3(sdist_0_6_3) -> dict:
    return plan_document(sdist_0_6_3, engine="vllm", version="0.6.3.post1")


def _rows(plan):
    return {(s.name, s.repository, s.commit, s.override_var, s.override_kind, s.override_kinds,
             s.reproducible) for s in plan}


def _cmake_texts(sdist: Path) -> dict[str, str]:
    """Every CMake file of the sdist, read independently of the module under test."""
    out = {}
    with tarfile.open(sdist) as tf:
        for m in tf:
            rel = m.name.split("/", 1)[-1]
            if m.isfile() and (rel.endswith(".cmake") or rel.endswith("CMakeLists.txt")):
                out[rel] = tf.extractfile(m).read().decode()
    return out


# --- the real releases ----------------------------------------------------------------------


@pytest.mark.pure
@pytest.mark.network
def test_vllm_0_33_0_plan(plan_0_33):
    assert _rows(plan_0_33) == VLLM_0_33_0
    assert len(plan_0_33) == 10  # one per name
    by = {s.name: s for s in plan_0_33}
    assert by["deepgemm"].submodules == ("third-party/cutlass", "third-party/deep_jit")
    assert by["flashkda"].submodules == ("cutlass",)
    assert by["cutlass"].submodules is None and by["cutlass"].shallow is True
    assert by["triton_kernels"].subdir == "python/triton_kernels/triton_kernels"
    # vLLM expects TRITON_KERNELS_SRC_DIR to name the python package directory itself.
    assert by["triton_kernels"].override_subpath == "python/triton_kernels/triton_kernels"
    assert all(s.override_subpath is None for s in plan_0_33 if s.name != "triton_kernels")
    assert all(s.kind == "git" and s.patch_command is None for s in plan_0_33)
    assert by["cutlass"].cmake_file == "CMakeLists.txt"
    assert by["flashmla"].cmake_file == "cmake/external_projects/flashmla.cmake"
    # The CPU-only downloads (oneDNN, ComputeLibrary in cmake/cpu_extension.cmake) are not on
    # the CUDA path.
    assert not {s.name for s in plan_0_33} & {"onednn", "arm_compute"}


@pytest.mark.pure
@pytest.mark.network
def test_vllm_0_6_3_plan(plan_0_6_3):
    assert _rows(plan_0_6_3) == VLLM_0_6_3
    by = {s.name: s for s in plan_0_6_3}
    assert by["cutlass"].override_builtin is True
    assert by["vllm-flash-attn"].override_builtin is False
    assert by["cutlass"].shallow is True and by["cutlass"].progress is True


@pytest.mark.pure
@pytest.mark.network
def test_reproducible_means_full_commit(plan_0_33, plan_0_6_3):
    for s in plan_0_33 + plan_0_6_3:
        assert s.reproducible == bool(re.fullmatch(r"[0-9a-f]{40}", s.commit)), s
    tags = {(s.name, s.commit) for s in plan_0_33 + plan_0_6_3 if not s.reproducible}
    assert tags == {("cutlass", "v4.7.1"), ("triton_kernels", "v3.5.1"), ("cutlass", "v3.5.1")}


@pytest.mark.pure
@pytest.mark.network
@pytest.mark.parametrize("which", ["0.33.0", "0.6.3.post1"])
def test_every_override_variable_is_consulted_by_the_cmake_code(which, request):
    sdist = request.getfixturevalue("sdist_0_33" if which == "0.33.0" else "sdist_0_6_3")
    plan = request.getfixturevalue("plan_0_33" if which == "0.33.0" else "plan_0_6_3")
    texts = _cmake_texts(sdist)
    assert len(plan) == {"0.33.0": 10, "0.6.3.post1": 2}[which]  # the loop below checks every source
    for s in plan:
        text = texts[s.cmake_file]
        assert s.repository in text or re.search(r"set\(\s*\w+\s+\"?" + re.escape(s.repository),
                                                 text), s
        assert s.commit in text, s
        if s.override_builtin:
            # CMake's FetchContent reads FETCHCONTENT_SOURCE_DIR_<NAME> for a dependency made
            # available by name.
            assert re.search(r"FetchContent_MakeAvailable\(\s*" + re.escape(s.name) + r"\s*\)",
                             text), s
            assert s.override_var == "FETCHCONTENT_SOURCE_DIR_" + s.name.upper()
            continue
        if "env" in s.override_kinds:
            assert re.search(r"if\s*\(\s*DEFINED\s+ENV\{" + s.override_var + r"\}\s*\)", text), s
        if "cmake" in s.override_kinds:
            assert re.search(r"if\s*\(\s*" + s.override_var + r"\s*\)", text), s
            if "env" in s.override_kinds:
                assert re.search(r"set\(\s*" + s.override_var + r"\s+\$ENV\{" + s.override_var
                                 + r"\}\s*\)", text), s


@pytest.mark.pure
@pytest.mark.network
def test_setup_py_cmake_args_handling(doc_0_33, doc_0_6_3):
    assert doc_0_33["cmake_args"] == "split-on-whitespace"  # 0.12+: CMAKE_ARGS.split()
    assert doc_0_6_3["cmake_args"] == "ignored"  # up to 0.11: setup.py never reads it
    assert cmake_args_mode(None) == "no-setup.py"
    assert cmake_args_mode("cmake_args += shlex.split(os.environ['CMAKE_ARGS'])") == "unknown"


@pytest.mark.pure
@pytest.mark.network
def test_rust_part_of_0_33(doc_0_33, doc_0_6_3):
    doc = doc_0_33
    assert doc["rust_toolchain"] == "1.95"
    assert {(d["name"], d["commit"]) for d in doc["cargo_git_sources"]} == {
        ("oss-harmony", "76e849426cc092f84509e31a17027755f67d662a"),
        ("llm-multimodal", "1b6197354e498b1dfb6e2647b2c68e4d11eaf5b5"),
        ("zeromq", "67dcba97559ebe8e8206dab753710d8b9cb07591"),
    }
    old = doc_0_6_3
    assert old["rust_toolchain"] is None and old["cargo_git_sources"] == []


@pytest.mark.pure
@pytest.mark.network
@pytest.mark.parametrize("version", ["0.33.0", "0.6.3.post1"])
def test_committed_plan_file_equals_fresh_extraction(version, request):
    suffix = "0_33" if version == "0.33.0" else "0_6_3"
    doc = request.getfixturevalue(f"doc_{suffix}")
    committed = load_plan_file(PLAN_DIR / f"vllm-{version}.json")
    assert committed == json.loads(json.dumps(doc))
    assert plan_from_document(committed) == request.getfixturevalue(f"plan_{suffix}")


@pytest.mark.pure
@pytest.mark.network
def test_tree_and_sdist_give_the_same_plan(sdist_0_6_3, plan_0_6_3, tmp_path):
    with tarfile.open(sdist_0_6_3) as tf:
        tf.extractall(tmp_path, filter="data")
    assert fetch_plan_from_tree(tmp_path / "vllm-0.6.3.post1") == plan_0_6_3


@pytest.mark.pure
@pytest.mark.network
def test_notes(doc_0_6_3):
    notes = doc_0_6_3["notes"]
    assert any(n.startswith("cutlass: GIT_TAG 'v3.5.1' is a tag or branch") for n in notes)
    assert any("FETCHCONTENT_SOURCE_DIR_CUTLASS" in n and "ignores CMAKE_ARGS" in n
               for n in notes)


# --- rendering ------------------------------------------------------------------------------


@pytest.mark.network
def test_render_fetch_script_for_0_33(plan_0_33):
    script = render_fetch_script(plan_0_33, DEPS_DIR)
    assert script.startswith("set -eu\nmkdir -p /opt/deps\n")
    for s in plan_0_33:
        d = f"/opt/deps/{s.name}"
        assert f"git -C {d} init -q\n" in script
        assert f"git -C {d} remote add origin {s.repository}\n" in script
        assert f"git -C {d} fetch -q --depth 1 origin {s.commit}\n" in script
        assert f"git -C {d} -c advice.detachedHead=false checkout -q FETCH_HEAD\n" in script
        if s.reproducible:
            assert f'if [ "$(git -C {d} rev-parse HEAD)" != {s.commit} ]' in script
        else:
            assert f'echo "{s.name}: {s.commit} resolved to $(git -C {d} rev-parse HEAD)"' in script
    dg = "/opt/deps/deepgemm"
    assert (f"git -C {dg} submodule update -q --init --recursive --depth 1 -- "
            "third-party/cutlass third-party/deep_jit\n") in script
    assert ("git -C /opt/deps/flash-attn submodule" not in script)
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0


@pytest.mark.pure
@pytest.mark.network
def test_render_with_pins_verifies_the_pinned_commit(plan_0_6_3):
    pin = "a" * 40
    script = render_fetch_script(plan_0_6_3, "/deps", pins={"cutlass": pin})
    assert f"git -C /deps/cutlass fetch -q --depth 1 origin {pin}\n" in script
    assert f'if [ "$(git -C /deps/cutlass rev-parse HEAD)" != {pin} ]' in script
    assert "NOT a commit" not in script


@pytest.mark.pure
@pytest.mark.network
def test_override_env_0_33(plan_0_33):
    env = override_env(plan_0_33, DEPS_DIR)
    assert env == {
        "VLLM_CUTLASS_SRC_DIR": "/opt/deps/cutlass",
        "TRITON_KERNELS_SRC_DIR": "/opt/deps/triton_kernels/python/triton_kernels/triton_kernels",
        "DEEPGEMM_SRC_DIR": "/opt/deps/deepgemm",
        "DEEPSELECT_SRC_DIR": "/opt/deps/deepselect",
        "FMHA_SM100_SRC_DIR": "/opt/deps/fmha_sm100",
        "FLASH_MLA_SRC_DIR": "/opt/deps/flashmla",
        "FLASH_KDA_SRC_DIR": "/opt/deps/flashkda",
        "QUTLASS_SRC_DIR": "/opt/deps/qutlass",
        "TML_FA4_SRC_DIR": "/opt/deps/tml_fa4",
        "VLLM_FLASH_ATTN_SRC_DIR": "/opt/deps/vllm-flash-attn",
    }


@pytest.mark.pure
@pytest.mark.network
def test_override_env_0_6_3_cannot_use_cmake_args(plan_0_6_3):
    with pytest.raises(UserError, match=r"cutlass \(FETCHCONTENT_SOURCE_DIR_CUTLASS .*ignores"):
        override_env(plan_0_6_3, "/d", cmake_args="ignored")
    assert override_env(plan_0_6_3, "/d", cmake_args="ignored", cmake_overrides="/d/o.cmake") == {
        "VLLM_FLASH_ATTN_SRC_DIR": "/d/vllm-flash-attn",
        "CMAKE_TOOLCHAIN_FILE": "/d/o.cmake",
    }
    # Where setup.py does split CMAKE_ARGS (0.12+), the -D flag goes there.
    assert override_env(plan_0_6_3, "/d")["CMAKE_ARGS"] == \
        "-DFETCHCONTENT_SOURCE_DIR_CUTLASS=/d/cutlass"
    with pytest.raises(UserError, match="without spaces"):
        override_env(plan_0_6_3, "/a b")


@pytest.mark.network
@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_toolchain_file_override_reaches_fetchcontent(plan_0_6_3, tmp_path):
    """CMAKE_TOOLCHAIN_FILE from the environment sets FETCHCONTENT_SOURCE_DIR_CUTLASS: no download."""
    dest = tmp_path / "deps"
    (dest / "cutlass").mkdir(parents=True)
    proj = tmp_path / "proj"
    proj.mkdir()
    # The same declare as vLLM 0.6.3's, at an address that cannot be reached.
    (proj / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(p LANGUAGES NONE)\ninclude(FetchContent)\n"
        "FetchContent_Declare(cutlass GIT_REPOSITORY https://invalid.invalid/cutlass.git\n"
        "  GIT_TAG v3.5.1 GIT_PROGRESS TRUE GIT_SHALLOW TRUE)\n"
        "FetchContent_MakeAvailable(cutlass)\n"
        'message(STATUS "cutlass_SOURCE_DIR=${cutlass_SOURCE_DIR}")\n')
    overrides = dest / "cmake-overrides.cmake"
    overrides.write_text(cmake_overrides_file(plan_0_6_3, str(dest)))
    env = dict(os.environ, **override_env(plan_0_6_3, str(dest), cmake_args="ignored",
                                          cmake_overrides=str(overrides)))
    proc = subprocess.run(["cmake", "-S", str(proj), "-B", str(tmp_path / "b")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"cutlass_SOURCE_DIR={dest}/cutlass" in proc.stdout


# --- the rendered script against real git repositories ----------------------------------------


def _git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit_repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        _git("init", "-q", "-b", "main", cwd=path)
    for name, text in files.items():
        (path / name).write_text(text)
    _git("add", "-A", cwd=path)
    _git("-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "c",
         cwd=path)
    return _git("rev-parse", "HEAD", cwd=path)


def test_rendered_script_fetches_the_pinned_commits(tmp_path):
    assert shutil.which("git"), "git is not on PATH: builder lock and the deps stage need it"
    up = tmp_path / "upstream"
    sub = up / "sub"
    sub_commit = _commit_repo(sub, {"s.txt": "sub"})
    lib = up / "lib"
    first = _commit_repo(lib, {"a.txt": "one"})
    _git("-c", "protocol.file.allow=always", "submodule", "add", "-q", f"file://{sub}", "third",
         cwd=lib)
    pinned = _commit_repo(lib, {"a.txt": "two"})
    _commit_repo(lib, {"a.txt": "three"})  # the branch moved on after the pin
    plan = [
        ExternalSource("lib", f"file://{lib}", pinned, "LIB_SRC_DIR", "env", None, True),
        ExternalSource("lib-main", f"file://{lib}", "main", "LIB2_SRC_DIR", "env", None, False,
                       submodules=()),
        ExternalSource("lib-old", f"file://{lib}", first, "LIB3_SRC_DIR", "env", None, True),
    ]
    dest = tmp_path / "deps"
    script = render_fetch_script(plan, str(dest))
    env = dict(os.environ, GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="protocol.file.allow",
               GIT_CONFIG_VALUE_0="always")
    proc = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert _git("rev-parse", "HEAD", cwd=dest / "lib") == pinned
    assert (dest / "lib" / "a.txt").read_text() == "two"
    assert (dest / "lib" / "third" / "s.txt").read_text() == "sub"  # submodules, as FetchContent
    assert _git("rev-parse", "HEAD", cwd=dest / "lib" / "third") == sub_commit
    assert (dest / "lib-main" / "a.txt").read_text() == "three"
    assert not (dest / "lib-main" / "third" / "s.txt").exists()  # GIT_SUBMODULES ""
    assert "lib-main: main resolved to" in proc.stdout
    assert (dest / "lib-old" / "a.txt").read_text() == "one"
    assert _git("rev-list", "--count", "HEAD", cwd=dest / "lib") == "1"  # shallow

    # A commit that is not there fails the script.
    bad = [ExternalSource("x", f"file://{lib}", "b" * 40, "X", "env", None, True)]
    proc = subprocess.run(["sh", "-c", render_fetch_script(bad, str(tmp_path / "d2"))], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0


# --- synthetic trees: the parser's rules and its errors ---------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def _sdist(tmp_path: Path, files: dict[str, str], top="pkg-1.0") -> Path:
    path = tmp_path / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.pure
def test_sdist_without_cmake_files_gives_an_empty_plan(tmp_path):
    path = _sdist(tmp_path, {"setup.py": "from setuptools import setup\nsetup()\n",
                             "pkg/__init__.py": ""})
    assert fetch_plan_from_sdist(path) == []
    doc = plan_document(path, engine="x", version="1.0")
    assert doc["sources"] == [] and doc["cmake_args"] == "ignored" and doc["notes"] == []
    assert render_fetch_script([], DEPS_DIR) == "set -eu\nmkdir -p /opt/deps\n"
    assert override_env([], DEPS_DIR) == {}


@pytest.mark.pure
def test_branch_tag_is_not_reproducible(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt": """
project(p)
include(FetchContent)
if(FOO_SRC_DIR)
  FetchContent_Declare(foo SOURCE_DIR ${FOO_SRC_DIR})
else()
  FetchContent_Declare(foo GIT_REPOSITORY https://example.invalid/foo.git GIT_TAG main)
endif()
FetchContent_MakeAvailable(foo)
"""})
    (src,) = fetch_plan_from_tree(root)
    assert (src.name, src.commit, src.reproducible) == ("foo", "main", False)
    assert (src.override_var, src.override_kind, src.override_kinds) == ("FOO_SRC_DIR", "cmake",
                                                                         ("cmake",))


@pytest.mark.pure
def test_variables_includes_conditions_and_url_downloads(tmp_path):
    root = _tree(tmp_path, {
        "CMakeLists.txt": """
cmake_minimum_required(VERSION 3.26)
project(p LANGUAGES CXX)
set(VLLM_TARGET_DEVICE "cuda" CACHE STRING "target")
set(BAR_REPO "https://example.invalid/bar.git")
set(BAR_REV 0123456789abcdef0123456789abcdef01234567)
#[[ a bracket comment with FetchContent_Declare(nope GIT_REPOSITORY x GIT_TAG y) ]]
if (NOT VLLM_TARGET_DEVICE STREQUAL "cuda")
  include(${CMAKE_CURRENT_LIST_DIR}/cmake/cpu.cmake)
  return()
endif()
include(cmake/deps/bar.cmake)
if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 12.8)
  include(cmake/deps/baz.cmake)
endif()
""",
        "cmake/cpu.cmake": "FetchContent_Declare(onednn GIT_REPOSITORY https://example.invalid/"
                           "onednn.git GIT_TAG v3.5)\n",
        "cmake/deps/bar.cmake": """
if(DEFINED ENV{BAR_HOME})
  set(BAR_LOCAL $ENV{BAR_HOME})
endif()
if(BAR_LOCAL)
  set(bar_SOURCE_DIR "${BAR_LOCAL}")
else()
  FetchContent_Populate(bar
    SOURCE_DIR "${FETCHCONTENT_BASE_DIR}/bar-src"
    GIT_REPOSITORY "${BAR_REPO}"
    GIT_TAG "${BAR_REV}"
    GIT_SUBMODULES ""
    GIT_SHALLOW FALSE
    PATCH_COMMAND git apply ${CMAKE_CURRENT_LIST_DIR}/fix.patch)
endif()
""",
        "cmake/deps/baz.cmake": """
if (DEFINED ENV{BAZ_SRC_DIR})
  FetchContent_Declare(baz SOURCE_DIR $ENV{BAZ_SRC_DIR})
else()
  FetchContent_Declare(baz
    URL https://example.invalid/baz-1.0.tar.gz
    URL_HASH SHA256=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff
    SOURCE_SUBDIR cmake)
endif()
FetchContent_MakeAvailable(baz)
FetchContent_Declare(qux URL https://example.invalid/qux.zip)
""",
    })
    plan = {s.name: s for s in fetch_plan_from_tree(root)}
    assert set(plan) == {"bar", "baz", "qux"}  # onednn is on the CPU path only
    bar = plan["bar"]
    assert (bar.repository, bar.commit, bar.reproducible) == (
        "https://example.invalid/bar.git", "0123456789abcdef0123456789abcdef01234567", True)
    # The guard is the CMake variable BAR_LOCAL, which is copied from the environment's BAR_HOME.
    assert (bar.override_var, bar.override_kind, bar.override_kinds) == ("BAR_HOME", "env",
                                                                         ("env",))
    assert bar.submodules == () and bar.shallow is False
    assert bar.cmake_file == "cmake/deps/bar.cmake"
    assert bar.patch_command == "git apply cmake/deps/fix.patch"
    baz = plan["baz"]
    assert (baz.kind, baz.repository, baz.reproducible, baz.subdir) == (
        "url", "https://example.invalid/baz-1.0.tar.gz", True, "cmake")
    assert baz.url_hash.startswith("SHA256=0011")
    assert (baz.override_var, baz.override_kind) == ("BAZ_SRC_DIR", "env")
    qux = plan["qux"]
    assert (qux.kind, qux.reproducible, qux.override_var) == ("url", False, "")
    with pytest.raises(UserError, match="qux"):
        override_env(list(plan.values()), DEPS_DIR)
    script = render_fetch_script([baz], DEPS_DIR)
    assert "sha256sum -c -" in script and "tar -xf" in script
    with pytest.raises(UserError, match="URL_HASH"):
        render_fetch_script([qux], DEPS_DIR)


@pytest.mark.pure
def test_unresolvable_repository_is_an_error(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt":
                            "FetchContent_Declare(x GIT_REPOSITORY ${SOMEWHERE} GIT_TAG "
                            + "c" * 40 + ")\n"})
    with pytest.raises(CMakeParseError, match="cannot resolve GIT_REPOSITORY"):
        fetch_plan_from_tree(root)


@pytest.mark.pure
def test_values_from_undecidable_branches_stay_unknown(tmp_path):
    sha = "d" * 40
    decl = f"FetchContent_Declare(x GIT_REPOSITORY ${{REPO}} GIT_TAG {sha})\n"
    differ = ("if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER 12)\n  set(REPO https://a)\n"
              "else()\n  set(REPO https://b)\nendif()\n")
    root = _tree(tmp_path / "a", {"CMakeLists.txt": differ + decl})
    with pytest.raises(CMakeParseError, match="cannot resolve GIT_REPOSITORY"):
        fetch_plan_from_tree(root)
    agree = differ.replace("https://b", "https://a")
    (src,) = fetch_plan_from_tree(_tree(tmp_path / "b", {"CMakeLists.txt": agree + decl}))
    assert (src.repository, src.commit, src.override_var) == ("https://a", sha, "")
    # Inside the branch, its own values are used.
    inside = ("if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER 12)\n  set(REPO https://c)\n  "
              + decl + "endif()\n")
    (src,) = fetch_plan_from_tree(_tree(tmp_path / "c", {"CMakeLists.txt": inside}))
    assert src.repository == "https://c"


@pytest.mark.pure
def test_malformed_cmake_is_an_error(tmp_path):
    root = _tree(tmp_path, {"CMakeLists.txt": "if(A)\n  set(B 1)\n"})
    with pytest.raises(CMakeParseError, match="not closed"):
        fetch_plan_from_tree(root)
    root2 = _tree(tmp_path / "b", {"CMakeLists.txt": 'set(A "unterminated)\n'})
    with pytest.raises(CMakeParseError, match="unterminated"):
        fetch_plan_from_tree(root2)


@pytest.mark.pure
def test_not_a_tarball(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UserError):
        fetch_plan_from_sdist(bad)
    with pytest.raises(UserError):
        fetch_plan_from_sdist(tmp_path / "missing.tar.gz")
