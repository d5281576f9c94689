"""The build.ninja reader of benchmarks/build_ninja_units.py on the two forms it meets: CMake's Ninja generator
(flags per edge, targets by CMakeFiles/<target>.dir) and torch's BuildExtension (cuda_cflags once). The slow
tests run it on the files the real builds write; this one pins what it counts and what it calls outside the
requested archs."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from builder.engines import recipe

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("build_ninja_units", REPO / "benchmarks" / "build_ninja_units.py")
units = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = units  # dataclasses look their module up there
_spec.loader.exec_module(units)

CMAKE = """\
include rules.ninja
build CMakeFiles/_C.dir/csrc/a.cu.o: CUDA_COMPILER___C_unscanned_RelWithDebInfo /src/csrc/a.cu || order
  DEFINES = -DX
  FLAGS = -O2 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  OBJECT_DIR = CMakeFiles/_C.dir
build CMakeFiles/_C.dir/csrc/b.cu.o: CUDA_COMPILER___C_unscanned_RelWithDebInfo /src/csrc/b.cu || order
  FLAGS = -O2 --generate-code=arch=compute_89,code=[compute_89,sm_89] -gencode arch=compute_80,code=sm_80
build CMakeFiles/_C.dir/csrc/c.cpp.o: CXX_COMPILER___C_unscanned_RelWithDebInfo /src/csrc/c.cpp || order
  FLAGS = -O2
build vllm-flash-attn/CMakeFiles/_vllm_fa3_C.dir/hopper/k.cu.o: CUDA_COMPILER___vllm_fa3_C_unscanned_RelWithDebInfo /d/k.cu
  FLAGS = -gencode arch=compute_90a,code=sm_90a
"""

TORCH = """\
cuda_cflags = -I/x -O3
cuda_post_cflags = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
build /b/x.o: cuda_compile /s/x.cu
build /b/y.o: cuda_compile /s/y.cu
build /b/z.o: compile /s/z.cpp
"""


@pytest.mark.pure
def test_cmake_form_counts_cuda_edges_by_target_and_sass_only(tmp_path):
    (tmp_path / "build.ninja").write_text(CMAKE)
    counted = units.count(tmp_path / "build.ninja")
    summary = counted.summary()
    assert summary["tus"] == 3 and summary["units"] == 2 + 2 + 1  # compute_* (PTX) is not a unit
    assert summary["per_target"] == {"_C": {"tus": 2, "units": 4, "sass": ["sm_80", "sm_89", "sm_90"]},
                                     "_vllm_fa3_C": {"tus": 1, "units": 1, "sass": ["sm_90a"]}}
    scopes = recipe("vllm", "0.33.0").arch_scoped
    # sm_89 SASS runs on no 8.0 or 9.0 GPU; its PTX does JIT-compile on 9.0; FA3's sm_90a serves 9.0, which loads it
    assert units.outside(counted, (80, 90), scopes) == ["_C: sm_89 (csrc/b.cu)"]
    # asked for 8.0 alone: PTX of a later arch does not load on 8.0 either, and FA3 is loaded on 9.0 only
    assert units.outside(counted, (80,), scopes) == [
        "_C: compute_89 (csrc/b.cu)", "_C: compute_90 (csrc/a.cu)", "_C: sm_89 (csrc/b.cu)", "_C: sm_90 (csrc/a.cu)",
        "_vllm_fa3_C: sm_90a (hopper/k.cu)"]


@pytest.mark.pure
def test_buildextension_form_takes_the_global_cuda_flags(tmp_path):
    (tmp_path / "build.ninja").write_text(TORCH)
    summary = units.count(tmp_path / "build.ninja").summary()
    assert (summary["tus"], summary["units"], summary["sass"]) == (2, 4, ["sm_80", "sm_90"])
    assert summary["gencode"] == ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]
    assert list(summary["per_target"]) == ["extension"]


def test_a_local_simple_index_is_given_to_the_venvs_container_with_the_files_it_links_to(tmp_path, monkeypatch):
    """This machine's pip reads `file:///…/simple` indexes whose pages link `../files/…`: the container that installs
    the benchmark's torch venv gets the index's parent, not only `simple/` (where pip found the page, then failed on
    the wheel: "No such file or directory: '/opt/pypi/files/ninja-…whl'")."""
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "pypi" / "files").mkdir()
    (tmp_path / "wheels").mkdir()
    listed = (f"global.extra-index-url='file://{tmp_path}/pypi/simple'\nglobal.find-links='{tmp_path}/wheels'\n"
              "global.cert='/nonexistent/ca.crt'\n")

    class Listed:
        stdout = listed

    monkeypatch.setattr(units.subprocess, "run", lambda *a, **k: Listed())
    env, mounts = units._pip_passthrough()
    assert env["PIP_EXTRA_INDEX_URL"] == f"file://{tmp_path}/pypi/simple"
    assert set(mounts) == {str(tmp_path / "pypi"), str(tmp_path / "wheels")}  # a missing path is not mounted
    assert all(m == {"bind": host, "mode": "ro"} for host, m in mounts.items())
