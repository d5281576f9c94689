"""flash-attn 2.8.3 from its PyPI sdist, through the real template's stages on the local CUDA 13 base: one real
kernel source compiled with FLASH_ATTN_CUDA_ARCHS="80;90" holds SASS for sm_80 and sm_90 and nothing else.

The Dockerfile is `builder.render.render()` of the vLLM 0.33.0 cell of tests/fixtures/local-engines/matrix.toml,
unmodified, plus one appended test stage. The template's `build-flash-attn` stage ends with `pip wheel` of all
~70 kernel sources (hours on 2 cores), so the test stage `fa-one-kernel` repeats that stage instruction for
instruction (FROM torch, its ARGs and ENVs, COPY of /src from the sha256-checked `src-flash-attn` stage, the
build-requirements RUN) except its last one, the `pip wheel` RUN; in its place
tests/fixtures/local-engines/fa_one_kernel.py runs flash-attn's own setup.py with `setuptools.setup` recorded, and
builds the recorded extension, cut down to ONE source, with setup.py's own build_ext (torch's BuildExtension, ninja).
The -gencode flags come from setup.py's reading of FLASH_ATTN_CUDA_ARCHS; nothing here types them.

Slow: the `torch` stage installs torch 2.14.0 (the vLLM 0.33.0 pin, several GB of CUDA wheels) and nvcc compiles
one flash-attn source for two archs. Run with `pytest -m slow tests/docker/builds/test_flash_attn_kernel.py -s`.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from builder import plan, render
from builder.audit import audit, format_report, read_fatbin_entries
from builder.docker import BuildxCall, stream
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import REPO, env_of, instructions, stage_lines

pytestmark = pytest.mark.slow

FIXTURE = REPO / "tests" / "fixtures" / "local-engines"
MATRIX = FIXTURE / "matrix.toml"
DRIVER = FIXTURE / "fa_one_kernel.py"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CUDA_FALLBACK = Path("/usr/local/cuda-13.0")
# One of the extension's sources: the forward kernels of head dim 32, fp16, non-causal.
KERNEL = "csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu"
TEST_STAGE = "fa-one-kernel"
EXPORT_STAGE = "fa-one-kernel-out"
ASKED = (80, 90)


# --------------------------------------------------------------------------- Dockerfile text


def one_kernel_stage(build_instrs: list[str]) -> str:
    """build-flash-attn minus its final `pip wheel` RUN, then ONE kernel through setup.py, then the export."""
    body = build_instrs[1:-1]
    return "\n".join(
        [
            "# ---- test only: build-flash-attn as rendered above up to its `pip wheel`; then ONE kernel source",
            "# compiled by flash-attn's own setup.py (its flags, its build_ext), object exported from the next stage",
            f"FROM torch AS {TEST_STAGE}",
            *body,
            f"RUN --mount=type=bind,source={DRIVER.name},target=/usr/local/lib/{DRIVER.name} \\",
            f"    python /usr/local/lib/{DRIVER.name} {KERNEL} /out",
            f"FROM scratch AS {EXPORT_STAGE}",
            f"COPY --from={TEST_STAGE} /out/ /",
        ]
    ) + "\n"


# --------------------------------------------------------------------------- build.ninja → nvcc command


def nvcc_command(ninja_text: str) -> str:
    """The nvcc command ninja ran for the one object: torch's cuda_compile rule, variables expanded."""
    variables: dict[str, str] = {}
    rules: dict[str, str] = {}
    rule = None
    build = None
    for ln in ninja_text.splitlines():
        if m := re.fullmatch(r"rule (\S+)", ln):
            rule = m.group(1)
        elif rule and (m := re.fullmatch(r"\s+command = (.*)", ln)):
            rules[rule] = m.group(1)
        elif m := re.fullmatch(r"build (\S+): cuda_compile (\S+)", ln):
            build = (m.group(1), m.group(2))
            rule = None
        elif m := re.fullmatch(r"(\w+) = (.*)", ln):
            variables[m.group(1)] = m.group(2)
            rule = None
    assert build is not None and "cuda_compile" in rules, ninja_text
    variables.update({"out": build[0], "in": build[1]})
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), ""), rules["cuda_compile"]).strip()


