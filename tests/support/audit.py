"""What the two halves of test_audit.py share: tests/unit/builds/test_audit.py (its tests that need no Docker) and
tests/docker/builds/test_audit.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.audit import FatbinEntry

from tests.helpers import KERNEL_A

S = lambda arch, variant="", compressed=False: FatbinEntry("sass", arch, variant, compressed)
P = lambda arch, variant="", compressed=True: FatbinEntry("ptx", arch, variant, compressed)


# --------------------------------------------------------------------------- tools


@pytest.fixture(scope="session")
def host_cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("c++")
    if cc is None:
        pytest.fail("no host C compiler (cc, gcc) on PATH: needed to link the test libraries")
    return cc


# --------------------------------------------------------------------------- compiled fixtures

KERNEL_B = r"""
extern "C" __global__ void shift(float *x, float b) { x[threadIdx.x] += b; }
extern "C" void launch_shift(float *x, float b) { shift<<<1, 32>>>(x, b); }
"""
HOST_ONLY_C = "int answer(void) { return 42; }\n"


def _gencode(arch: str, code: str) -> list[str]:
    return ["-gencode", f"arch={arch},code={code}"]


# name -> (nvcc flags, entries expected in the shared library built from one object)
SINGLE = {
    "sm80": (_gencode("compute_80", "sm_80"), [S(80)]),
    "sm80_sm90": (_gencode("compute_80", "sm_80") + _gencode("compute_90", "sm_90"), [S(80), S(90)]),
    "ptx80": (_gencode("compute_80", "compute_80"), [P(80)]),
    "ptx80_nocompress": (_gencode("compute_80", "compute_80") + ["--no-compress"], [P(80, compressed=False)]),
    "sm80_compress_all": (_gencode("compute_80", "sm_80") + ["-Xfatbin", "-compress-all"], [S(80, compressed=True)]),
    "sm90a": (_gencode("compute_90a", "sm_90a"), [S(90, "a")]),
    "ptx90a": (_gencode("compute_90a", "compute_90a"), [P(90, "a")]),
    "sm100f": (_gencode("compute_100f", "[sm_100f,compute_100f]"), [S(100, "f"), P(100, "f")]),
}


@dataclass
class Built:
    root: Path
    libs: dict[str, Path]  # every binary built, by name

    def __getitem__(self, name: str) -> Path:
        return self.libs[name]


def _run(argv: list, cwd: Path) -> None:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} failed:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def built(tmp_path_factory, nvcc, host_cc) -> Built:
    root = tmp_path_factory.mktemp("cuda")
    (root / "a.cu").write_text(KERNEL_A)
    (root / "b.cu").write_text(KERNEL_B)
    (root / "host.c").write_text(HOST_ONLY_C)
    cflags = ["-Xcompiler", "-fPIC"]
    libs: dict[str, Path] = {}

    def single(name: str) -> None:  # nvcc -c, then a plain host link: one fatbin container
        flags = SINGLE[name][0]
        _run([nvcc, "-c", *cflags, *flags, "-o", f"{name}.o", "a.cu"], root)
        _run([host_cc, "-shared", "-o", f"lib{name}.so", f"{name}.o"], root)
        libs[name] = root / f"lib{name}.so"

    def nvcc_shared(name: str, flags: list[str], sources: list[str]) -> None:
        # nvcc links shared libraries through a device-link step: one more container
        _run([nvcc, "-shared", *cflags, *flags, "-o", f"lib{name}.so", *sources], root)
        libs[name] = root / f"lib{name}.so"

    def obj(name: str, flags: list[str]) -> None:
        _run([nvcc, "-c", *cflags, *flags, "-o", f"{name}.o", "a.cu"], root)
        libs[name] = root / f"{name}.o"

    def host_only() -> None:
        _run([host_cc, "-shared", "-fPIC", "-o", "libhost.so", "host.c"], root)
        libs["host_only"] = root / "libhost.so"

    both = _gencode("compute_80", "sm_80") + _gencode("compute_90", "sm_90")
    jobs = [lambda n=n: single(n) for n in SINGLE] + [
        lambda: nvcc_shared("shared_two_sources", both, ["a.cu", "b.cu"]),
        lambda: nvcc_shared("shared_ptx80", _gencode("compute_80", "compute_80"), ["a.cu"]),
        lambda: nvcc_shared("shared_rdc", ["-rdc=true", *_gencode("compute_80", "[sm_80,compute_80]")], ["a.cu"]),
        lambda: obj("rdc_obj", ["-rdc=true", *_gencode("compute_80", "[sm_80,compute_80]")]),
        lambda: obj("lto_obj", ["-rdc=true", *_gencode("compute_80", "lto_80"), *_gencode("compute_90", "sm_90")]),
        host_only,
    ]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        for f in [pool.submit(j) for j in jobs]:
            f.result()
    return Built(root, libs)


LINKER_SCRIPT = b"/* GNU ld script */\nINPUT(-lfoo)\n"
