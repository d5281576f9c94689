"""On a real GPU: the fixture wheel built with --arch 80 fails on sm_90 exactly as the audit predicts,
and the one built with --arch 80,90 runs and returns the right numbers.

The wheels come from `builder build` (Docker). A GPU host without Docker gets them carried over:
BUILDER_FIXTURE_WHEELS=DIR with DIR/sm80/*.whl and DIR/sm80.90/*.whl.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.audit import audit

REPO = Path(__file__).resolve().parent.parent


def gpu_arch() -> int | None:
    """The compute capability of GPU 0 as 90, 80..., or None without an NVIDIA GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        return None
    major, minor = out.stdout.splitlines()[0].strip().split(".")
    return int(major) * 10 + int(minor)


ARCH = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ARCH is None, reason="skipped because this host has no NVIDIA GPU (nvidia-smi finds none)"),
]


def fixture_wheel(archs: str, tmp: Path) -> Path:
    carried = os.environ.get("BUILDER_FIXTURE_WHEELS")
    if carried:
        wheels = sorted((Path(carried) / ("sm" + archs.replace(",", "."))).glob("*.whl"))
        assert len(wheels) == 1, f"expected one wheel under {carried}/sm{archs.replace(',', '.')}"
        return wheels[0]
    wh = tmp / "wheelhouse"
    subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(REPO / "tests/fixtures/cuda-ext/matrix.toml"),
                    "--arch", archs, "--wheelhouse", str(wh), "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"),
                    "--quiet"], check=True)
    return next(wh.glob("cuda-ext/*/*.whl"))


def run_saxpy(wheel: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Import the package from the unpacked wheel in a fresh interpreter and run the kernel on 1M floats."""
    dest = tmp / wheel.stem
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    code = (
        "import ctypes, ctypes.util, os, glob, sys\n"
        # libcudart.so.13: the CUDA toolkit's or the nvidia-cuda-runtime wheel's
        "cands = glob.glob('/usr/local/cuda*/lib64/libcudart.so.13*') + "
        "glob.glob(os.path.join(sys.prefix, 'lib/python*/site-packages/nvidia/cu13/lib/libcudart.so.13'))\n"
        "ctypes.CDLL(cands[0] if cands else 'libcudart.so.13', mode=ctypes.RTLD_GLOBAL)\n"
        "import cuda_ext\n"
        "n = 1 << 20\n"
        "x = [float(i % 1000) for i in range(n)]\n"
        "y = [1.0] * n\n"
        "out = cuda_ext.saxpy(3.0, x, y)\n"
        "bad = [i for i in range(n) if out[i] != 3.0 * x[i] + 1.0]\n"
        "print('checked', n, 'mismatches', len(bad), 'sample', out[:3], out[-1])\n"
        "sys.exit(1 if bad else 0)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=dest,
                          env={**os.environ, "PYTHONPATH": str(dest)})


def test_sm80_only_wheel_fails_on_this_gpu_as_the_audit_predicts(tmp_path):
    if ARCH // 10 == 8:
        pytest.skip(f"skipped because this GPU is sm_{ARCH}: sm_80 SASS runs on it, there is nothing to fail")
    wheel = fixture_wheel("80", tmp_path)
    report = audit(wheel, [ARCH])
    assert not report.ok  # the prediction, from the fatbin alone
    res = run_saxpy(wheel, tmp_path)
    print(res.stdout, res.stderr)
    assert res.returncode != 0
    assert "no kernel image is available for execution on the device" in (res.stdout + res.stderr)


def test_sm80_sm90_wheel_runs_and_computes(tmp_path):
    wheel = fixture_wheel("80,90", tmp_path)
    assert audit(wheel, [ARCH]).ok
    res = run_saxpy(wheel, tmp_path)
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "checked 1048576 mismatches 0" in res.stdout
