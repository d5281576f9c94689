"""Progress and estimates for long compiles: counters read from real build-output shapes, the ETA from the
rate so far, the three displays (tty line, bounded plain lines without control characters, GitHub Actions
groups), estimates from earlier builds in the wheelhouse — and a real fixture build that records its compile
and is estimated the next time."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from builder.cache import file_records
from builder.cache.local import Wheelhouse
from builder.estimate import estimate
from builder.progress import Display, counters, duration, is_object_compile

from tests.helpers import REPO
from tests.support.progress import FIXTURE


class Clock:
    """A settable clock, so rates and intervals are exact."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.pure
@pytest.mark.parametrize("line, expected", [
    ("[17/345] Building CUDA object CMakeFiles/_C.dir/csrc/attention/paged_attention_v1.cu.o", (17, 345)),
    ("#14 301.2 [3/12] /usr/local/cuda/bin/nvcc -c flash_fwd_hdim64_fp16_sm80.cu -o x.o", (3, 12)),
    ("#14 12.0 [0/12] nothing done yet", None),
    ("#14 12.0 [13/12] impossible", None),
    ("Collecting torch==2.14.0 [notice] A new release of pip", None),
])
def test_ninja_counters_are_read_with_or_without_the_buildkit_prefix(line, expected):
    assert counters(line) == expected


@pytest.mark.pure
def test_an_nvcc_line_per_cuda_source_counts_as_an_object():
    assert is_object_compile("#12 40.1 /opt/venv/lib/nvidia/cu13/bin/nvcc -O2 -shared -o libsaxpy.so /src/csrc/saxpy.cu")
    assert not is_object_compile("#12 3.0 nvcc --version")
    assert not is_object_compile("#12 3.0 Requirement already satisfied: nvidia-cuda-nvcc")


@pytest.mark.pure
def test_eta_comes_from_the_rate_so_far_then_from_the_estimate():
    clock = Clock()
    out = io.StringIO()
    shown = Display("plain", stream=out, interval=0, clock=clock, env={})
    t = shown.track("vllm==0.33.0", estimate_s=600)
    assert t.status() == "vllm==0.33.0, configuring, elapsed 0s, ETA 10m00s (estimate)"
    clock.now += 100
    t.feed("#14 100.0 [10/100] Building CUDA object a.cu.o")
    assert t.eta_s == pytest.approx(900)  # 10 objects in 100 s, 90 to go
    assert t.status() == "vllm==0.33.0, 10/100 objects (10%), elapsed 1m40s, ETA 15m00s"
    t.feed("[5/20] second ninja run")  # vLLM's build runs ninja more than once
    assert (t.done, t.total) == (5, 20)
    assert duration(3 * 3600 + 5 * 60) == "3h05m"


@pytest.mark.pure
def test_plain_lines_are_bounded_by_the_interval_and_carry_no_control_characters():
    clock = Clock()
    out = io.StringIO()
    shown = Display("plain", stream=out, interval=60, clock=clock, env={})
    t = shown.track("flash-attn==2.8.3", None)
    for i in range(1, 301):  # 300 objects over 300 s: at most one line a minute
        clock.now += 1
        t.feed(f"[{i}/300] Building CUDA object")
    shown.finish(t)
    lines = out.getvalue().splitlines()
    assert len(lines) == 6, lines  # minutes 1..5, then "done"
    assert lines[0].startswith("flash-attn==2.8.3, 60/300 objects (20%), elapsed 1m00s, ETA 4m00s")
    assert lines[-1].endswith("— done") and "300/300" in lines[-1]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out.getvalue())


@pytest.mark.pure
def test_tty_redraws_one_line_and_step_lines_are_not_lost():
    clock = Clock()
    out = io.StringIO()
    shown = Display("tty", stream=out, clock=clock, env={})
    t = shown.track("sglang-kernel==0.4.10", None)
    t.feed("[1/4] a")
    t.feed("[2/4] b")
    shown.say("[cell] a step line")
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 2 and "sglang-kernel==0.4.10, 2/4 objects (50%)" in text
    assert text.endswith("\r\x1b[2K[cell] a step line\n")


@pytest.mark.pure
def test_github_actions_gets_a_log_group_per_compile():
    out = io.StringIO()
    shown = Display("auto", stream=out, clock=Clock(), env={"GITHUB_ACTIONS": "true", "CI": "true"})
    assert shown.mode == "plain"
    t = shown.track("[cell] vllm==0.33.0", None)
    shown.finish(t)
    assert out.getvalue().splitlines()[0] == "::group::[cell] vllm==0.33.0"
    assert out.getvalue().splitlines()[-1] == "::endgroup::"


def _entry(wh: Wheelhouse, tmp: Path, key: str, seconds: float, threads: int, archs: int, at: str) -> None:
    whl = tmp / key / "demo-1.0-py3-none-any.whl"
    whl.parent.mkdir(parents=True)
    whl.write_bytes(key.encode())
    wh.store("vllm", key * 64, [whl], {"version": "0.33.0", "files": file_records([whl]), "audit": {"ok": True, "archs": [80]},
                                       "built_by": {"at": at},
                                       "compile": {"seconds": seconds, "objects": 400, "threads": threads, "archs": archs,
                                                   "cores": 16}})


