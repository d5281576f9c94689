"""Benchmarks cannot rot: every script in benchmarks/ runs here in its quick mode and must print its figure. The ones
that need minutes (builds, compiles) are slow; tests/docker/builds/test_build_ninja_units.py runs build_ninja_units.py (slow:
a torch venv and the vLLM configure)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO
from tests.support.benchmarks import BENCHMARKS, QUICK

ELSEWHERE = {"build_ninja_units.py": "test_build_ninja_units.py", "rehearse_units.py": "test_rehearse_real.py",
             # GPU hosts only (FlashInfer's sm_90 module, an engine's boots)
             "flashinfer_first_call.py": "test_jit_prebuilt_gpu.py", "jit_first_boot.py": "test_jit_prebuilt_gpu.py"}


@pytest.mark.pure
def test_every_benchmark_script_is_run_by_the_suite():
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(QUICK) | set(ELSEWHERE)
    for script, test in ELSEWHERE.items():
        assert any(f'"benchmarks" / "{script}"' in p.read_text() for p in (REPO / "tests").rglob(test)), (script, test)


def test_the_farm_benchmarks_vllm_route_refuses_without_a_cutlass_checkout_before_anything_starts(tmp_path):
    """`farm_units.py --sdist vllm` compiles vLLM's real units from its PyPI sdist (its GitHub sources are not
    reachable here): its CUTLASS 3.x units include CUTLASS, so a checkout must be given; without one (or with a
    directory that is not one) it exits 2 before a container, a venv or a farm is made."""
    import subprocess
    import sys

    for extra in ([], ["--source", f"cutlass={tmp_path}"]):
        res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "farm_units.py"), "--sdist", "vllm", *extra],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "give a CUTLASS checkout with --source cutlass=DIR" in res.stderr, res.stderr
        assert res.stdout == ""
