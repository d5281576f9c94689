"""builder/gencode_filter.py, the compiler launcher that makes --arch select sglang-kernel's binaries: its rule on
nvcc argument lists, and a real CMake + Ninja + nvcc build of a project shaped like sgl-kernel's common_ops split
(one source list built as two targets with one hard-coded gencode list) run through it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import gencode_filter
from builder.audit import audit, read_fatbin_entries

HARD_CODED = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_89,code=sm_89", "-gencode",
              "arch=compute_90,code=sm_90", "-gencode=arch=compute_90a,code=sm_90a",
              "--generate-code=arch=compute_100f,code=[sm_100f,compute_100f]", "-gencode=arch=compute_120a,code=sm_120a"]


@pytest.mark.pure
def test_each_target_keeps_the_entries_a_requested_gpu_that_loads_it_runs():
    obj = ["-o", "CMakeFiles/common_ops_sm90_build.dir/csrc/a.cu.o", "-c", "a.cu"]
    args, kept, dropped = gencode_filter.filter_args(["-O3", *HARD_CODED, *obj], [80, 90], {"archs": [90]})
    assert args == ["-O3", "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90a,code=sm_90a", *obj]
    assert kept == ["sm_90", "sm_90a"] and set(dropped) == {"sm_80", "sm_89", "sm_100f", "compute_100f", "sm_120a"}
    assert gencode_filter.target_of(obj) == "common_ops_sm90_build"
    # the copy every GPU but 9.0 loads: an A100 and an A10G (8.6) run sm_80
    args, kept, _ = gencode_filter.filter_args(HARD_CODED, [80, 86, 90], {"all_but": [90]})
    assert kept == ["sm_80"]
    # unscoped: every requested GPU; family code (sm_100f) serves 10.3, PTX compute_100f a later GPU by JIT
    _, kept, _ = gencode_filter.filter_args(HARD_CODED, [103], None)
    assert kept == ["sm_100f", "compute_100f"]
    # a target no requested GPU loads keeps its first entry, so the module still builds
    args, kept, dropped = gencode_filter.filter_args(HARD_CODED, [80], {"archs": [90, 100, 103]})
    assert kept == ["sm_80"] and "sm_90a" in dropped
    # arguments that are not gencode entries pass unchanged, -arch included
    assert gencode_filter.filter_args(["-arch=sm_80", "-O2"], [90], None)[0] == ["-arch=sm_80", "-O2"]


@pytest.mark.pure
def test_the_launcher_refuses_to_run_without_archs(monkeypatch, capsys):
    monkeypatch.delenv(gencode_filter.ENV, raising=False)
    assert gencode_filter.main(["gencode_filter.py", "nvcc", "-c", "a.cu"]) == 2
    assert "names no archs" in capsys.readouterr().err


CMAKE = """\
cmake_minimum_required(VERSION 3.24)
project(split LANGUAGES CXX CUDA)
set(CUDA_FLAGS {flags})
set(SOURCES kernel.cu)
add_library(common_ops_sm90_build MODULE ${{SOURCES}})
target_compile_options(common_ops_sm90_build PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${{CUDA_FLAGS}} -use_fast_math>)
set_target_properties(common_ops_sm90_build PROPERTIES OUTPUT_NAME common_ops PREFIX "" LIBRARY_OUTPUT_DIRECTORY sm90)
add_library(common_ops_sm100_build MODULE ${{SOURCES}})
target_compile_options(common_ops_sm100_build PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${{CUDA_FLAGS}}>)
set_target_properties(common_ops_sm100_build PROPERTIES OUTPUT_NAME common_ops PREFIX "" LIBRARY_OUTPUT_DIRECTORY sm100)
"""
KERNEL = "__global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n"


def test_a_real_cmake_build_through_the_launcher_compiles_each_copy_for_its_gpus(nvcc, tmp_path):
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if not cmake or not ninja:
        pytest.fail("cmake and ninja are needed (Debian packages cmake, ninja-build)")
    src = tmp_path / "src"
    src.mkdir()
    flags = " ".join(f'"{f}"' for f in ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_89,code=sm_89",
                                         "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90a,code=sm_90a"])
    (src / "CMakeLists.txt").write_text(CMAKE.format(flags=flags))
    (src / "kernel.cu").write_text(KERNEL)
    config = {"archs": [80, 90], "targets": {"common_ops_sm90_build": {"archs": [90]},
                                            "common_ops_sm100_build": {"all_but": [90]}},
              "log_dir": str(tmp_path / "marks")}
    env = {**os.environ, gencode_filter.ENV: json.dumps(config)}
    build = tmp_path / "build"
    launcher = f"{sys.executable};{gencode_filter.__file__}"
    configure = subprocess.run([cmake, "-S", src, "-B", build, "-G", "Ninja", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                                "-DCMAKE_CUDA_ARCHITECTURES=OFF", f"-DCMAKE_CUDA_COMPILER_LAUNCHER={launcher}"],
                               capture_output=True, text=True, env=env)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    done = subprocess.run([cmake, "--build", build, "-v"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    sm90 = {e.name for e in read_fatbin_entries(next((build / "sm90").glob("common_ops*.so"))) if e.kind == "sass"}
    sm100 = {e.name for e in read_fatbin_entries(next((build / "sm100").glob("common_ops*.so"))) if e.kind == "sass"}
    assert sm90 == {"sm_90", "sm_90a"} and sm100 == {"sm_80"}
    # one line per target in the log says what was kept and dropped
    log = done.stdout + done.stderr
    assert "gencode filter: common_ops_sm100_build: keeps sm_80; drops sm_89 sm_90 sm_90a" in log, log
    # the audit with sglang-kernel's scopes passes for what was asked
    from builder.engines import recipe

    scopes = recipe("sglang-kernel", "0.4.10").arch_scoped
    site = tmp_path / "site" / "sgl_kernel"
    for d in ("sm90", "sm100"):
        (site / d).mkdir(parents=True)
        shutil.copy(next((build / d).glob("common_ops*.so")), site / d / "common_ops.abi3.so")
    assert audit(tmp_path / "site", [80, 90], scopes).ok
    assert audit(tmp_path / "site", [86, 90], scopes).ok  # sm_80 SASS runs on 8.6


def test_the_rendered_build_stage_writes_the_filter_exactly_and_configures_it(tmp_path):
    """The sglang-kernel stage writes builder/gencode_filter.py with printf (no build context needed): run that
    RUN's shell text here and the file is byte for byte the module; ENV and the CMake define name it."""
    from builder import plan, render
    from builder.matrix import Selection, load
    from builder.resolve import select

    from tests.helpers import REPO

    m = load(REPO / "matrix.toml")
    (cell,) = select(m, Selection(profiles=("cu130",), engines=("sglang",)))
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    start = text.index("RUN printf '%s\\n' \\\n      '#!/usr/bin/env python3'")
    run = text[start + 4:text.index("&& chmod 0755 /usr/local/bin/builder-gencode-filter", start)]
    target = tmp_path / "builder-gencode-filter"
    script = run.replace("/usr/local/bin/builder-gencode-filter", str(target)).rstrip().rstrip("\\").rstrip()
    subprocess.run(["bash", "-c", script], check=True)
    assert target.read_bytes() == Path(gencode_filter.__file__).read_bytes()
    env_line = next(ln for ln in text.splitlines() if ln.startswith("ENV BUILDER_GENCODE_FILTER="))
    config = json.loads(env_line.split("=", 1)[1][1:-1].replace('\\"', '"'))
    assert config["archs"] == [80, 90] and config["targets"]["common_ops_sm100_build"] == {"all_but": [90]}
    # the filter first, then sccache: what sccache caches is the nvcc call the filter made
    assert '-Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER="/usr/local/bin/builder-gencode-filter;sccache"' in text


