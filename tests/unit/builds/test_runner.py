"""The runner's loop and gates, on the real fixture cell with the real audit and cache steps and a real
wheelhouse. BuildKit is replaced by test doubles named as such (FakeCompile / FakeImage: they put a wheel
where the wheel stage would export it, or record that tagging was attempted); the real BuildKit path of the
same steps is tests/docker/builds/test_build.py."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder import archs, matrix, plan, report, resolve, runner
from builder.cache import file_records
from builder.cache.local import Wheelhouse
from builder.errors import CommandError
from builder.resources import Host
from builder.steps import BuildOptions, CellContext, Status, StepResult
from builder.steps.audit import AuditStep
from builder.steps.cache import CacheStep

from tests.helpers import KERNEL_A, MATRIX as SHIPPED, REPO, FakeCompile, FakeImage, pure_wheel

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST = Host(cores=2, free_gb=16.0)


def planned(matrix_path: Path, wheelhouse: Wheelhouse, **sel):
    m = matrix.load(matrix_path)
    return plan.plan_cells(resolve.select(m, matrix.Selection(**sel)), wheelhouse)


def options(tmp: Path, **kw) -> BuildOptions:
    return BuildOptions(work_dir=tmp / "work", log_dir=tmp / "logs", index_url="https://pypi.org/simple", **kw)


@pytest.mark.pure
def test_a_compiled_package_without_device_code_is_neither_cached_nor_tagged(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = planned(FIXTURE / "matrix.toml", wh)
    image = FakeImage()
    (out,) = runner.run_cells(plans, wh, options(tmp_path), lambda s: None, HOST,
                              steps=(FakeCompile(), AuditStep(), CacheStep(), image))
    by_step = {r.step: r for r in out.results}
    assert by_step["audit"].status is Status.FAILED
    assert "no binary in the wheel carries device code, but cuda-ext compiles CUDA kernels" in by_step["audit"].reason
    assert by_step["cache"].status is Status.SKIPPED and by_step["image"].status is Status.SKIPPED
    assert image.ran == 0 and not list((tmp_path / "wheelhouse").rglob("*.whl"))
    assert not out.ok and "no binary in the wheel carries device code" in out.error


@pytest.mark.pure
def test_a_pure_python_package_is_exempt_from_the_device_code_rule(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    (p,) = planned(SHIPPED, wh, engines=("sglang",))
    sglang = next(w for w in p.wheels if w.package.name == "sglang")
    assert not sglang.package.recipe.compiled
    ctx = CellContext(plan=p, opts=options(tmp_path), cache=wh, host=HOST, say=lambda s: None, log=io.StringIO())
    pure_wheel(ctx.out_dir("sglang"), "sglang", "0.5.23")
    result = AuditStep().run(ctx, sglang)
    assert result.status is Status.OK and result.reason.startswith("no device code expected (Rust, C++ against torch; bound to torch ")
    # the same wheel for a package that compiles kernels fails
    kernel = next(w for w in p.wheels if w.package.name == "sglang-kernel")
    pure_wheel(ctx.out_dir("sglang-kernel"), "sglang_kernel", "0.4.10")
    assert AuditStep().run(ctx, kernel).status is Status.FAILED


@pytest.mark.pure
def test_an_exception_inside_a_step_fails_that_cell_with_its_message_and_keep_going_runs_the_rest(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = planned(FIXTURE / "matrix-two.toml", wh)
    assert [p.cell.id for p in plans] == ["cuda-ext-badknob-1.0.0-cu130-py311-sm80.90", "cuda-ext-1.0.0-cu130-py311-sm80.90"]
    compile_ = FakeCompile(fail_for={"cuda-ext-badknob": FileNotFoundError("wheels-cuda-ext-badknob exported no .whl")})
    image = FakeImage()
    said: list[str] = []
    outcomes = runner.run_cells(plans, wh, options(tmp_path, keep_going=True), said.append, HOST,
                                steps=(compile_, AuditStep(), CacheStep(), image))
    first, second = outcomes
    assert not first.ok and first.error == "FileNotFoundError: wheels-cuda-ext-badknob exported no .whl"
    assert [(r.step, r.status) for r in first.results] == [
        ("compile", Status.FAILED), ("audit", Status.SKIPPED), ("cache", Status.SKIPPED), ("image", Status.SKIPPED)]
    assert first.results[1].reason == "not run: compile did not pass for cuda-ext-badknob"
    # the traceback is in the cell's log, not on the terminal
    assert "Traceback" in first.log.read_text() and not any("Traceback" in s for s in said)
    # the next cell ran (it fails the device-code rule: the fake wheel has none)
    assert second.results[0].status is Status.OK and compile_.ran == ["cuda-ext-badknob", "cuda-ext"]
    table = report.format_table(outcomes, planned=2)
    assert "FileNotFoundError: wheels-cuda-ext-badknob exported no .whl" in table
    assert "not run: compile did not pass for cuda-ext-badknob" in table


@pytest.mark.pure
def test_without_keep_going_the_run_stops_at_the_first_failed_cell(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = planned(FIXTURE / "matrix-two.toml", wh)
    compile_ = FakeCompile(fail_for={"cuda-ext-badknob": CommandError(["docker", "buildx", "build"], 1, "boom")})
    outcomes = runner.run_cells(plans, wh, options(tmp_path), lambda s: None, HOST,
                                steps=(compile_, AuditStep(), CacheStep(), FakeImage()))
    assert len(outcomes) == 1 and compile_.ran == ["cuda-ext-badknob"]
    assert outcomes[0].results[1].reason == "not run: compile failed for cuda-ext-badknob"
    assert "1 more planned cell(s) not run" in report.format_table(outcomes, planned=2)


@pytest.fixture(scope="module")
def sm80_sm90_library(nvcc, tmp_path_factory) -> Path:
    """A real shared library with sm_80 + sm_90 SASS, compiled by the host's nvcc."""
    root = tmp_path_factory.mktemp("kernel")
    (root / "a.cu").write_text(KERNEL_A)
    subprocess.run([str(nvcc), "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
                    "-gencode", "arch=compute_90,code=sm_90", "-o", "libk.so", "a.cu"], cwd=root, check=True)
    return root / "libk.so"


