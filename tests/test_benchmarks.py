"""Benchmarks cannot rot: every script in benchmarks/ runs here in its quick mode and must print its figure. The ones
that need minutes (builds, compiles) are slow; tests/test_build_ninja_units.py runs build_ninja_units.py (slow:
a torch venv and the vLLM configure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO

BENCHMARKS = REPO / "benchmarks"
NUMBER = r"[0-9]+(?:\.[0-9]+)?"

# script -> (arguments, the figure line it must print, marks)
QUICK = {
    "plan_speed.py": (["--quick"], rf"builder plan --profile all \(\d+ cells\): median {NUMBER} ms, max {NUMBER} ms over 1 runs",
                      []),
    "hardening.py": (["--quick"], r"inputs tried +\d+\n  clear +\d+ .*\n  misleading +0\n  tracebacks +0\n  silently accepted +0",
                     []),
    "redact.py": (["--quick"], rf"redact \d+ MB: slowest shape {NUMBER} s CPU \(goal < 1 s\); the old expressions on \d+ KB: "
                               rf"slowest (> )?{NUMBER} s", []),
    "compile_units.py": (["--quick"], r"flash-attn 2\.8\.3\.post2 \(\d+ CUDA sources\) for sm_80, sm_90: \d+ kernel×arch units built "
                                      rf"of \d+ for setup\.py's default arch list \({NUMBER} %\)", [pytest.mark.network]),
    "build_overhead.py": (["--quick"], rf"median builder build {NUMBER} s, raw docker buildx build {NUMBER} s, overhead "
                                       rf"ratio {NUMBER}x over 1 round", [pytest.mark.slow, pytest.mark.docker]),
    "image_size.py": ([], rf"pull size runtime {NUMBER} MB vs devel {NUMBER} MB = {NUMBER}%", [pytest.mark.slow, pytest.mark.docker]),
    "cache_warm_cold.py": (["--quick"], rf"warm remote  build +{NUMBER} s   wheel step .*% of the cold compile(.|\n)*"
                                        rf"64 MB-class artifact", [pytest.mark.slow, pytest.mark.docker]),
    # its exit status also says whether its speed goals were met: a figure, not what this test checks
    "compile_cache.py": (["--quick"], rf"key change: {NUMBER} % hits \(goal >= 95 %\)(.|\n)*(goals met|GOALS NOT MET)",
                         [pytest.mark.slow, pytest.mark.docker]),
    "jit_modules.py": (["--quick"], rf"jit = prebuilt: \+{NUMBER} MiB image, build {NUMBER} s after the first-request "
                                   rf"cell's {NUMBER} s", [pytest.mark.slow, pytest.mark.docker]),
    "registry_reuse.py": (["--quick"], rf"registry reuse: median {NUMBER} s wall \(image step {NUMBER} s, pull included\), "
                                       rf"fresh build {NUMBER} s wall \(image step {NUMBER} s\), over 1 round",
                          [pytest.mark.slow, pytest.mark.docker]),
    "sccache_dist.py": (["--quick"], rf"distributed: {NUMBER}s, \d+ steps compiled on the servers(.|\n)*both servers compiled",
                        [pytest.mark.slow, pytest.mark.toolchain]),
}
ELSEWHERE = {"build_ninja_units.py": "test_build_ninja_units.py", "rehearse_units.py": "test_rehearse_real.py",
             # GPU hosts only (FlashInfer's sm_90 module, an engine's boots)
             "flashinfer_first_call.py": "test_jit_prebuilt_gpu.py", "jit_first_boot.py": "test_jit_prebuilt_gpu.py"}
GOALS_IN_EXIT_STATUS = {"compile_cache.py"}  # exit 1 = a speed goal missed on this host, the figures printed


@pytest.mark.pure
def test_every_benchmark_script_is_run_by_the_suite():
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(QUICK) | set(ELSEWHERE)
    for script, test in ELSEWHERE.items():
        assert f'"benchmarks" / "{script}"' in (REPO / "tests" / test).read_text(), (script, test)


@pytest.mark.parametrize("script", [pytest.param(s, marks=QUICK[s][2], id=s.removesuffix(".py")) for s in QUICK])
def test_the_benchmark_prints_its_figure(script):
    args, figure, _ = QUICK[script]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # sccache, sccache-dist
    res = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=3600)
    assert res.returncode == 0 or (script in GOALS_IN_EXIT_STATUS and res.returncode == 1), \
        res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(figure, res.stdout), res.stdout[-3000:]
    print(res.stdout)  # the figure, for -s / the report