WHEEL_CMAKE = """\
cmake_minimum_required(VERSION 3.24)
project(sgl_kernel_layout LANGUAGES CXX CUDA)
{targets}
"""
WHEEL_TARGET = """\
add_library({target} MODULE kernel.cu)
target_compile_options({target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:{flags}>)
set_target_properties({target} PROPERTIES OUTPUT_NAME {name} PREFIX "" SUFFIX ".abi3.so" LIBRARY_OUTPUT_DIRECTORY {dir})
"""
# a target built only with its option ON (upstream's `if (SGL_KERNEL_ENABLE_FA3)` around flash_ops), ON by default
SWITCHED_TARGET = """\
option({option} "builds {target}" ON)
if ({option})
{body}endif()
"""


def _rendered_filter(archs: tuple[int, ...], tmp: Path) -> tuple[Path, dict, dict[str, str]]:
    """The gencode filter script and its configuration as the rendered SGLang cell's build stage writes them, and
    the CMake defines (-Ccmake.define.NAME=VALUE) of its compile."""
    from builder import plan, render
    from builder.matrix import Selection, load
    from builder.resolve import select

    from tests.helpers import REPO

    m = load(REPO / "matrix.toml")
    (cell,) = select(m, Selection(profiles=("cu130",), engines=("sglang",), archs=archs))
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    start = text.index("RUN printf '%s\\n' \\\n      '#!/usr/bin/env python3'")
    run = text[start + 4:text.index("&& chmod 0755 /usr/local/bin/builder-gencode-filter", start)]
    script = tmp / "builder-gencode-filter"
    subprocess.run(["bash", "-c", run.replace("/usr/local/bin/builder-gencode-filter", str(script)).rstrip()
                    .rstrip("\\").rstrip()], check=True)
    env_line = next(ln for ln in text.splitlines() if ln.startswith("ENV BUILDER_GENCODE_FILTER="))
    stage = text.split("AS build-sglang-kernel\n", 1)[1].split("\nFROM ", 1)[0]
    defines = dict(re.findall(r"-Ccmake\.define\.([A-Za-z0-9_]+)=(ON|OFF)\b", stage))
    return script, json.loads(env_line.split("=", 1)[1][1:-1].replace('\\"', '"')), defines


