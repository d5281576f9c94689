"""plan: cells, tags, cache keys and build/reuse, with no Docker call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from builder import matrix as M
from builder import plan as P
from builder import resolve
from builder.cache import file_records
from builder.cache.local import Wheelhouse

from tests.helpers import MATRIX, REPO, run_cli


def cells(**sel):
    m = M.load(MATRIX)
    return m, resolve.select(m, M.Selection(**sel))


@pytest.mark.pure
def test_default_selection_is_the_default_profile():
    _, cs = cells()
    assert [c.id for c in cs] == ["vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90", "sglang-0.5.23-cu130-torch2.14.1-py312-sm80.90"]
    _, every = cells(profiles=("all",))
    assert len(every) == 4


@pytest.mark.pure
def test_main_job_selection():
    _, cs = cells(engines=("sglang",), archs=(80, 90))
    assert len(cs) == 1
    c = cs[0]
    assert c.ref == "127.0.0.1:5000/builder/sglang:0.5.23-cu130-torch2.14.1-py312-sm80.90"
    assert [(p.name, p.version) for p in c.packages] == [("sglang", "0.5.23"), ("sglang-kernel", "0.4.10"), ("flash-attn", "2.8.3.post2")]


@pytest.mark.pure
def test_sglang_032_compiles_the_vllm_it_pins_and_takes_its_torch():
    _, cs = cells(profiles=("cu121",), engines=("sglang",))
    c = cs[0]
    assert c.torch == "2.4.0"
    assert ("vllm", "0.5.5") in [(p.name, p.version) for p in c.packages]


@pytest.mark.pure
def test_globs_with_braces_select_cells():
    _, cs = cells(profiles=("all",), only=("*-{cu121,cu130}-*",), skip=("sglang-*",))
    assert [c.engine for c in cs] == ["vllm", "vllm"]


@pytest.mark.pure
def test_cache_key_changes_with_what_shapes_the_wheel_only():
    _, cs = cells(engines=("vllm",))
    cell = cs[0]
    vllm = cell.packages[0]
    base = P.cache_key(cell, vllm)
    assert P.cache_key(cell, vllm) == base  # stable
    assert P.cache_key(cell, replace(vllm, archs=(90,))) != base  # archs
    assert P.cache_key(replace(cell, torch="2.14.1"), vllm) != base  # torch
    assert P.cache_key(replace(cell, base_devel="builder-local/cuda:13.0-devel"), vllm) != base  # toolchain
    # the sglang cell's flash-attn differs from the vLLM cell's: different torch
    _, sg = cells(engines=("sglang",))
    fa_v = P.cache_key(cell, cell.packages[1])
    fa_s = P.cache_key(sg[0], sg[0].packages[2])
    assert fa_v != fa_s
    # same flash-attn, same torch/cuda/archs/python in two cells → same key (shared wheel)
    assert P.cache_key(replace(sg[0], torch=cell.torch), sg[0].packages[2]) == fa_v


@pytest.mark.pure
def test_plan_reports_reuse_for_a_complete_wheelhouse_entry(tmp_path):
    _, cs = cells(engines=("vllm",))
    wh = Wheelhouse(tmp_path / "wheelhouse")
    plans = P.plan_cells(cs, wh)
    assert [w.reuse for w in plans[0].wheels] == [False, False]
    fa = plans[0].wheels[1]
    src = tmp_path / "out"
    src.mkdir()
    (src / "flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl").write_bytes(b"PK fake wheel for the cache test")
    wheels = list(src.glob("*.whl"))
    wh.store("flash-attn", fa.key, wheels, {"package": "flash-attn", "files": file_records(wheels),
                                            "audit": {"ok": True, "archs": [80, 90]}})
    plans = P.plan_cells(cs, wh)
    assert [w.reuse for w in plans[0].wheels] == [False, True]
    # an entry whose recorded audit failed is no hit (plan says build and why)
    (Path(plans[0].wheels[1].hit.location) / "builder-wheel.json").write_text(
        json.dumps({"wheels": [w.name for w in wheels], "files": file_records(wheels), "audit": {"ok": False, "archs": [80, 90]}}))
    again = P.plan_cells(cs, wh)[0].wheels[1]
    assert again.reuse is False and again.hit.problem == "its recorded audit did not pass"
    assert "cached entry unusable: its recorded audit did not pass" in P.format_plan(P.plan_cells(cs, wh))
    # an entry without its manifest (interrupted store) is not a hit
    half = wh.entry_dir("vllm", plans[0].wheels[0].key)
    half.mkdir(parents=True)
    (half / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl").write_bytes(b"x")
    assert P.plan_cells(cs, wh)[0].wheels[0].reuse is False


def test_plan_json_lists_every_cell_with_tag_packages_and_keys():
    res = run_cli("plan", "--matrix", str(MATRIX), "--profile", "all", "--json")
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert len(data["cells"]) == 4
    for c in data["cells"]:
        assert c["image"].startswith("127.0.0.1:5000/builder/")
        for p in c["packages"]:
            assert len(p["cache_key"]) == 64 and p["action"] in ("build", "reuse")
    v063 = next(c for c in data["cells"] if c["id"].startswith("vllm-0.6.3"))
    assert v063["packages"][0]["knobs"] == {"TORCH_CUDA_ARCH_LIST": "8.0 9.0", "VLLM_FA_CMAKE_GPU_ARCHES": "80-real;90-real"}


def test_plan_text_shows_tag_knobs_and_keys():
    res = run_cli("plan", "--matrix", str(MATRIX), "--engine", "sglang", "--arch", "80,90")
    assert res.exit_code == 0
    out = res.output
    assert "127.0.0.1:5000/builder/sglang:0.5.23-cu130-torch2.14.1-py312-sm80.90" in out
    assert "sglang-kernel==0.4.10" in out and "ENABLE_BELOW_SM90='ON'" in out
    assert "FLASH_ATTN_CUDA_ARCHS='80;90'" in out
    assert "UNPINNED: source https://github.com/sgl-project/sglang@v0.5.23" in out  # the lock could not resolve the tag here


def test_plan_says_fa3_is_switched_off_where_no_requested_gpu_loads_it():
    """--arch 100 (B200): sglang-kernel's FlashAttention 3 (flash_ops, loaded on sm_8x and 9.0 only) is switched off,
    said among the knobs and on flash_ops' own line, and its 372 units leave the count; 80,90 keeps it."""
    res = run_cli("plan", "--matrix", str(MATRIX), "--engine", "sglang", "--arch", "100")
    assert res.exit_code == 0, res.output
    out = res.output
    kernel = next(line for line in out.splitlines() if "sglang-kernel==0.4.10" in line)
    assert "ENABLE_BELOW_SM90='OFF'" in kernel and "SGL_KERNEL_ENABLE_FA3='OFF'" in kernel
    flash = next(line for line in out.splitlines() if line.strip().startswith("sgl_kernel/flash_ops "))
    assert "not built: SGL_KERNEL_ENABLE_FA3=OFF" in flash and "0 of  1116 kernel×arch units" in flash
    assert "132 of  1725" in out  # 504 with FA3 at its default
    res = run_cli("plan", "--matrix", str(MATRIX), "--engine", "sglang", "--arch", "100", "--json")
    (cell,) = json.loads(res.output)["cells"]
    knobs = next(p for p in cell["packages"] if p["name"] == "sglang-kernel")["knobs"]
    assert knobs == {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_ENABLE_FA3": "OFF"}
    res = run_cli("plan", "--matrix", str(MATRIX), "--engine", "sglang", "--arch", "80,90")
    assert "SGL_KERNEL_ENABLE_FA3" not in res.output and "not built: " not in res.output.replace("(not built by", "")


@pytest.mark.pure
def test_the_kernel_builds_from_its_own_directory_and_the_key_says_which():
    """sglang-kernel 0.4.10 (from 0.4.6 on) builds from python/sglang/kernels/aot, 0.4.5 still from sgl-kernel/; the
    directory is one of the key's inputs, so a wheel built from another directory of the same commit is not reused."""
    from builder.engines import recipe

    assert recipe("sglang-kernel", "0.4.10").source_subdir == "python/sglang/kernels/aot"
    assert recipe("sglang-kernel", "0.4.6").source_subdir == "python/sglang/kernels/aot"
    assert recipe("sglang-kernel", "0.4.5").source_subdir == "sgl-kernel"
    _, (cell,) = cells(engines=("sglang",))
    kernel = next(p for p in cell.packages if p.name == "sglang-kernel")
    assert kernel.source.subdir == "python/sglang/kernels/aot"
    assert P.key_inputs(cell, kernel)["source_subdir"] == "python/sglang/kernels/aot"
    moved = replace(kernel, source=replace(kernel.source, subdir="sgl-kernel"))
    assert P.cache_key(cell, moved) != P.cache_key(cell, kernel)


@pytest.mark.pure
def test_matrix_json_is_github_actions_include_shape():
    res = run_cli("matrix", "--matrix", str(MATRIX), "--profile", "all")
    data = json.loads(res.output)
    assert list(data) == ["include"] and len(data["include"]) == 4
    assert {"cell", "engine", "version", "archs", "image", "profile"} <= set(data["include"][0])


def test_plan_needs_no_docker_nor_network(tmp_path):
    """The whole matrix, as a subprocess with docker (and everything else) removed from PATH and no route
    to an index: plan asks only the local wheelhouse. Its speed is benchmarks/plan_speed.py's business."""
    env = {**os.environ, "PATH": str(tmp_path), "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    res = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--profile", "all", "--matrix", str(MATRIX)],
                         capture_output=True, text=True, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("image ") == 4


def _verbs(group, prefix=()):
    """Every verb of the command line, nested ones (`wheels ls`, `bench diff`) included."""
    import click

    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # click's walk: the top group loads its verbs' modules on this call
        command = group.get_command(ctx, name)
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _verbs(command, (*prefix, name))


def test_a_verb_loads_only_its_own_module_and_every_verb_is_mapped_to_the_module_declaring_it():
    """`builder plan` must not pay for importing build, smoke, bench... (a refusal of bad input has 1 s of CPU):
    a fresh interpreter asked for one verb imports that verb's module and no other verb module. And the map
    is whole: each verb, asked for alone in a fresh interpreter, is found in the module the map names, and
    every verb module of builder/cli is in the map."""
    from builder.cli.app import VERB_MODULES

    probe = (
        "import sys, json, click\n"
        "from builder.cli import main\n"
        "cmd = main.get_command(click.Context(main), sys.argv[1])\n"
        "print(json.dumps([cmd is not None and cmd.name,"
        " sorted(m for m in sys.modules if m.startswith('builder.cli.'))]))\n"
    )
    not_verbs = {"builder.cli.app", "builder.cli.flags", "builder.cli.__main__"}
    for verb, module in VERB_MODULES.items():
        out = subprocess.run([sys.executable, "-c", probe, verb], capture_output=True, text=True, check=True).stdout
        name, loaded = json.loads(out)
        assert name == verb, f"{verb}: not declared by builder/cli/{module}.py"
        assert set(loaded) - not_verbs == {f"builder.cli.{module}"}, f"{verb} loaded {loaded}"
    modules = {p.stem for p in (REPO / "builder" / "cli").glob("*.py")} - {"__init__", "__main__", "app", "flags"}
    assert modules == set(VERB_MODULES.values())


@pytest.mark.pure
def test_every_verb_help_shows_an_example_and_the_exit_codes():
    """Every verb main knows, found by walking the group (a new verb cannot be forgotten here): an example and
    its exit codes, the shared ones or a verb's own (smoke, bench) with the same 0/1/2/3 meanings."""
    from builder.cli import main

    codes = ["0  all ok", "1  a cell failed", "2  bad input, refused before anything ran",
             "3  the environment is missing or unreachable"]
    verbs = list(_verbs(main))
    assert len(verbs) >= 20 and ("wheels", "prune") in verbs and ("bench", "diff") in verbs, verbs
    for verb in verbs:
        res = run_cli(*verb, "--help")
        assert res.exit_code == 0 and "Example:" in res.output, verb
        assert "Exit codes" in res.output, (verb, res.output)
        own = [line.strip() for line in res.output.splitlines() if line.strip()[:3] in ("0  ", "1  ", "2  ", "3  ")]
        assert [line[:1] for line in own] == ["0", "1", "2", "3"], (verb, own)
        assert "2  bad input" in res.output, verb
        if verb[0] not in ("smoke", "bench"):
            assert all(c in res.output for c in codes), (verb, res.output)
    top = run_cli("--help").output
    assert "Example:" in top and all(c in top for c in codes)
