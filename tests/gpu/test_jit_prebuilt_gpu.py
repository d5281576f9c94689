"""On a real GPU: what a prebuilt FlashInfer module saves at the first request, the way the H200 test host measured
it (tests/fixtures/gpu-host/h200-2026-12-01-jit-prebuilt/NOTES.md). No Docker there: the interpreter with torch and
FlashInfer is BUILDER_FLASHINFER_PYTHON (default python3; after `scripts/gpu-host-run install vllm-0.26.0` and
`... install flashinfer-0.6.14`: /tmp/builder-carry/py-vllm-0.26.0 with the FlashInfer site on PYTHONPATH).

- the module alone (benchmarks/flashinfer_first_call.py): the first call of FlashInfer's FP8 block-scale GEMM in an
  empty workspace JIT-builds it; after the prebuild (the generator and its build method, as `jit = "prebuilt"` runs
  them at image-build time) the first call builds nothing and gives the same result;
- the engine's first boot (benchmarks/jit_first_boot.py, slow: three boots of vLLM with the tiny FP8 model).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from builder.deploy.runtime import gpus

from tests.helpers import REPO

_HOST = gpus.read()
HAVE_GPU, NO_GPU, _ARCH = _HOST.present, _HOST.why_none, _HOST.arch
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU and NO_GPU.startswith("this host has no NVIDIA GPU"), reason=f"skipped because {NO_GPU}"),
]


def _python() -> str:
    if not HAVE_GPU:  # nvidia-smi is there but fails: a broken driver is no reason to skip
        pytest.fail(f"nvidia-smi is on PATH but does not work: {NO_GPU}")
    python = os.environ.get("BUILDER_FLASHINFER_PYTHON", "python3")
    found = subprocess.run([python, "-c", "import flashinfer, torch; print(flashinfer.__version__)"], capture_output=True,
                           text=True)
    if found.returncode != 0:
        pytest.fail(f"{python} cannot import flashinfer and torch ({(found.stdout + found.stderr).strip()[-300:]}): "
                    "point BUILDER_FLASHINFER_PYTHON at an environment that has them")
    return python


def _first_call(python: str, mode: str, workspace, arch: str | None) -> dict:
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(workspace)}
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    if arch:
        env["FLASHINFER_CUDA_ARCH_LIST"] = arch
    res = subprocess.run([python, str(REPO / "benchmarks" / "flashinfer_first_call.py"), mode], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=1200)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_prebuilt_fp8_blockscale_module_is_loaded_not_built_at_the_first_call(tmp_path):
    if _ARCH != 90:
        pytest.skip(f"skipped because FlashInfer's fp8_blockscale_gemm_sm90 runs only on sm_90 (this GPU: {_ARCH})")
    python = _python()
    cold = _first_call(python, "run", tmp_path / "cold", "9.0")
    built = _first_call(python, "prebuild", tmp_path / "prebuilt", "9.0")
    warm = _first_call(python, "run", tmp_path / "prebuilt", None)  # the GPU's own arch, as the engine reads it
    print(f"\ncold first call {cold['first_call_s']} s; prebuild {built['seconds']} s ({built['bytes']} bytes); "
          f"prebuilt first call {warm['first_call_s']} s")
    assert built["bytes"] > 0 and warm["first_call_s"] < cold["first_call_s"] / 10
    assert cold["max_rel_err"] < 0.1 and warm["max_rel_err"] == cold["max_rel_err"]


@pytest.mark.slow
def test_a_prebuilt_module_shortens_the_engines_first_boot():
    """Three boots of vLLM 0.26.0 (the GPU-host bundles installed); see benchmarks/jit_first_boot.py."""
    _python()
    res = subprocess.run(["python3", str(REPO / "benchmarks" / "jit_first_boot.py"), "--bundle", "vllm-0.26.0",
                          "--with", "flashinfer-0.6.14", "--phases", "jit,prebuilt"],
                         capture_output=True, text=True, cwd=REPO, timeout=3000)
    print(res.stdout[-4000:])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
