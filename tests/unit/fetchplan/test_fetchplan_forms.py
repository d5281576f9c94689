"""CMake forms of sgl-kernel's configure the fetch-plan reader has to resolve, and what happens where it cannot.

The forms were met in stored public versions of sgl-project/sglang's sgl-kernel/CMakeLists.txt and its cmake/
files (read with the code search; the repository itself is unreachable here): the DeepGEMM repository and tag
chosen by `"${CUDA_VERSION}" VERSION_EQUAL "12.8"`, the git host given by `if(NOT DEFINED GITHUB_ARTIFACTORY)
set(...)`, and a declare whose SOURCE_DIR lies inside another download's checkout (FlashMLA's csrc/cutlass).
The trees below are written for these tests in the same forms (names and commits invented)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder import deps, fetchplan, lock

from tests.helpers import KERNEL_PYPROJECT as PYPROJECT  # sgl-kernel's scikit-build-core project

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40
COMMIT_C = "c" * 40

KERNEL_CMAKE = f"""\
cmake_minimum_required(VERSION 3.26 FATAL_ERROR)
project(sgl-kernel LANGUAGES CXX CUDA)
find_package(CUDAToolkit REQUIRED)
include(FetchContent)

# a mirror host may be passed with -D; otherwise the public one
if(NOT DEFINED GITHUB_ARTIFACTORY)
    set(GITHUB_ARTIFACTORY "github.com")
endif()

if("${{CUDA_VERSION}}" VERSION_EQUAL "12.8")
    set(GEMM_REPO "https://${{GITHUB_ARTIFACTORY}}/example-fork/DeepGEMM")
    set(GEMM_TAG "blackwell")
else()
    set(GEMM_REPO "https://${{GITHUB_ARTIFACTORY}}/example/DeepGEMM")
    set(GEMM_TAG "{COMMIT_A}")
endif()

FetchContent_Declare(
    repo-deepgemm
    GIT_REPOSITORY ${{GEMM_REPO}}
    GIT_TAG        ${{GEMM_TAG}}
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-deepgemm)

include(${{CMAKE_CURRENT_LIST_DIR}}/cmake/flashmla.cmake)
"""

FLASHMLA_CMAKE = f"""\
FetchContent_Declare(
    repo-flashmla
    GIT_REPOSITORY https://${{GITHUB_ARTIFACTORY}}/example/FlashMLA
    GIT_TAG        {COMMIT_B}
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-flashmla)