def test_gates_block_cache_and_image_but_keep_going_still_caches_the_cells_other_wheels(tmp_path, sm80_sm90_library):
    """vLLM cell: vllm's wheel fails (here: raises), flash-attn's passes its audit (the real AuditStep on a
    wheel with real sm_80 + sm_90 SASS) — flash-attn is cached, nothing is tagged."""
    wh = Wheelhouse(tmp_path / "wheelhouse")
    (p,) = planned(SHIPPED, wh, engines=("vllm",))
    so = sm80_sm90_library

    class CompileWithKernel(FakeCompile):
        """Test double: flash-attn's wheel carries a real sm_80 + sm_90 library."""

        def run(self, ctx, wheel):
            name = wheel.package.name
            if name == "flash-attn":
                self.ran.append(name)
                whl = pure_wheel(ctx.out_dir(name), "flash_attn", "2.8.3")
                with zipfile.ZipFile(whl, "a") as zf:
                    zf.write(so, "flash_attn_2_cuda.so")
                ctx.wheels[name] = [whl]
                ctx.records[name] = file_records([whl])
                return StepResult(self.name, name, Status.OK, artifacts={"reused": False})
            return super().run(ctx, wheel)

    image = FakeImage()
    compile_ = CompileWithKernel(fail_for={"vllm": RuntimeError("exported no .whl")})
    (out,) = runner.run_cells([p], wh, options(tmp_path, keep_going=True, allow_unpinned=True), lambda s: None, HOST,
                              steps=(compile_, AuditStep(), CacheStep(), image))
    status = {(r.step, r.subject): r for r in out.results}
    assert status[("audit", "flash-attn")].status is Status.OK
    assert status[("cache", "flash-attn")].status is Status.OK
    assert wh.lookup("flash-attn", p.keys["flash-attn"], (80, 90)).usable
    assert wh.lookup("vllm", p.keys["vllm"], (80, 90)) is None
    assert status[("image", p.cell.id)].reason == "not run: compile did not pass for vllm" and image.ran == 0
    doc = report.outcome_json(out)
    assert doc["result"] == "failed" and doc["image"] is None
    assert [(s["step"], s["subject"], s["status"]) for s in doc["steps"]] == [
        ("compile", "vllm", "failed"), ("audit", "vllm", "skipped"), ("cache", "vllm", "skipped"),
        ("compile", "flash-attn", "ok"), ("audit", "flash-attn", "ok"), ("cache", "flash-attn", "ok"),
        ("image", p.cell.id, "skipped")]
    json.dumps(doc)  # serialisable as --json prints it


@pytest.mark.pure
def test_every_gate_names_steps_that_exist():
    names = {s.name for s in runner.STEPS}
    for step, needs in runner.GATES.items():
        assert step in names and set(needs) <= names, (step, needs)
    order = [s.name for s in runner.STEPS]
    assert order == ["compile", "audit", "cache", "image", "smoke", "publish"]


@pytest.mark.pure
def test_sass_of_one_arch_covers_later_minors_of_the_same_major_only():
    assert archs.runs_on("sass", 80, "", 86) and archs.runs_on("sass", 80, "", 89)
    assert not archs.runs_on("sass", 80, "", 90) and not archs.runs_on("sass", 86, "", 80)
    assert archs.runs_on("ptx", 80, "", 90) and not archs.runs_on("ptx", 90, "", 80)
    assert archs.runs_on("sass", 90, "a", 90) and not archs.runs_on("sass", 90, "a", 100)
    assert archs.sass_substitute(89, (80, 90, 100, 120)) == 80
    assert archs.sass_substitute(75, (80, 90)) is None
