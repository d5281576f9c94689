"""Git sources against a local repository with SGLang's layout (GitHub cannot be reached here).

SGLang >= 0.5.11 and sglang-kernel publish no sdist: builder builds them from the git repository at the release
commit. What breaks such a build is the layout, so the repository made here reproduces it (the real check needs
the git host: see docs/testing.md):

- python/pyproject.toml takes its version from git through setuptools-scm ([tool.setuptools_scm] root "..",
  version_file, fallback_version "0.0.0.dev0"), and the build fetches one commit with depth 1 and no tags: the
  rendered build stage must pretend the pinned version, and its wheel check must refuse a dev-version wheel;
- python/sglang/kernels/aot/ (sgl-kernel/ up to sglang-kernel 0.4.5) is a scikit-build-core project whose
  CMakeLists and cmake/*.cmake FetchContent-download its dependencies by URL with a hash: `builder lock` reads them
  at the locked commit into a fetch plan, the deps stage fetches them, and the compile is pointed at the checkouts
  through FETCHCONTENT_SOURCE_DIR_<NAME> as -Ccmake.define.

The Docker test runs the real rendered SGLang 0.5.23 stages (source-git, build-sglang, wheels-sglang) with the
repository URL and commit of the local repository, no torch (the stand-in has no extension) and no Rust toolchain
(rustup's server is unreachable here).
"""

from __future__ import annotations

import hashlib

import pytest

from builder import deps, fetchplan, lock, plan, render
from builder.engines import recipe
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX
from tests.support import git_source as support
from tests.support.git_source import CUTLASS_TGZ, KERNEL_DIR, VERSION

# fixtures shared with the other half, found by pytest under these names
repo = support.repo


# --------------------------------------------------------------------------- lock: the fetch plan of a git source


def test_lock_reads_a_git_sources_fetch_plan_at_the_locked_commit(repo, tmp_path, monkeypatch):
    root, commit = repo
    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path)
    deps._plan_doc.cache_clear()
    deps.deps_context.cache_clear()
    said: list[str] = []
    git_entry = {"repository": f"file://{root}", "tag": f"v{VERSION}", "commit": commit}
    subdir = recipe("sglang-kernel", "0.4.10").source_subdir  # what `builder lock` hands it (lock.run_lock)
    assert subdir == KERNEL_DIR
    try:
        path = lock.refresh_fetch_plan_git("sglang-kernel", "0.4.10", git_entry, subdir, said.append)
        assert path == tmp_path / "sglang-kernel-0.4.10.json", said
        doc = fetchplan.load_plan_file(path)
        assert doc["git"] == {"repository": f"file://{root}", "commit": commit, "subdir": KERNEL_DIR}
        # scikit-build-core: the overrides reach CMake as pip config settings
        assert doc["cmake_args"] == "scikit-build-core"
        by_name = {s["name"]: s for s in doc["sources"]}
        assert set(by_name) == {"repo-cutlass", "repo-fmt"}
        cutlass = by_name["repo-cutlass"]
        assert cutlass["kind"] == "url" and cutlass["reproducible"]
        assert cutlass["url_hash"] == f"SHA256={hashlib.sha256(CUTLASS_TGZ).hexdigest()}"
        assert cutlass["override_var"] == "FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS" and cutlass["override_builtin"]
        # read from the included cmake/ file, named relative to the kernel's directory
        assert (by_name["repo-fmt"]["cmake_file"], by_name["repo-cutlass"]["cmake_file"]) == \
            ("cmake/flashmla.cmake", "CMakeLists.txt")

        ctx = deps.deps_context("sglang-kernel", "0.4.10")
        assert ctx["missing"] == "" and ctx["env"] == []
        assert ctx["cmake_defines"] == [("FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS", "/opt/deps/repo-cutlass"),
                                        ("FETCHCONTENT_SOURCE_DIR_REPO-FMT", "/opt/deps/repo-fmt"),
                                        # and FetchContent downloads nothing itself (the compile RUN has no network)
                                        ("FETCHCONTENT_FULLY_DISCONNECTED", "ON")]
        script = "\n".join(ctx["script_lines"])
        assert "sha256sum -c -" in script and "553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28" in script
        # the same commit again: the plan is kept, nothing fetched
        assert lock.refresh_fetch_plan_git("sglang-kernel", "0.4.10", git_entry, subdir, said.append) == path
    finally:
        deps._plan_doc.cache_clear()
        deps.deps_context.cache_clear()


