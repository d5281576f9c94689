"""The runtime's JIT toolchain: what vLLM 0.33 / SGLang 0.5.23 need to compile kernels at first use, and what it costs.

vLLM 0.33.0 turns FlashInfer off when neither flashinfer-cubin nor nvcc (CUDA_HOME/bin) plus ninja is there
(vllm/utils/flashinfer.py has_flashinfer()), and DeepGEMM, TileLang and FlashInfer's JIT need nvcc, its headers
and a host compiler at run time. Engine data `runtime_jit` gives those cells the CUDA table's pieces: g++ from
the distribution, nvcc + headers from PyPI (the cuda-toolkit version torch 2.14 itself pins) and ninja.

- docker (slow: ~400 MB of downloads): the rendered runtime stage's own JIT instructions on the local CUDA 13
  base compile and link a kernel with the nvcc they install; the size they add is measured and printed.
- slow: vLLM 0.33.0 from PyPI in a venv (~10 GB): its own has_flashinfer() is False without that toolchain and
  True with exactly the pieces the runtime installs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runtime_jit import vllm_cell

pytestmark = pytest.mark.slow


VENV = Path(os.environ.get("BUILDER_TEST_CACHE", Path.home() / ".cache" / "builder-tests")) / "venv-vllm-0.33.0"


def test_vllm_0_33_sees_flashinfer_only_with_the_runtime_jit_toolchain(tmp_path):
    """vLLM's own has_flashinfer() in a venv with vLLM 0.33.0 from PyPI (its flashinfer-python, no flashinfer-cubin):
    False with no nvcc, True with the runtime_jit pip pieces as CUDA_HOME and ninja on PATH."""
    m, cell, _ = vllm_cell()
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "vllm==0.33.0", *cell.runtime_jit["pip"]], check=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    cuda_home = Path(site) / cell.runtime_jit["root"]
    empty = tmp_path / "bin"
    empty.mkdir()
    probe = "import json; from vllm.utils.flashinfer import has_flashinfer; print(json.dumps(has_flashinfer()))"

    def has(env: dict) -> bool:
        out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True,
                             env={"HOME": str(tmp_path), **env})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert (cuda_home / "bin" / "nvcc").is_file()
    assert has({"CUDA_HOME": str(tmp_path / "none"), "PATH": str(empty)}) is False
    assert has({"CUDA_HOME": str(cuda_home), "PATH": str(empty)}) is False  # nvcc, but no ninja
    assert has({"CUDA_HOME": str(cuda_home), "PATH": str(VENV / "bin")}) is True
    assert re.search(r"ninja", " ".join(cell.runtime_jit["pip"]))
