"""The runtime's JIT toolchain: what vLLM 0.33 / SGLang 0.5.23 need to compile kernels at first use, and what it costs.

The Docker half of tests/unit/render/test_runtime_jit.py: its docstring says the rest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.docker import BuildxCall, stream

from tests.helpers import instructions, stage_lines
from tests.support.runtime_jit import vllm_cell

pytestmark = pytest.mark.slow

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def jit_probe(text: str, jit: dict) -> str:
    """Two test stages from the rendered runtime stage: `no-jit` is it up to its wheel install; `jit` adds the
    stage's own JIT instructions (apt, then after the install its CUDA_HOME links, ENV and nvcc check) around a
    pip install of exactly the requirements its wheel install adds for the JIT."""
    runtime = instructions(stage_lines(text, "runtime"))
    wheels = next(i for i, ins in enumerate(runtime) if "/wheels/*.whl" in ins)
    apt = [ins for ins in runtime[:wheels] if "apt-get install" in ins and "g++" in ins]
    before = [ins for ins in runtime[1:wheels] if ins not in apt]
    after = []
    for ins in runtime[wheels + 1:]:
        if ins.startswith(("LABEL", "ENTRYPOINT")) or "importlib.util" in ins or "has_flashinfer" in ins:
            break
        after.append(ins)
    assert len(apt) == 1 and any("CUDA_HOME=/opt/cuda-jit" in a for a in after) and any("nvcc" in a for a in after)
    pip = " ".join(f"'{r}'" for r in jit["pip"])
    assert pip in runtime[wheels], "the runtime's wheel install adds the JIT requirements"
    return "\n".join([
        "ARG BASE_RUNTIME_IMAGE",
        "FROM ${BASE_RUNTIME_IMAGE} AS no-jit", *before,
        "FROM no-jit AS jit", *apt,
        "RUN --mount=type=secret,id=ca with-ca pip install --no-cache-dir " + pip, *after,
        "RUN nvcc --version && g++ --version | head -n 1 && python -c 'import os; print(os.environ[\"CUDA_HOME\"])'",
    ]) + "\n"


def _image_size(ref: str) -> tuple[int, int]:
    """(bytes as the image store reports the image, bytes of its unpacked file system by du)."""
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    du = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "du", ref, "-sxk", "/"],
                        capture_output=True, text=True)
    assert du.returncode == 0, du.stderr
    return int(out.stdout.strip()), int(du.stdout.split()[0]) * 1024


def test_runtime_jit_instructions_compile_a_kernel_and_their_size_is_known(local_bases, tmp_path):
    m, cell, text = vllm_cell()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(jit_probe(text, cell.runtime_jit))
    context = tmp_path / "context"
    context.mkdir()
    secrets = (("ca", str(HOST_CA)),) if HOST_CA.is_file() else ()
    sizes = {}
    with (tmp_path / "build.log").open("w") as log:
        for target in ("no-jit", "jit"):
            tag = f"builder-test/runtime-{target}:{cell.id}"
            stream(BuildxCall(dockerfile=dockerfile, context=context, target=target, secrets=secrets, load=True,
                              build_args=(("BASE_RUNTIME_IMAGE", local_bases["cuda_base"]),), tags=(tag,)).argv(),
                   log, lambda line: print(line, flush=True))
            sizes[target] = _image_size(tag)
    stored = sizes["jit"][0] - sizes["no-jit"][0]
    unpacked = sizes["jit"][1] - sizes["no-jit"][1]
    print(f"\nruntime JIT toolchain ({', '.join(cell.runtime_jit['pip'] + cell.runtime_jit['apt'])}): "
          f"+{unpacked / 2**20:.0f} MiB unpacked (du), +{stored / 2**20:.0f} MiB as the image store counts it")
    # nvcc + headers + g++: hundreds of MB, where a CUDA devel base adds 4-5 GB compressed
    assert 100 * 2**20 < stored <= unpacked < 1024 * 2**20, sizes
