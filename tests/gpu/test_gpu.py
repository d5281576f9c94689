"""On a real GPU: the fixture wheel built with --arch 80 runs exactly where the audit predicts (on sm_8x; it
fails on sm_90 and newer), and the one built with --arch 80,90 runs and returns the right numbers.

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

from tests.helpers import REPO


def gpu_arch() -> tuple[int | None, str]:
    """(compute capability of GPU 0 as 90, 80..., "") or (None, why there is none).

    Like `builder doctor`: no nvidia-smi means no GPU; an nvidia-smi that fails is a broken driver, not a
    reason to skip (why starts with "BROKEN")."""
    if not shutil.which("nvidia-smi"):
        return None, "nvidia-smi not found"
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        return None, f"BROKEN: nvidia-smi exits {out.returncode}: {(out.stderr or out.stdout).strip()[:500]}"
    if not out.stdout.strip():
        return None, "nvidia-smi lists none"
    major, minor = out.stdout.splitlines()[0].strip().split(".")
    return int(major) * 10 + int(minor), ""


ARCH, NO_GPU = gpu_arch()
pytestmark = [
    pytest.mark.gpu,
    # without carried wheels the fixture package is built here: pip in BuildKit reads the package index
    *([] if os.environ.get("BUILDER_FIXTURE_WHEELS") else [pytest.mark.network]),
    pytest.mark.skipif(ARCH is None and not NO_GPU.startswith("BROKEN"),
                       reason=f"skipped because this host has no NVIDIA GPU ({NO_GPU})"),
]


@pytest.fixture(autouse=True)
def working_gpu() -> None:
    if ARCH is None:  # only reached when nvidia-smi is there but fails
        pytest.fail(f"nvidia-smi is on PATH but does not work ({NO_GPU}): fix the driver (see `builder doctor`)")


def fixture_wheel(archs: str, tmp: Path, request: pytest.FixtureRequest) -> Path:
    carried = os.environ.get("BUILDER_FIXTURE_WHEELS")
    if carried:
        wheels = sorted((Path(carried) / ("sm" + archs.replace(",", "."))).glob("*.whl"))
        assert len(wheels) == 1, f"expected one wheel under {carried}/sm{archs.replace(',', '.')}"
        return wheels[0]
    request.getfixturevalue("docker_engine")  # `builder build` needs the daemon: fail (never skip) without it
    wh = tmp / "wheelhouse"
    subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(REPO / "tests/fixtures/cuda-ext/matrix.toml"),
                    "--arch", archs, "--wheelhouse", str(wh), "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"),
                    "--quiet"], check=True)
    wheels = sorted(wh.glob("cuda-ext/*/*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


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


def test_sm80_only_wheel_runs_exactly_where_the_audit_says(tmp_path, request):
    wheel = fixture_wheel("80", tmp_path, request)
    report = audit(wheel, [ARCH])  # the prediction, from the fatbin alone
    res = run_saxpy(wheel, tmp_path)
    print(res.stdout, res.stderr)
    if ARCH // 10 == 8:  # sm_80 SASS runs on every 8.x GPU
        assert report.ok
        assert res.returncode == 0 and "checked 1048576 mismatches 0" in res.stdout, res.stdout + res.stderr
    else:
        assert not report.ok
        assert res.returncode != 0
        assert "no kernel image is available for execution on the device" in (res.stdout + res.stderr)


def test_sm80_sm90_wheel_runs_and_computes(tmp_path, request):
    wheel = fixture_wheel("80,90", tmp_path, request)
    assert audit(wheel, [ARCH]).ok
    res = run_saxpy(wheel, tmp_path)
    print(res.stdout, res.stderr)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "checked 1048576 mismatches 0" in res.stdout
