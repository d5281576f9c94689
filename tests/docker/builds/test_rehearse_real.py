"""Real engine translation units compiled and measured (benchmarks/rehearse_units.py, builder/rehearse.py's
measurement) for --arch 80,90 in the trixie devel base (GCC 14, nvcc 13.0.88) with no network: vLLM 0.33.0 from its
PyPI sdist (a CUTLASS 3.x sm90 GEMM, an attention kernel, a small one), flash-attn 2.8.3 from its sdist (a forward
split and a backward kernel for head dim 128). Each unit's object must carry exactly the SASS its command asks for,
within the plan's.

vLLM's fetch-plan sources live on GitHub: BUILDER_VLLM_SOURCES names a directory of checkouts (cutlass/ at least:
the sm90 GEMM includes it), as tests/docker/builds/test_build_ninja_units.py takes them. torch 2.14.0 for the base's Python is
installed once into ~/.cache/builder-bench/torch-venv-trixie. Slow: the sm90 GEMM takes minutes and GBs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def _bases():
    made = subprocess.run(["bash", str(REPO / "scripts" / "make-local-bases.sh"), "--trixie"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-3000:]


def _run(*args: str) -> dict:
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rehearse_units.py"), *args, "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=5400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(res.stdout)


def _check(unit: dict, sass: list[str]) -> None:
    assert unit["returncode"] == 0 and not unit["oom_killed"], unit
    assert unit["sass"] == unit["object_sass"] == sass and unit["audit_ok"], unit
    assert unit["seconds"] > 1 and unit["peak_mib"] > 100, unit


def test_vllm_units_compile_with_the_builds_own_commands(docker_engine):
    _bases()
    where = os.environ.get("BUILDER_VLLM_SOURCES")
    if not where or not (Path(where) / "cutlass").is_dir():
        pytest.fail("BUILDER_VLLM_SOURCES must name a directory holding a checkout of CUTLASS (cutlass/, vLLM "
                    "0.33.0's fetch plan pins v4.7.1)", pytrace=False)
    out = _run("--engine", "vllm", "--source", f"cutlass={Path(where) / 'cutlass'}", "--arch", "80,90", "--only-listed",
               "--unit", "csrc/activation_kernels.cu", "--unit", "attention/merge_attn_states.cu",
               "--unit", "c3x/scaled_mm_sm90_fp8.cu")
    by_name = {Path(u["source"]).name: u for u in out["units"]}
    small, attention, gemm = (by_name[n] for n in ("activation_kernels.cu", "merge_attn_states.cu",
                                                    "scaled_mm_sm90_fp8.cu"))
    _check(small, ["sm_80", "sm_90"])
    _check(attention, ["sm_80", "sm_90"])
    _check(gemm, ["sm_90a"])  # CUTLASS 3.x sm90 kernels: 9.0a only, in _C_stable_libtorch
    assert gemm["binary"] == "_C_stable_libtorch"
    assert gemm["seconds"] > small["seconds"] and gemm["peak_mib"] > small["peak_mib"]
    proj = out["projection"]
    assert proj["projected_seconds"] > gemm["seconds"] and proj["kernel_arch_units"] > 100


def test_flash_attn_units_compile_with_the_builds_own_commands(docker_engine):
    _bases()
    out = _run("--engine", "flash-attn", "--arch", "80,90", "--only-listed",
               "--unit", "flash_fwd_split_hdim128_bf16_sm80.cu", "--unit", "flash_bwd_hdim128_bf16_sm80.cu")
    by_name = {Path(u["source"]).name: u for u in out["units"]}
    fwd, bwd = by_name["flash_fwd_split_hdim128_bf16_sm80.cu"], by_name["flash_bwd_hdim128_bf16_sm80.cu"]
    for u in (fwd, bwd):
        _check(u, ["sm_80", "sm_90"])
    assert bwd["peak_mib"] > fwd["peak_mib"] * 0.5
    proj = out["projection"]
    assert proj["tus"] == 72 and proj["kernel_arch_units"] == 144
    assert proj["projected_seconds"] > bwd["seconds"]
