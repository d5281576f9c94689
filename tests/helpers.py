"""Helpers shared by the tests (no fixtures here: see conftest.py). Test modules import from here, never from each
other."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from click.testing import CliRunner

from builder import matrix as matrix_mod
from builder import resolve
from builder.cache import file_records
from builder.cli import main
from builder.steps import CellContext, Status, StepResult

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "matrix.toml"


def run_cli(*args: str, cwd: Path | None = None):
    """Invoke the real click entry point in-process; returns click's Result."""
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, list(args), catch_exceptions=False)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def write_matrix(tmp: Path, text: str, lock_from: Path = REPO / "matrix.lock") -> Path:
    """A matrix file in tmp, next to a copy of the real lock file."""
    path = tmp / "matrix.toml"
    path.write_text(textwrap.dedent(text))
    if lock_from is not None:
        (tmp / "matrix.lock").write_text(lock_from.read_text())
    return path


class ShellOut(AssertionError):
    """A test marked pure started a subprocess (conftest's pure_guard)."""


# -- processes and ports on 127.0.0.1 ------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registry_config_lines(root: Path, host: str) -> list[str]:
    """docker-registry's config.yml: data under ROOT/data, deletes allowed, listening on HOST (127.0.0.1:PORT)."""
    return ["version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:", f"    rootdirectory: {root / 'data'}",
            "  delete:", "    enabled: true", "http:", f"  addr: {host}"]


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- rendered Dockerfiles ------------------------------------------------------------------------------------
def stage_lines(text: str, name: str) -> list[str]:
    """The lines of stage `name`: its FROM line up to the next FROM (comment lines included)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.fullmatch(rf"FROM \S+ AS {re.escape(name)}", ln)), None)
    assert start is not None, f"the rendered Dockerfile has no stage {name}"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM ")), len(lines))
    return lines[start:end]


def instructions(lines: list[str]) -> list[str]:
    """Dockerfile instructions, continuation lines joined with their line breaks kept; comments dropped."""
    out: list[str] = []
    cur: list[str] = []
    for ln in lines:
        if not cur and (not ln.strip() or ln.lstrip().startswith("#")):
            continue
        cur.append(ln)
        if not ln.endswith("\\"):
            out.append("\n".join(cur))
            cur = []
    assert not cur, f"unterminated instruction: {cur}"
    return out


def env_of(instrs: list[str]) -> dict[str, str]:
    """The ENV NAME="value" instructions among `instrs`."""
    env = {}
    for ins in instrs:
        m = re.fullmatch(r'ENV (\w+)="([^"]*)"', ins)
        if m:
            env[m.group(1)] = m.group(2)
    return env


# -- CUDA sources and wheels ---------------------------------------------------------------------------------
# a one-kernel CUDA library (nvcc builds it: tests marked toolchain)
KERNEL_A = r"""
extern "C" __global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }
extern "C" void launch_scale(float *x, float a) { scale<<<1, 32>>>(x, a); }
"""

def a_wheel(dest: Path, payload: bytes = b"print('hello')\n") -> Path:
    """A small pure-Python wheel demo-1.0 in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo/__init__.py", payload)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    return path


# -- the sglang-kernel project file (scikit-build-core) ------------------------------------------------------
KERNEL_PYPROJECT = """\
[build-system]
requires = ["scikit-build-core>=0.10"]
build-backend = "scikit_build_core.build"

[project]
name = "sglang-kernel"
version = "0.4.10"
"""


