"""Compile work counted in the real build systems' own build.ninja (benchmarks/build_ninja_units.py), for the cell's

The Docker half of tests/unit/builds/test_build_ninja_units.py: its docstring says the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder import deps

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def test_vllm_build_ninja_compiles_only_the_requested_archs_and_downloads_nothing(docker_engine):
    made = subprocess.run(["bash", str(REPO / "scripts" / "make-local-bases.sh"), "--trixie"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]
    where = os.environ.get("BUILDER_VLLM_SOURCES")
    if not where or not (Path(where) / "cutlass").is_dir():
        pytest.fail("BUILDER_VLLM_SOURCES must name a directory holding checkouts of vLLM 0.33.0's fetch-plan sources "
                    "(at least cutlass/; vllm-flash-attn/ for FlashAttention's own CMake), each named as "
                    "builder/data/fetchplans/vllm-0.33.0.json names it", pytrace=False)
    real = sorted(p for p in Path(where).iterdir() if p.is_dir())
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_ninja_units.py"), "--engine", "vllm",
                          "--arch", "80,90", "--json", *[f"--source={p.name}={p}" for p in real]],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(res.stdout)["vLLM 0.33.0"]
    cell, default = result["cell"], result["upstream default"]
    # every source of the committed fetch plan stood at its override, real or a named stub
    assert set(result["sources"]) == {s.name for s in deps.plan_sources("vllm", "0.33.0")}
    assert {n for n, kind in result["sources"].items() if kind.startswith("real")} == {p.name for p in real}
    assert all(kind.startswith("stub") for n, kind in result["sources"].items() if n not in {p.name for p in real})
    # the rendered knob reached vLLM's CMake, and nothing was downloaded: the container had no network, FetchContent
    # was fully disconnected and populated no sub-build
    assert "-- CUDA target architectures: 8.0;9.0" in [ln.strip() for ln in cell["status"]]
    for r in (cell, default):
        assert r["downloads"] == [] and r["disconnected"], r["downloads"]
    # every -gencode serves a requested GPU that loads its binary (arch_scoped: FA3 and FlashMLA as sm_90a only),
    # but one: vLLM's CMake builds scaled_mm_c2x for the highest of "7.5;8.0;8.7;8.9+PTX" at or below each requested
    # arch (cuda_archs_loose_intersection), so 9.0 adds sm_89 SASS, which no 8.0 or 9.0 GPU runs, beside the
    # compute_89 PTX that a 9.0 GPU JIT-compiles
    assert cell["gencode_outside"] == [
        "_C_stable_libtorch: sm_89 (csrc/quantization/w8a8/cutlass/scaled_mm_c2x.cu)"], cell["gencode_outside"]
    assert cell["sass"] == ["sm_80", "sm_89", "sm_90", "sm_90a"]
    # every SASS plan and the labels name for the cell (engine data) is really built
    assert set(result["planned_sass"]) <= set(cell["sass"]), result["planned_sass"]
    assert cell["per_target"]["_flashmla_C"]["sass"] == ["sm_90a"]
    if "vllm-flash-attn" in result["sources"] and result["sources"]["vllm-flash-attn"].startswith("real"):
        assert cell["per_target"]["_vllm_fa3_C"]["sass"] == ["sm_90a"]
        assert cell["per_target"]["_vllm_fa2_C"]["sass"] == ["sm_80"]
    # upstream's release Dockerfile list builds Blackwell and Turing code the cell does not
    assert default["knob"] == "TORCH_CUDA_ARCH_LIST=7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0"
    assert {"sm_75", "sm_100", "sm_120"} <= set(default["sass"])
    assert cell["units"] < default["units"]