# 100 and 120 alone: slow (two more CMake builds); the default tier builds 80,90,100 (sm_8x kept, a Blackwell arch)
@pytest.mark.parametrize("archs", [pytest.param((100,), id="100", marks=pytest.mark.slow),
                                   pytest.param((120,), id="120", marks=pytest.mark.slow),
                                   pytest.param((80, 90, 100), id="80,90,100")])
def test_blackwell_sglang_kernel_layout_built_through_the_rendered_filter_passes_the_audit(nvcc, tmp_path, archs):
    """Six CMake targets named and laid out as sglang-kernel 0.4.10's (flash_ops, flashmla_ops, infllm_ops, the two
    common_ops copies, spatial_ops), each given the gencode list upstream compiles it with on CUDA 13.0 (the engine
    data's binaries, read from the published wheel; sm_8x left out when ENABLE_BELOW_SM90 is OFF, as its CMake
    does), compiled by the real nvcc through the filter and configuration the rendered build stage writes: each
    file carries the SASS plan predicted, and the audit with the engine data's scopes passes."""
    from builder.engines import recipe

    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if not cmake or not ninja:
        pytest.fail("cmake and ninja are needed (Debian packages cmake, ninja-build)")
    r = recipe("sglang-kernel", "0.4.10")
    script, config, defines = _rendered_filter(archs, tmp_path)
    assert config["archs"] == list(archs) and config["targets"]["infllm_ops"]["archs"] == [80, 86, 87, 88, 89, 90, 120]
    below = defines["ENABLE_BELOW_SM90"] == "ON"
    switches = {s.files: s.cmake for s in r.binary_switches}
    # FA3 (flash_ops) is loaded on sm_8x and 9.0 only: the rendered compile switches it off for Blackwell-only sets
    assert ("SGL_KERNEL_ENABLE_FA3" in defines) == (archs in ((100,), (120,)))
    targets = []
    for b in r.binaries:
        codes = [c for c in b.sass if below or int(c[3:].rstrip("af")) >= 90]
        flags = " ".join(f"-gencode=arch={c.replace('sm_', 'compute_')},code={c}" for c in codes)
        path = b.files.rstrip("*")
        body = WHEEL_TARGET.format(target=b.target, flags=flags, name=path.rsplit("/", 1)[1],
                                   dir=f"wheel/{path.rsplit('/', 1)[0]}")
        targets.append(SWITCHED_TARGET.format(option=switches[b.files], target=b.target, body=body)
                       if b.files in switches else body)
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(WHEEL_CMAKE.format(targets="".join(targets)))
    (src / "kernel.cu").write_text(KERNEL)
    config["log_dir"] = str(tmp_path / "marks")
    env = {**os.environ, gencode_filter.ENV: json.dumps(config)}
    build = tmp_path / "build"
    configure = subprocess.run([cmake, "-S", src, "-B", build, "-G", "Ninja", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                                "-DCMAKE_CUDA_ARCHITECTURES=OFF", f"-DCMAKE_CUDA_COMPILER_LAUNCHER={sys.executable};{script}",
                                *(f"-D{k}={v}" for k, v in defines.items() if k in switches.values())],
                               capture_output=True, text=True, env=env)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    done = subprocess.run([cmake, "--build", build, "-j", "2"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = build / "wheel"
    carried = {str(p.relative_to(wheel)): tuple(sorted({e.name for e in read_fatbin_entries(p) if e.kind == "sass"},
                                                       key=lambda n: (int(n[3:].rstrip("af")), n)))
               for p in wheel.rglob("*.so")}
    plans = r.binary_plans(archs, "13.0.3")
    planned = {bp.binary.files.rstrip("*") + ".abi3.so": bp.sass for bp in plans if not bp.switched_off}
    assert carried == planned  # a target switched off is not built at all
    report = audit(wheel, list(archs), r.arch_scoped)
    assert report.ok and len(report.binaries) == len(planned), [(b.path, b.status) for b in report.binaries]
    # and the same layout is refused for a GPU a loaded binary has no code for (GB10, 12.1)
    assert not audit(wheel, [*archs, 121], r.arch_scoped).ok