# the CUTLASS FlashMLA's own code includes, at the commit FlashMLA needs, where FlashMLA looks for it
FetchContent_Declare(
    repo-flashmla-cutlass
    GIT_REPOSITORY https://${{GITHUB_ARTIFACTORY}}/example/cutlass
    GIT_TAG        {COMMIT_C}
    SOURCE_DIR     ${{repo-flashmla_SOURCE_DIR}}/csrc/cutlass
)
FetchContent_Populate(repo-flashmla-cutlass)
"""


def _tree(root: Path, cmake: str = KERNEL_CMAKE) -> Path:
    (root / "cmake").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(cmake)
    (root / "cmake" / "flashmla.cmake").write_text(FLASHMLA_CMAKE)
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


@pytest.mark.pure
def test_the_three_forms_resolve_for_the_cells_cuda(tmp_path):
    doc = fetchplan.plan_document_from_tree(_tree(tmp_path / "k"), engine="sglang-kernel", version="0.4.10",
                                            repository="https://example/sglang", commit="d" * 40, cuda="13.0")
    assert "unresolved" not in doc and doc["cuda"] == "13.0"
    by_name = {s["name"]: s for s in doc["sources"]}
    assert list(by_name) == ["repo-deepgemm", "repo-flashmla", "repo-flashmla-cutlass"]
    # CUDA 13.0 takes the else branch; the mirror default applies (builder passes no -DGITHUB_ARTIFACTORY)
    assert by_name["repo-deepgemm"]["repository"] == "https://github.com/example/DeepGEMM"
    assert by_name["repo-deepgemm"]["commit"] == COMMIT_A and by_name["repo-deepgemm"]["reproducible"]
    nested = by_name["repo-flashmla-cutlass"]
    assert nested["inside"] == "repo-flashmla/csrc/cutlass"
    assert nested["override_var"] == "FETCHCONTENT_SOURCE_DIR_REPO-FLASHMLA-CUTLASS"
    assert nested["cmake_file"] == "cmake/flashmla.cmake" and nested["line"] == 10
    # 12.8 takes the fork's branch, named by a branch: a tag to pin, not a commit
    doc128 = fetchplan.plan_document_from_tree(tmp_path / "k", engine="sglang-kernel", version="0.4.10",
                                               repository="https://example/sglang", commit="d" * 40, cuda="12.8")
    gemm = doc128["sources"][0]
    assert gemm["repository"] == "https://github.com/example-fork/DeepGEMM" and not gemm["reproducible"]

    plan = fetchplan.plan_from_document(doc)
    script = fetchplan.render_fetch_script(plan, "/opt/deps")
    # the nested checkout lands where its parent's code reads it, after the parent was fetched
    parent_at = script.index("git -C /opt/deps/repo-flashmla init")
    nested_at = script.index("git -C /opt/deps/repo-flashmla/csrc/cutlass init")
    assert parent_at < nested_at and f"fetch -q --depth 1 origin {COMMIT_C}" in script
    env = fetchplan.override_env(plan, "/opt/deps")
    assert "-DFETCHCONTENT_SOURCE_DIR_REPO-FLASHMLA-CUTLASS=/opt/deps/repo-flashmla/csrc/cutlass" in env["CMAKE_ARGS"]


@pytest.mark.pure
def test_a_form_the_reader_cannot_resolve_names_its_file_and_line(tmp_path):
    """Without the CUDA version the repository cannot be known: the document says so instead of raising."""
    doc = fetchplan.plan_document_from_tree(_tree(tmp_path / "k"), engine="sglang-kernel", version="0.4.10",
                                            repository="https://example/sglang", commit="d" * 40)
    assert doc["sources"] == [] and doc["unresolved"].startswith("CMakeLists.txt:19: repo-deepgemm: cannot resolve")
    with pytest.raises(fetchplan.CMakeParseError):
        fetchplan.fetch_plan_from_tree(tmp_path / "k")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


# where the kernel's project lives in SGLang's tree from sglang-kernel 0.4.6 on (engine data source_subdir)
KERNEL_DIR = "python/sglang/kernels/aot"


def _repo(root: Path, cmake: str) -> str:
    _tree(root / KERNEL_DIR, cmake)
    _git("init", "-q", cwd=root)
    _git("add", "-A", cwd=root)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "r", cwd=root)
    return _git("rev-parse", "HEAD", cwd=root)


def test_an_unreadable_cmake_marks_that_package_unpinned_with_the_reason(tmp_path, monkeypatch):
    """lock (and build, through the same function) writes a plan that says what it could not read, and the
    package's deps stage stops with that reason; the reader's failure reaches no other package."""
    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path / "plans")
    deps._plan_doc.cache_clear()
    deps.deps_context.cache_clear()
    broken = KERNEL_CMAKE.replace('set(GEMM_REPO "https://${GITHUB_ARTIFACTORY}/example/DeepGEMM")',
                                  "execute_process(COMMAND pick-a-repo OUTPUT_VARIABLE GEMM_REPO)")
    commit = _repo(tmp_path / "repo", broken)
    said: list[str] = []
    try:
        path = lock.refresh_fetch_plan_git("sglang-kernel", "0.4.10", {"repository": f"file://{tmp_path / 'repo'}",
                                           "tag": "v0.5.23", "commit": commit}, KERNEL_DIR, said.append, cuda="13.0.3")
        doc = fetchplan.load_plan_file(path)
        assert doc["git"]["commit"] == commit and doc["cuda"] == "13.0" and doc["sources"] == []
        assert "CMakeLists.txt:19: repo-deepgemm: cannot resolve GIT_REPOSITORY" in doc["unresolved"]
        assert "UNPINNED" in said[-1] and "CMakeLists.txt:19" in said[-1]

        class Pkg:  # what deps.for_package reads of a resolved package
            from builder.engines import load_knowledge
            recipe = load_knowledge().recipe("sglang-kernel", "0.4.10")
            source = type("S", (), {"kind": "git", "commit": commit})()
            deps_pins = ()
        ctx = deps.for_package(Pkg())
        assert "its CMake could not be read: CMakeLists.txt:19" in ctx["missing"]
        assert ctx["script_lines"][-1] == "'exit 1'"
    finally:
        deps._plan_doc.cache_clear()
        deps.deps_context.cache_clear()


def test_build_reads_the_plan_of_a_source_it_pins_itself(tmp_path, monkeypatch):
    """The lock knows the kernel's source only by tag (no git host at lock time); `build` resolves the tag where
    the host answers and, through the same refresh_fetch_plan_git, writes the plan of that commit: the deps stage
    then fetches every source instead of stopping. A local repository stands in for the git host."""
    import dataclasses

    from builder import render
    from builder import plan as plan_mod
    from builder.matrix import Selection, load
    from builder.lock import pin_git_sources
    from builder.resolve import select

    from tests.helpers import REPO

    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path / "plans")
    deps._plan_doc.cache_clear()
    deps.deps_context.cache_clear()
    root = tmp_path / "sglang"
    commit = _repo(root, KERNEL_CMAKE)
    _git("tag", "v0.5.23", cwd=root)
    try:
        m = load(REPO / "matrix.toml")
        (cell,) = select(m, Selection(profiles=("cu130",), engines=("sglang",)))
        packages = tuple(dataclasses.replace(p, source=dataclasses.replace(p.source, repository=f"file://{root}", commit=""))
                         if p.source.kind == "git" else p for p in cell.packages)
        cell = dataclasses.replace(cell, packages=packages)
        kernel = next(p for p in cell.packages if p.name == "sglang-kernel")
        assert any("no fetch plan" in u for u in kernel.unpinned())
        said: list[str] = []
        (pinned,) = pin_git_sources([cell], echo=said.append)
        kernel = next(p for p in pinned.packages if p.name == "sglang-kernel")
        assert kernel.source.commit == commit
        assert any(s.startswith("wrote fetch plan sglang-kernel-0.4.10.json: 3 external sources") for s in said), said
        doc = fetchplan.load_plan_file(tmp_path / "plans" / "sglang-kernel-0.4.10.json")
        assert doc["git"]["commit"] == commit and doc["cuda"] == "13.0"
        assert not [u for u in kernel.unpinned() if "no fetch plan" in u]
        text = render.render(plan_mod.plan_cells([pinned], None)[0], m.defaults["index"])
        stage = text.split("AS deps-sglang-kernel", 1)[1].split("\nFROM ", 1)[0]
        assert "'exit 1'" not in stage and "UNPINNED" not in stage and f"fetch -q --depth 1 origin {COMMIT_C}" in stage
        assert "-Ccmake.define.FETCHCONTENT_SOURCE_DIR_REPO-FLASHMLA-CUTLASS=/opt/deps/repo-flashmla/csrc/cutlass" in text
        assert "-Ccmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON" in text
    finally:
        deps._plan_doc.cache_clear()
        deps.deps_context.cache_clear()


@pytest.mark.pure
def test_a_plan_that_cannot_drive_a_sealed_compile_unpins_only_its_package(tmp_path, monkeypatch):
    """A download without URL_HASH (or without any override) cannot be fetched reproducibly ahead of the sealed
    compile: that package's deps stage stops with the reason instead of the whole render failing."""
    from builder.engines import load_knowledge

    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path)
    deps._plan_doc.cache_clear()
    deps.deps_context.cache_clear()
    tree = tmp_path / "k"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text("include(FetchContent)\nFetchContent_Declare(repo-x URL https://example/x.tgz)\n"
                                         "FetchContent_MakeAvailable(repo-x)\n")
    (tree / "pyproject.toml").write_text(PYPROJECT)
    doc = fetchplan.plan_document_from_tree(tree, engine="sglang-kernel", version="0.4.10",
                                            repository="https://example/sglang", commit="d" * 40, cuda="13.0")
    fetchplan.write_plan_file(doc, tmp_path / "sglang-kernel-0.4.10.json")

    class Pkg:
        recipe = load_knowledge().recipe("sglang-kernel", "0.4.10")
        source = type("S", (), {"kind": "git", "commit": "d" * 40})()
        deps_pins = ()
    try:
        ctx = deps.for_package(Pkg())
        assert "its plan cannot be used: repo-x: URL download without a usable URL_HASH" in ctx["missing"]
    finally:
        deps._plan_doc.cache_clear()
        deps.deps_context.cache_clear()