# -- test doubles of the compile and image steps (no BuildKit) -----------------------------------------------
def pure_wheel(dest: Path, dist: str = "cuda_ext", version: str = "1.0.0") -> Path:
    """A valid wheel with Python code only: what a build gives when a knob switched its CUDA part off."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}/__init__.py", "")
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{dist}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
        zf.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


class FakeCompile:
    """Test double for the compile step (no BuildKit here): exports a given wheel, or raises."""

    name = "compile"
    scope = "package"

    def __init__(self, fail_for: dict[str, Exception] | None = None):
        self.fail_for = fail_for or {}
        self.ran: list[str] = []

    def run(self, ctx: CellContext, wheel) -> StepResult:
        name = wheel.package.name
        self.ran.append(name)
        if name in self.fail_for:
            raise self.fail_for[name]
        ctx.wheels[name] = [pure_wheel(ctx.out_dir(name), name.replace("-", "_"))]
        ctx.records[name] = file_records(ctx.wheels[name])
        return StepResult(self.name, name, Status.OK, artifacts={"reused": False})

    def dry_run(self, ctx, wheel):
        return []


class FakeImage:
    """Test double for the image step: records that tagging was attempted."""

    name = "image"
    scope = "cell"

    def __init__(self):
        self.ran = 0

    def run(self, ctx, wheel=None) -> StepResult:
        self.ran += 1
        return StepResult(self.name, ctx.cell.id, Status.OK, artifacts={"image": ctx.cell.ref, "digest": "sha256:" + "0" * 64})

    def dry_run(self, ctx, wheel=None):
        return []


# -- the smoke stand-in (tests/fixtures/smoke) ---------------------------------------------------------------
SMOKE_FIXTURE = REPO / "tests" / "fixtures" / "smoke"  # a TEST DOUBLE of an engine server
SMOKE_MATRIX = SMOKE_FIXTURE / "matrix.toml"
SMOKE_CELL = "stand-in-engine-1.0.0-cu130-py311-sm80.90"


def stand_in_cell():
    """The stand-in engine's cell of tests/fixtures/smoke/matrix.toml."""
    m = matrix_mod.load(SMOKE_MATRIX)
    return next(c for c in resolve.select(m, matrix_mod.Selection()) if c.id == SMOKE_CELL)


def stand_in_digest() -> str:
    """A short digest of the stand-in's files: its images are tagged with it."""
    h = hashlib.sha256()
    for f in sorted(p for p in SMOKE_FIXTURE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(SMOKE_FIXTURE)).encode() + f.read_bytes())
    return h.hexdigest()[:12]


def build_stand_in(tag: str, labels: list[tuple[str, str]], base: str) -> None:
    """docker buildx build the stand-in image FROM `base`, with these labels."""
    argv = ["docker", "buildx", "build", "--progress=plain", "--load", "-t", tag, "-f", str(SMOKE_FIXTURE / "Dockerfile"),
            "--build-arg", f"BASE={base}"]
    for k, v in labels:
        argv += ["--label", f"{k}={v}"]
    res = subprocess.run([*argv, str(SMOKE_FIXTURE)], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def smoke_leftovers(image: str) -> list[str]:
    """The containers smoke started from `image` that are still there."""
    out = subprocess.run(["docker", "ps", "-a", "--filter", "label=io.builder.smoke=1", "--filter", f"ancestor={image}",
                          "--format", "{{.ID}} {{.Status}}"], capture_output=True, text=True, check=True).stdout
    return out.split("\n")[:-1]


# -- the bench load generator --------------------------------------------------------------------------------
def client_python() -> str:
    """A Python with vLLM 0.26.0's load generator (BUILDER_BENCH_CLIENT_PYTHON, else a venv made once)."""
    given = os.environ.get("BUILDER_BENCH_CLIENT_PYTHON")
    if given:
        return given
    root = Path(os.environ.get("BUILDER_ENGINE_VENVS", Path.home() / ".cache" / "builder" / "engine-venvs")) / "bench-vllm-0.26.0"
    python = root / "bin" / "python"
    marker = root / ".builder-installed"
    if not marker.is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
        res = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "vllm==0.26.0", "pandas"], capture_output=True,
                             text=True, timeout=5400)
        assert res.returncode == 0, res.stderr[-3000:]
        marker.write_text("vllm==0.26.0 pandas\n")
    return str(python)