def gencodes(argv: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a == "-gencode":
            out.append(argv[i + 1])
        elif a.startswith(("-gencode=", "--generate-code")):
            out.append(a.split("=", 1)[1])
    return out


def other_arch_flags(argv: list[str]) -> list[str]:
    """-arch / --gpu-architecture / -code flags besides -gencode (torch adds none when setup.py has -gencode)."""
    return [a for a in argv if re.match(r"(-arch|--gpu-architecture|-code|--gpu-code)(=|$)", a)]


# --------------------------------------------------------------------------- cuobjdump


def cuobjdump_list(tool: Path, option: str, path: Path) -> tuple[str, list[str]]:
    proc = subprocess.run([str(tool), option, str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "does not contain device code" not in proc.stderr:
        pytest.fail(f"cuobjdump {option} {path.name} failed: {proc.stderr.strip()}")
    names = re.findall(r"\.(sm_\d+[a-z]?)\.(?:cubin|ptx)$", proc.stdout, re.MULTILINE)
    return proc.stdout, sorted(names)


# --------------------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def one_kernel(local_bases, tmp_path_factory) -> dict:
    m = load(MATRIX)
    (cell,) = select(m, Selection())
    assert cell.base_devel == local_bases["cuda_devel"] and cell.base_runtime == local_bases["cuda_base"]
    (fa,) = [p for p in cell.packages if p.name == "flash-attn"]
    assert (fa.version, fa.source.kind, cell.torch) == ("2.8.3", "sdist", "2.14.0")
    assert fa.archs == ASKED and fa.built_archs == ASKED

    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    build_instrs = instructions(stage_lines(text, "build-flash-attn"))
    assert build_instrs[0] == "FROM torch AS build-flash-attn"
    assert build_instrs[-1].startswith("RUN ") and "pip wheel" in build_instrs[-1], build_instrs[-1]
    assert sum("/tmp/build-requirements.txt" in i for i in build_instrs[1:-1]) == 1, "no build-requirements step"
    assert "COPY --from=src-flash-attn /src /src" in build_instrs
    env = env_of(build_instrs)
    # The knob the template sets for --arch 80,90, and the switch without which setup.py downloads a wheel.
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "80;90" and dict(fa.knobs) == {"FLASH_ATTN_CUDA_ARCHS": "80;90"}
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"

    tmp = tmp_path_factory.mktemp("fa-one-kernel")
    context = tmp / "context"
    context.mkdir()
    shutil.copy2(DRIVER, context / DRIVER.name)
    dockerfile = tmp / "Dockerfile"
    dockerfile.write_text(text + one_kernel_stage(build_instrs))
    assert dockerfile.read_text().startswith(text), "the rendered template text must stay unmodified"
    out = tmp / "out"
    call = BuildxCall(
        dockerfile=dockerfile,
        context=context,
        target=EXPORT_STAGE,
        build_args=(("MAX_JOBS", "1"), ("NVCC_THREADS", "1")),
        secrets=(("ca", str(HOST_CA)),) if HOST_CA.is_file() else (),
        output=f"type=local,dest={out}",
    )
    argv = call.argv()
    print("\n$ " + shlex.join(argv), flush=True)
    log = tmp / "build.log"
    with log.open("w") as fh:
        seconds = stream(argv, fh, lambda line: print(line, flush=True))
    print(f"\nbuildx build --target {EXPORT_STAGE}: {seconds:.0f} s (log {log})", flush=True)
    flags = json.loads((out / "flags.json").read_text())
    return {"cell": cell, "fa": fa, "out": out, "flags": flags, "seconds": seconds, "log": log, "dockerfile": dockerfile}


def _object(out: Path) -> Path:
    objs = sorted(out.glob("*.o"))
    assert [o.name for o in objs] == [Path(KERNEL).stem + ".o"], sorted(p.name for p in out.iterdir())
    return objs[0]


def test_setup_py_turns_the_env_knob_into_exactly_the_asked_gencodes(one_kernel):
    flags = one_kernel["flags"]
    assert flags["env"]["FLASH_ATTN_CUDA_ARCHS"] == "80;90"
    assert flags["env"]["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert (flags["env"]["MAX_JOBS"], flags["env"]["NVCC_THREADS"]) == ("1", "1")
    assert flags["source"] == KERNEL and flags["sources_total"] > 50
    nvcc = flags["extra_compile_args"]["nvcc"]
    print("\nsetup.py extra_compile_args['nvcc']:", " ".join(nvcc))
    assert gencodes(nvcc) == ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]
    assert nvcc[-2:] == ["--threads", "1"]  # NVCC_THREADS, read by setup.py

    command = nvcc_command((one_kernel["out"] / "build.ninja").read_text())
    print("\nnvcc command (build.ninja):\n" + command)
    argv = shlex.split(command)
    if argv[0] == "ccache":  # torch's BuildExtension puts ccache (the toolchain installs it) in front of nvcc
        argv = argv[1:]
    assert Path(argv[0]).name == "nvcc"
    assert KERNEL in command
    # exactly setup.py's gencodes reach nvcc; torch's BuildExtension adds no arch flag of its own
    assert gencodes(argv) == gencodes(nvcc)
    assert other_arch_flags(argv) == []
    # the template's edit of setup.py (torch >= 2.13 needs C++20) is what the compile used
    assert "-std=c++20" in nvcc and "-std=c++17" not in command


def test_object_holds_sass_for_sm80_and_sm90_and_nothing_else(one_kernel):
    obj = _object(one_kernel["out"])
    entries = read_fatbin_entries(obj)
    print(f"\n{obj.name}: {obj.stat().st_size} bytes; fatbin entries: {[(e.name, e.compressed) for e in entries]}")
    assert {e.name for e in entries if e.kind == "sass"} == {"sm_80", "sm_90"}
    # -gencode arch=compute_XX,code=sm_XX asks for SASS only: no PTX, no LTO IR, no sm_90a
    assert [e for e in entries if e.kind != "sass"] == []
    assert all(e.variant == "" for e in entries)
    report = audit(obj, list(ASKED))
    print(format_report(report, verbose=True))
    assert report.ok and report.has_device_code
    (b,) = report.binaries
    assert (b.names("sass"), b.names("ptx"), b.names("other")) == (["sm_80", "sm_90"], [], [])


def test_linked_one_kernel_extension_has_the_same_archs(one_kernel):
    """setup.py's build_ext also linked flash_attn_2_cuda from the one object: the .so a wheel would ship."""
    report = audit(one_kernel["out"], list(ASKED))
    print("\n" + format_report(report, verbose=True))
    sos = [b for b in report.binaries if ".so" in b.path]
    assert len(sos) == 1 and sos[0].path.startswith("flash_attn_2_cuda")
    assert report.ok
    assert (sos[0].names("sass"), sos[0].names("ptx")) == (["sm_80", "sm_90"], [])


def test_cuobjdump_agrees(one_kernel, cuobjdump):
    tool = cuobjdump
    obj = _object(one_kernel["out"])
    elf_out, elf = cuobjdump_list(tool, "--list-elf", obj)
    ptx_out, ptx = cuobjdump_list(tool, "--list-ptx", obj)
    print(f"\n$ {tool.name} --list-elf {obj.name}\n{elf_out}$ {tool.name} --list-ptx {obj.name}\n{ptx_out or '(none)'}")
    ours = read_fatbin_entries(obj)
    assert sorted(set(elf)) == ["sm_80", "sm_90"]
    assert len(elf) == sum(e.kind == "sass" for e in ours)  # one cubin per SASS entry, as decoded
    assert ptx == []