@pytest.mark.pure
def test_estimates_scale_the_latest_earlier_build_by_threads_and_archs(tmp_path):
    wh = Wheelhouse(tmp_path / "wh")
    assert estimate(wh, "vllm", "0.33.0", 2, 2) is None
    _entry(wh, tmp_path, "a", seconds=3600, threads=16, archs=2, at="2026-11-01T00:00:00Z")
    _entry(wh, tmp_path, "b", seconds=1800, threads=16, archs=2, at="2026-11-20T00:00:00Z")  # the latest wins
    e = estimate(wh, "vllm", "0.33.0", 1, 2)
    assert e.seconds == pytest.approx(1800 * 16 / 2 / 2) and e.objects == 200
    assert "took 30m00s with 16 nvcc threads for 2 arch(s) on 16 cores; scaled to 2 threads, 1 arch(s)" in e.why
    assert estimate(wh, "vllm", "0.34.0", 1, 2) is None


@pytest.mark.pure
def test_recorded_ninja_output_of_a_real_cmake_cuda_build_is_counted():
    """tests/fixtures/progress/ninja-cuda-sm80-sm90.log: the output of ninja building four CUDA sources for
    80-real;90-real with nvcc 13.0 (the shape vLLM's and sglang-kernel's CMake builds print)."""
    clock = Clock()
    out = io.StringIO()
    shown = Display("plain", stream=out, interval=0, clock=clock, env={})
    t = shown.track("recorded", None)
    seen = []
    for line in (REPO / "tests" / "fixtures" / "progress" / "ninja-cuda-sm80-sm90.log").read_text().splitlines():
        clock.now += 2
        t.feed(line)
        seen.append((t.done, t.total))
    assert seen == [(0, 0), (1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert out.getvalue().splitlines()[-1] == "recorded, 5/5 objects (100%), elapsed 12s, ETA 0s"


@pytest.mark.pure
def test_recorded_output_of_the_real_flash_attn_kernel_build_is_counted():
    """tests/fixtures/progress/flash-attn-2.8.3-one-kernel-sm80-sm90.log: BuildKit's lines of the slow
    tests/docker/builds/test_flash_attn_kernel.py run (flash-attn 2.8.3's own setup.py and torch's BuildExtension, ninja, nvcc
    13.0, FLASH_ATTN_CUDA_ARCHS="80;90", one kernel source), recorded on 2026-11-30. ninja's "[1/1] ccache
    .../nvcc ... flash_fwd_hdim32_fp16_sm80.o" is counted among compiler warnings, setuptools noise and the
    g++ link, which are not."""
    lines = (REPO / "tests" / "fixtures" / "progress" / "flash-attn-2.8.3-one-kernel-sm80-sm90.log").read_text().splitlines()
    assert [line for line in lines if counters(line)] == [line for line in lines if " [1/1] ccache " in line]
    assert [counters(line) for line in lines if counters(line)] == [(1, 1)]
    compiles = [line for line in lines if is_object_compile(line)]
    assert len(compiles) == 1 and "flash_fwd_hdim32_fp16_sm80.o" in compiles[0]
    assert not [line for line in lines if "x86_64-linux-gnu-g++" in line and is_object_compile(line)]
    clock = Clock()
    out = io.StringIO()
    t = Display("plain", stream=out, interval=0, clock=clock, env={}).track("flash-attn==2.8.3", None)
    for line in lines:
        clock.now += 1
        t.feed(line)
    assert (t.done, t.total) == (1, 1)
    assert out.getvalue().splitlines()[-1].startswith("flash-attn==2.8.3, 1/1 objects (100%)")
    assert not any(c in out.getvalue() for c in "\r\x1b")  # a non-TTY log gets no control characters


@pytest.mark.pure
def test_plan_estimates_at_the_parallelism_the_build_is_told(tmp_path):
    """`build --max-jobs/--nvcc-threads` compiles with fewer threads than the host's rule: the estimate plan
    prints (and the build's closing table compares) is scaled to those, not to the default."""
    from builder import matrix as matrix_mod
    from builder import resolve
    from builder.plan import plan_cells
    from builder.resources import Host

    wh = Wheelhouse(tmp_path / "wh")
    whl = tmp_path / "e" / "cuda_ext-1.0.0-cp311-cp311-linux_x86_64.whl"
    whl.parent.mkdir()
    whl.write_bytes(b"x")
    wh.store("cuda-ext", "e" * 64, [whl], {"version": "1.0.0", "files": file_records([whl]),
                                           "audit": {"ok": True, "archs": [80, 90]}, "built_by": {"at": "2026-11-20T00:00:00Z"},
                                           "compile": {"seconds": 600, "objects": 2, "threads": 8, "archs": 2, "cores": 16}})
    cells = resolve.select(matrix_mod.load(FIXTURE / "matrix.toml"), matrix_mod.Selection())
    host = Host(cores=16, free_gb=64.0)
    (default,) = plan_cells(cells, None, history=wh, host=host)
    (told,) = plan_cells(cells, None, history=wh, host=host, max_jobs=1, nvcc_threads=1)
    assert told.wheels[0].estimate.seconds == pytest.approx(600 * 8 / 1)
    assert default.wheels[0].estimate.seconds < told.wheels[0].estimate.seconds
