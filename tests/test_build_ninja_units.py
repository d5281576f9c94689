"""Compile work counted in flash-attn 2.8.3's own build.ninja (benchmarks/build_ninja_units.py): torch 2.14.0's
BuildExtension and nvcc 13.0 configure the real sdist, with no network (a network namespace of its own), for the
cell's archs and for upstream's default. Slow: torch 2.14.0 with its CUDA 13 libraries (~4 GB) is installed once
into ~/.cache/builder-bench/torch-venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

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
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_ninja_units.py"), "--python", torch_python,
                          "--arch", "80,90", "--json"], capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(res.stdout)
    cell, default = result["cell"], result["upstream default"]
    # every -gencode of every CUDA source targets a requested arch, SASS only
    assert cell["gencode"] == ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]
    assert cell["tus"] == default["tus"] == 72
    assert default["sass"] == ["sm_80", "sm_90", "sm_100", "sm_120"]
    assert (cell["units"], default["units"]) == (144, 288)
