"""sglang-kernel 0.4.10, the wheel PyPI serves (built upstream from the v0.5.23 sources with nvcc 13.0 against
torch 2.14.1, the cu130 cell's toolchain), held against the engine data: which of its binaries load on which
GPU (arch_scoped), and what its compile costs in kernel×arch units per binary (the figures the arch selection
of the build stage is measured by). Slow: a 373 MB download, once, into the user cache."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from builder.audit import read_fatbin_entries
from builder.lock import _download
from builder.matrix import load
from builder.pypi import SimpleIndex

from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.slow

WHEEL = "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"


@pytest.fixture(scope="module")
def wheel() -> Path:
    index = SimpleIndex(load(REPO / "matrix.toml").defaults["index"])
    (f,) = [f for f in index.files("sglang-kernel") if f.filename == WHEEL]
    return _download(index, f.url, f.sha256, f.filename)


def test_the_real_wheel_passes_for_80_90_because_each_binary_is_asked_only_where_it_loads(wheel, tmp_path):
    """FlashMLA has no sm_80 code by design and is not asked for it; the sm100/ copy of common_ops (what an A100
    loads) is asked for sm_80, the sm90/ copy for sm_90 only — the loader in the wheel says which loads where."""
    with zipfile.ZipFile(wheel) as z:
        loader = z.read("sgl_kernel/load_utils.py").decode()
    assert 'if compute_capability == 90:\n        ops_subdir = "sm90"' in loader and 'ops_subdir = "sm100"' in loader
    unscoped = run_cli("audit", str(wheel), "--arch", "80,90")
    assert unscoped.exit_code == 1 and "flashmla_ops.abi3.so: sm_80 missing" in unscoped.output, unscoped.output
    res = run_cli("audit", str(wheel), "--arch", "80,90", "--package", "sglang-kernel==0.4.10", "--json")
    assert res.exit_code == 0, res.output
    import json

    by_file = {b["path"].rsplit("!", 1)[1]: b for b in json.loads(res.output)["binaries"]}
    asked = {name: [a["arch"] for a in b["archs"]] for name, b in by_file.items()}
    assert asked == {
        "sgl_kernel/flash_ops.abi3.so": [80, 90],
        "sgl_kernel/flashmla_ops.abi3.so": [90],
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": [80, 90],
        "sgl_kernel/sm100/common_ops.abi3.so": [80],
        "sgl_kernel/sm90/common_ops.abi3.so": [90],
        "sgl_kernel/spatial_ops.abi3.so": [80, 90],
    }


def test_the_real_wheel_still_fails_for_a_gpu_a_loaded_binary_lacks(wheel):
    """A GB10 (12.1) loads sm100/common_ops, whose Blackwell code is sm_100f and sm_120a: neither runs on 12.1.
    The scopes excuse nothing there: the audit fails and names the binaries."""
    res = run_cli("audit", str(wheel), "--arch", "90,121", "--package", "sglang-kernel==0.4.10")
    assert res.exit_code == 1, res.output
    failed = sorted(line.split("!", 1)[1].split(":", 1)[0] for line in res.output.splitlines() if line.startswith("FAIL "))
    assert failed == ["sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so"], res.output
    assert "sm100/common_ops.abi3.so: sm_121 missing" in res.output
    # and plan refuses the same GPU for a build, naming the same binaries
    plan = run_cli("plan", "--engine", "sglang", "--arch", "90,121")
    assert plan.exit_code == 2 and "sgl_kernel/sm100/common_ops" in plan.output and "sgl_kernel/spatial_ops" in plan.output


@pytest.mark.parametrize("archs", ["100", "103", "120", "80,90,100"])
def test_the_real_wheel_passes_for_blackwell_where_each_binary_loads(wheel, archs):
    """B200, B300, RTX PRO 6000 and a mixed set: the published wheel passes the audit with the engine data's scopes
    (infllm_ops has no 10.x code upstream either and is not asked for it), as plan's prediction for a build does."""
    res = run_cli("audit", str(wheel), "--arch", archs, "--package", "sglang-kernel==0.4.10")
    assert res.exit_code == 0, res.output
    from builder.archs import parse
    from builder.engines import recipe

    assert recipe("sglang-kernel", "0.4.10").predicted_audit(parse(archs), "13.0.3").ok


def test_the_engine_data_lists_each_binary_with_its_sass_and_kernel_count(wheel, tmp_path):
    """The `binaries` table plan counts kernel×arch units with is what the wheel holds: per .so its SASS targets and
    the fatbin entries per target (the same number for every target of one binary)."""
    import collections

    from builder.archs import ArchScope
    from builder.engines import recipe

    r = recipe("sglang-kernel", "0.4.10")
    found = {}
    with zipfile.ZipFile(wheel) as z:
        for name in (n for n in z.namelist() if n.endswith(".so")):
            path = Path(z.extract(name, tmp_path))
            found[name] = collections.Counter(e.name for e in read_fatbin_entries(path) if e.kind == "sass")
            path.unlink()
    assert len(found) == len(r.binaries)
    for b in r.binaries:
        (name,) = [n for n in found if ArchScope(b.files, (), "").matches(n)]
        assert tuple(sorted(found[name], key=lambda s: (int("".join(c for c in s if c.isdigit())), s))) == b.sass, name
        assert set(found[name].values()) == {b.units}, (name, found[name])
    print(f"sglang-kernel 0.4.10 upstream: {sum(sum(c.values()) for c in found.values())} kernel×arch units; "
          f"a build for 80,90: {sum(bp.units for bp in r.binary_plans((80, 90), '13.0.3'))}")
    assert sum(sum(c.values()) for c in found.values()) == 1725


@pytest.mark.parametrize("archs", ["90", "100"])
def test_plan_and_the_compile_units_benchmark_name_the_same_kept_sass(wheel, archs):
    """benchmarks/compile_units.py counts the wheel's kernels per SASS target and takes what each binary keeps from
    plan's own code (Recipe.binary_plans): at --arch 90 both name sm_90 for the sm100/ copy no Hopper GPU loads (the
    filter keeps its first entry, the CMake's sm_90, once the switch dropped sm_80/sm_89), and the same per binary."""
    import re
    import subprocess
    import sys

    bench = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compile_units.py"), "--arch", archs],
                           capture_output=True, text=True, timeout=900)
    assert bench.returncode == 0, bench.stderr
    benched = {m.group(1): tuple(m.group(2).split()) for m in
               re.finditer(r"^  (sgl_kernel/\S+?)(?:\.abi3|\.cpython-\S+)\.so +\d+ +\d+  (.+)$", bench.stdout, re.M)}
    planned = run_cli("plan", "--engine", "sglang", "--arch", archs)
    assert planned.exit_code == 0, planned.output
    plan_sass = {m.group(1): tuple(m.group(2).split(",")) for m in
                 re.finditer(r"^ +(sgl_kernel/\S+) +SASS (\S+) +\d+ of +\d+ kernel×arch units", planned.output, re.M)}
    # a binary whose CMake option is passed OFF (FA3's flash_ops at 10.0): not built, said by both
    for m in re.finditer(r"^ +(sgl_kernel/\S+) +not built: ", planned.output, re.M):
        plan_sass[m.group(1)] = ("not", "built", "(its", "CMake", "option", "OFF)")
    assert len(benched) == 6 and benched == plan_sass, (benched, plan_sass)
    if archs == "90":
        assert benched["sgl_kernel/sm100/common_ops"] == ("sm_90",)