@pytest.mark.pure
def test_a_git_source_without_a_readable_plan_is_unpinned_and_its_deps_stage_stops(repo, tmp_path, monkeypatch):
    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path)
    said: list[str] = []
    unknown = {"repository": "https://github.com/sgl-project/sglang", "tag": "v0.5.23", "commit": ""}
    assert lock.refresh_fetch_plan_git("sglang-kernel", "0.4.10", unknown, KERNEL_DIR, said.append) is None
    assert "commit of v0.5.23 is unknown" in said[-1]
    m = load(MATRIX)
    (cell,) = select(m, Selection(profiles=("cu130",), engines=("sglang",)))
    kernel = next(p for p in cell.packages if p.name == "sglang-kernel")
    assert any("no fetch plan" in u for u in kernel.unpinned())
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    stage = text.split("AS deps-sglang-kernel", 1)[1].split("\nFROM ", 1)[0]
    assert "'exit 1'" in stage and "UNPINNED: sglang-kernel 0.4.10: no fetch plan" in text


@pytest.mark.pure
def test_the_kernels_directory_follows_the_tag_that_carries_it(tmp_path):
    """sglang-kernel 0.4.5 is in sgl-kernel/ at SGLang v0.5.16 and in python/sglang/kernels/aot/ at v0.5.17 (both
    tags pin it; read in the tags' trees, engine data tag_subdirs); 0.4.6.post1 (v0.5.18) is in aot/. The lock and
    the cell take the directory of the tag they build from."""
    kernel = recipe("sglang-kernel", "0.4.5")
    assert kernel.subdir_at("v0.5.16") == "sgl-kernel"
    assert kernel.subdir_at("v0.5.17") == KERNEL_DIR
    assert recipe("sglang-kernel", "0.4.6.post1").subdir_at("v0.5.18") == KERNEL_DIR
    assert recipe("sglang-kernel", "0.4.4").subdir_at("v0.5.17") == "sgl-kernel"  # only the tag named moves
    m = load(write_matrix_with_sglang(tmp_path, "0.5.17", "0.4.5"))
    (cell,) = select(m, Selection(engines=("sglang",)))
    assert next(p for p in cell.packages if p.name == "sglang-kernel").source.subdir == KERNEL_DIR


def write_matrix_with_sglang(tmp_path, sglang: str, kernel: str):
    (tmp_path / "matrix.toml").write_text(
        '[defaults]\nprofile = "p"\narchs = [90]\nregistry = "127.0.0.1:5000/t"\n'
        '[profiles.p]\ncuda = "13.0.3"\nos = "ubuntu24.04"\npython = "3.12"\ntorch = "2.11.0"\n'
        f'engines = {{ sglang = "{sglang}" }}\nstrategies = []\n')
    (tmp_path / "matrix.lock").write_text(
        'format = 1\nindex = "https://pypi.org/simple"\n'
        f'[packages."sglang=={sglang}"]\nrequires_python = ">=3.10"\ntorch = "2.11.0"\n'
        f'[packages."sglang=={sglang}".pins]\nsglang-kernel = "{kernel}"\n'
        f'[packages."sglang=={sglang}".git]\nrepository = "https://github.com/sgl-project/sglang"\n'
        f'tag = "v{sglang}"\ncommit = "{"2" * 40}"\n'
        f'[packages."sglang-kernel=={kernel}".git]\nrepository = "https://github.com/sgl-project/sglang"\n'
        f'tag = "v{sglang}"\ncommit = "{"2" * 40}"\n')
    return tmp_path / "matrix.toml"
