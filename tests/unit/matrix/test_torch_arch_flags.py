"""Which knob selects the CUDA archs of a vLLM build — proved through torch's own CMake config.

vLLM's CMakeLists.txt (0.33.0) enables only CXX, appends `torch.utils.cmake_prefix_path` to
CMAKE_PREFIX_PATH and calls `find_package(Torch REQUIRED)`; torch's Caffe2 `public/cuda.cmake`
then runs `enable_language(CUDA)`, sets CMAKE_CUDA_ARCHITECTURES to OFF and appends its own
`-gencode` flags (from TORCH_CUDA_ARCH_LIST, else its default list) to CMAKE_CUDA_FLAGS. vLLM
pulls those flags back out (`clear_cuda_gencode_flags`) and derives CUDA_ARCHS from them.
The probe project in tests/fixtures/torch_cmake replays that sequence and prints `PROBE ...` lines.

Needs: the CUDA 13 build of torch from PyPI (multi-GB, installed once into a cached venv), a
CUDA 13 toolkit (nvcc on PATH, $CUDA_HOME, or /usr/local/cuda-13.0) and CMake >= 3.26 (pip's
`cmake`, installed into the same venv, as vLLM's build requirements do). Slow: run with
`pytest -m slow tests/unit/matrix/test_torch_arch_flags.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

# The torch of the CUDA 13 profile: SGLang 0.5.23's pin (vLLM 0.33.0 pins 2.14.0, same CUDA 13 line).
TORCH_PIN = "torch==2.14.1"
# vLLM's pyproject build-system requires cmake>=3.26.1.
CMAKE_PIN = "cmake>=3.26.1"
FIXTURE = REPO / "tests" / "fixtures" / "torch_cmake"
CUDA_FALLBACK = Path("/usr/local/cuda-13.0")


def _cache_dir() -> Path:
    base = os.environ.get("BUILDER_TEST_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "builder-tests"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def torch_venv() -> Path:
    """A venv with the CUDA 13 torch and pip's cmake, built once and kept in the cache dir."""
    venv = _cache_dir() / "torch-venv"
    py = _venv_python(venv)
    if not py.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run(
        [str(py), "-c", "import torch, sys; sys.stdout.write(torch.__version__)"],
        capture_output=True, text=True,
    )
    need = []
    if probe.returncode != 0 or not probe.stdout.startswith(TORCH_PIN.split("==")[1]):
        need.append(TORCH_PIN)
    if not (venv / "bin" / "cmake").exists():
        need.append(CMAKE_PIN)
    if need:
        subprocess.run([str(py), "-m", "pip", "install", "-q", *need], check=True)
    return venv


def _cuda_bin() -> Path:
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin")
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent)
    candidates.append(CUDA_FALLBACK / "bin")
    for c in candidates:
        if (c / "nvcc").exists() and (c.parent / "include" / "cuda_runtime.h").exists():
            return c
    pytest.skip("no CUDA toolkit with nvcc found (CUDA_HOME, PATH, /usr/local/cuda-13.0)")


def configure(venv: Path, build: Path, *, arch_list: str | None, cmake_args: list[str]) -> dict:
    """Configure the probe project; return its PROBE values plus the raw output."""
    cuda_bin = _cuda_bin()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "CUDAARCHS")}
    env["PATH"] = f"{cuda_bin}{os.pathsep}{env.get('PATH', '')}"
    env["CUDA_HOME"] = str(cuda_bin.parent)
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    cmake = venv / "bin" / "cmake"
    argv = [str(cmake), "-S", str(FIXTURE), "-B", str(build),
            f"-DPROBE_PYTHON={_venv_python(venv)}", *cmake_args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    values = {}
    for line in output.splitlines():
        m = re.match(r"^-- PROBE ([A-Z_]+)=(.*)$", line)
        if m:
            values[m.group(1)] = m.group(2).strip()
    values["_output"] = output
    # Shown with `pytest -s`: the exact lines the report quotes.
    print(f"\n$ TORCH_CUDA_ARCH_LIST={arch_list!r} cmake {' '.join(cmake_args)}")
    for line in output.splitlines():
        if line.startswith("-- PROBE ") or "Automatic GPU detection" in line:
            print(line)
    return values


def gencodes(flags: str) -> list[str]:
    return re.findall(r"-gencode arch=\S+", flags)


def test_torch_cuda_arch_list_selects_exactly_the_asked_archs(torch_venv, tmp_path):
    v = configure(torch_venv, tmp_path / "b", arch_list="8.0 9.0", cmake_args=[])
    assert v["TORCH_VERSION"].startswith("2.14")
    assert v["CMAKE_CUDA_COMPILER_VERSION"].startswith("13.")
    assert gencodes(v["CMAKE_CUDA_FLAGS"]) == [
        "-gencode arch=compute_80,code=sm_80",
        "-gencode arch=compute_90,code=sm_90",
    ]
    assert v["GENCODE"] == "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90"
    # What vLLM derives from those flags.
    assert v["CUDA_ARCHS"] == "8.0;9.0"
    # torch switches CMake's own arch handling off.
    assert v["CMAKE_CUDA_ARCHITECTURES"] == "OFF"
    assert "Automatic GPU detection failed" not in v["_output"]


def test_cmake_cuda_architectures_alone_is_reset_and_replaced_by_torch_defaults(torch_venv, tmp_path):
    v = configure(torch_venv, tmp_path / "b", arch_list=None,
                  cmake_args=["-DCMAKE_CUDA_ARCHITECTURES=80;90"])
    assert v["CMAKE_CUDA_ARCHITECTURES_IN"] == "80;90"
    # torch's cuda.cmake: "pytorch is not compatible with `CMAKE_CUDA_ARCHITECTURES` and will
    # ignore its value" -> set OFF.
    assert v["CMAKE_CUDA_ARCHITECTURES"] == "OFF"
    assert "will ignore\n  its value" in v["_output"] or "will ignore its value" in v["_output"]
    assert "Automatic GPU detection failed. Building for common architectures." in v["_output"]
    codes = gencodes(v["CMAKE_CUDA_FLAGS"])
    assert codes != ["-gencode arch=compute_80,code=sm_80", "-gencode arch=compute_90,code=sm_90"]
    # torch's default list on a machine without a GPU, with nvcc 13 (11 targets).
    assert v["CUDA_ARCHS"].split(";") == [
        "5.0", "8.0", "8.6", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0a", "12.0", "12.0a",
    ]
    assert len(codes) == 11
