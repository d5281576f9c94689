"""Compile work counted in the real build systems' own build.ninja (benchmarks/build_ninja_units.py), for the cell's
archs and for upstream's default, with no network:

- flash-attn 2.8.3: torch 2.14.0's BuildExtension and nvcc 13.0 configure the real sdist (a network namespace of
  its own). torch 2.14.0 with its CUDA 13 libraries (~4 GB) is installed once into ~/.cache/builder-bench/torch-venv.
- vLLM 0.33.0: its setup.py's CMake configure of the real sdist in the trixie devel base (GCC 14; make-local-bases.sh
  --trixie) with --network=none and builder's rendered knobs and overrides. Its fetch-plan sources live on GitHub,
  which this machine cannot reach: BUILDER_VLLM_SOURCES names a directory of checkouts, one per source named as the
  fetch plan names it (at least `cutlass`: the configure generates the Machete kernels with CUTLASS's Python
  library); every other source is a stub, which the benchmark names. torch 2.14.0 for the base's Python is
  installed once into ~/.cache/builder-bench/torch-venv-trixie.

Slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "builder-bench" / "torch-venv"


@pytest.fixture(scope="module")
def torch_python() -> str:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    ok = subprocess.run([str(python), "-c", "import torch; assert torch.__version__.split('+')[0] == '2.14.0'"],
                        capture_output=True)
    if ok.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "torch==2.14.0",
                        "setuptools==80.9.0", "wheel", "packaging", "ninja", "psutil", "einops"], check=True)
    return str(python)


def test_flash_attn_build_ninja_compiles_only_the_requested_archs(torch_python, nvcc):
    env = {**os.environ, "CUDA_HOME": str(Path(nvcc).resolve().parent.parent)}
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_ninja_units.py"), "--engine", "flash-attn",
                          "--python", torch_python, "--arch", "80,90", "--json"], capture_output=True, text=True, env=env,
                         cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout)["flash-attn 2.8.3"]
    cell, default = result["cell"], result["upstream default"]
    # every -gencode of every CUDA source targets a requested arch, SASS only
    assert cell["gencode"] == ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]
    assert cell["tus"] == default["tus"] == 72
    assert default["sass"] == ["sm_80", "sm_90", "sm_100", "sm_120"]
    assert (cell["units"], default["units"]) == (144, 288)
