"""Session fixtures for tests that need the Docker engine, local base images, a registry or a CUDA toolkit, and
the markers that say so.

- ``docker_engine``: the daemon answers and buildx works, else the test FAILS (never skips) and says
  to run ``scripts/setup-docker.sh``.
- ``local_bases``: ``scripts/make-local-bases.sh`` has built the local stand-ins for nvidia/cuda.
- ``registry`` / ``auth_registry``: a throwaway ``docker-registry`` on 127.0.0.1.
- ``nvcc`` / ``cuobjdump``: the host's CUDA 13 compiler and the fatbin dumper (the test extra's wheel).

Any test using one of the first four is marked ``docker`` automatically (and, with every test under tests/docker/
and tests/gpu/, run on one of scripts/test's two workers, in order: ``pytest_xdist_make_scheduler`` below), one using ``nvcc`` or ``cuobjdump``
(directly or through another fixture) ``toolchain``: ``-m "not toolchain"`` runs the suite on a machine without a
CUDA toolkit. A test marked ``pure`` runs in-process only: starting any subprocess fails it (the guard below), so
the fast tier (``-m pure``) cannot shell out by accident.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from .helpers import ShellOut, free_port, registry_config_lines, stop_process

# testcontainers' Ryuk reaper image cannot be pulled here; tests remove what they start.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

REPO = Path(__file__).resolve().parent.parent
SETUP_HINT = "run scripts/setup-docker.sh (as root) to install and start the Docker engine"

LOCAL_DEBIAN = "builder-local/debian:bookworm"
LOCAL_CUDA_DEVEL = "builder-local/cuda:13.0-devel"
LOCAL_CUDA_BASE = "builder-local/cuda:13.0-base"

DOCKER_FIXTURES = frozenset({"docker_engine", "local_bases", "registry", "auth_registry"})
TOOLCHAIN_FIXTURES = frozenset({"nvcc", "cuobjdump"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker: needs the Docker engine that .ci/run starts")
    config.addinivalue_line("markers", "toolchain: needs the host's CUDA toolkit (nvcc) or cuobjdump (conftest)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if DOCKER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.docker)
        if TOOLCHAIN_FIXTURES & fixtures:
            item.add_marker(pytest.mark.toolchain)
        if item.get_closest_marker("pure") and (DOCKER_FIXTURES | TOOLCHAIN_FIXTURES) & fixtures:
            raise pytest.UsageError(f"{item.nodeid} is marked pure but uses {sorted((DOCKER_FIXTURES | TOOLCHAIN_FIXTURES) & fixtures)}")
        if "local_bases" in fixtures:  # the bases come from Debian's archive and PyPI; builds on them pip-install
            item.add_marker(pytest.mark.network)


# -- two workers ---------------------------------------------------------------------------------------------------
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """scripts/test runs two workers (pytest-xdist): every test that drives the daemon or a GPU is one unit of work,
    which one worker runs in collection order as if it ran alone (module fixtures shared, no two builds racing for
    two cores); every other test is a unit of its own, and they fill the other worker. (xdist's own loadgroup
    cannot be used: it renames an item through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class DaemonTestsInOrder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "docker" if drives_the_daemon(nodeid) else nodeid

    return DaemonTestsInOrder(config, log)


def drives_the_daemon(nodeid: str) -> bool:
    """tests/docker/ and tests/gpu/, and a test elsewhere that asks for a Docker fixture by name."""
    path, _, rest = nodeid.partition("::")
    if path.startswith(("tests/docker/", "tests/gpu/")):
        return True
    return rest.split("[")[0] in _daemon_tests(path)


@functools.cache
def _daemon_tests(path: str) -> frozenset[str]:
    """The test functions of the module at `path` whose parameters name a Docker fixture."""
    import ast

    try:
        tree = ast.parse((REPO / path).read_text())
    except (OSError, SyntaxError):
        return frozenset()
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                     and node.name.startswith("test") and DOCKER_FIXTURES & {a.arg for a in node.args.args})


def _no_subprocess(what: str, method: bool = False):
    def refuse(*args, **kwargs):
        args = args[1:] if method else args  # Popen.__init__(self, args, ...)
        cmd = args[0] if args else kwargs.get("args", kwargs.get("path", "?"))
        raise ShellOut(f"a test marked pure started a subprocess ({what}: {cmd!r}); drop the pure mark or keep it "
                       "in-process")

    return refuse


@pytest.fixture
def no_git_mirrors() -> Iterator[None]:
    """No git mirror map in force before or after the test (builder/gitmirror.py keeps the map process-wide, and
    activating one also sets an environment variable): for the modules that activate maps of their own."""
    from builder import gitmirror

    gitmirror.activate(())
    yield
    gitmirror.activate(())


@pytest.fixture(autouse=True)
def pure_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests marked pure: every way Python starts a program raises ShellOut (subprocess.Popen under run,
    check_output and asyncio's subprocesses; os.system, os.posix_spawn*, os.exec*, os.fork)."""
    if request.node.get_closest_marker("pure") is None:
        return
    monkeypatch.setattr(subprocess.Popen, "__init__", _no_subprocess("subprocess.Popen", method=True))
    for name in ("system", "posix_spawn", "posix_spawnp", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
                 "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _no_subprocess(f"os.{name}"))


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


class DockerEngine(NamedTuple):
    server_version: str
    client_version: str
    buildx_version: str
    containerd_snapshotter: bool


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    """The Docker daemon answers and buildx works; fails (never skips) otherwise."""
    if shutil.which("docker") is None:
        pytest.fail(f"no docker client on PATH: {SETUP_HINT}", pytrace=False)
    try:
        info = _run(["docker", "info", "--format", "{{json .}}"], timeout=30)
        buildx = _run(["docker", "buildx", "version"], timeout=30)
        version = _run(["docker", "version", "--format", "{{json .}}"], timeout=30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(exc.cmd)} timed out: {SETUP_HINT}", pytrace=False)
    if info.returncode != 0:
        pytest.fail(f"docker info fails ({info.stderr.strip()}): {SETUP_HINT}", pytrace=False)
    if buildx.returncode != 0:
        pytest.fail(f"docker buildx version fails ({buildx.stderr.strip()}): {SETUP_HINT}", pytrace=False)
    data = json.loads(info.stdout)
    ver = json.loads(version.stdout) if version.returncode == 0 else {}
    driver_status = dict(tuple(x) for x in (data.get("DriverStatus") or []) if len(x) == 2)
    snapshotter = driver_status.get("driver-type") == "io.containerd.snapshotter.v1"
    parts = buildx.stdout.split()
    return DockerEngine(
        server_version=data.get("ServerVersion", ""),
        client_version=(ver.get("Client") or {}).get("Version", ""),
        buildx_version=parts[1] if len(parts) > 1 else buildx.stdout.strip(),
        containerd_snapshotter=snapshotter,
    )


@pytest.fixture(scope="session")
def local_bases(docker_engine: DockerEngine) -> dict[str, str]:
    """Builds (once; existing images are kept) the local base images; returns their names:
    ``{"debian": ..., "cuda_devel": ..., "cuda_base": ...}``."""
    script = REPO / "scripts" / "make-local-bases.sh"
    try:
        proc = _run([str(script)], timeout=1800)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} ran for more than 30 minutes", pytrace=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        pytest.fail(f"scripts/make-local-bases.sh failed (exit {proc.returncode}):\n{tail}", pytrace=False)
    return {"debian": LOCAL_DEBIAN, "cuda_devel": LOCAL_CUDA_DEVEL, "cuda_base": LOCAL_CUDA_BASE}


# --- registries ------------------------------------------------------------------------------



def _v2_status(host: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None



def _start_registry(root: Path, auth: tuple[str, str] | None = None) -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail(f"docker-registry is not installed: {SETUP_HINT}", pytrace=False)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host = f"127.0.0.1:{port}"
    lines = registry_config_lines(root, host)
    if auth is not None:
        htpasswd = shutil.which("htpasswd")
        if htpasswd is None:
            pytest.fail(f"htpasswd (apache2-utils) is not installed: {SETUP_HINT}", pytrace=False)
        user, password = auth
        entry = _run([htpasswd, "-Bbn", user, password], timeout=30)
        assert entry.returncode == 0, entry.stderr
        (root / "htpasswd").write_text(entry.stdout.strip() + "\n")
        lines += ["auth:", "  htpasswd:", "    realm: builder-test", f"    path: {root / 'htpasswd'}"]
    config = root / "config.yml"
    config.write_text("\n".join(lines) + "\n")
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        expected = 401 if auth else 200
        while (status := _v2_status(host)) != expected:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = (root / "registry.log").read_text(errors="replace")[-3000:]
                pytest.fail(
                    f"docker-registry on {host} did not come up (last GET /v2/: {status}):\n{out}",
                    pytrace=False,
                )
            time.sleep(0.1)
        yield host
    finally:
        stop_process(proc, 10)
        log.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A plain-HTTP registry without auth; yields ``"127.0.0.1:PORT"``."""
    yield from _start_registry(tmp_path_factory.mktemp("registry"))


class AuthRegistry(NamedTuple):
    host: str
    user: str
    password: str


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthRegistry]:
    """A plain-HTTP registry with htpasswd (bcrypt) auth; yields ``(host, user, password)``."""
    user, password = "builder", "s3cret-" + os.urandom(6).hex()
    for host in _start_registry(tmp_path_factory.mktemp("auth-registry"), auth=(user, password)):
        yield AuthRegistry(host, user, password)


CUDA_FALLBACK = Path("/usr/local/cuda-13.0")


def _first_file(candidates) -> Path | None:
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    return None


@pytest.fixture(scope="session")
def nvcc() -> Path:
    cuda_home = os.environ.get("CUDA_HOME")
    found = _first_file(
        [
            shutil.which("nvcc"),
            Path(cuda_home, "bin", "nvcc") if cuda_home else None,
            CUDA_FALLBACK / "bin" / "nvcc",
        ]
    )
    if found is None:
        pytest.fail(
            "nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda-13.0/bin): these tests compile "
            "small CUDA libraries and need a CUDA 13 toolkit"
        )
    return found


@pytest.fixture(scope="session")
def cuobjdump() -> Path:
    """cuobjdump to cross-check the audit: the nvidia-cuda-cuobjdump wheel's (test extra), else a CUDA 13 toolkit's."""
    candidates: list = []
    try:
        import nvidia  # namespace package of the wheel: site-packages/nvidia/cu13/bin/cuobjdump

        for base in nvidia.__path__:
            candidates += sorted(Path(base).glob("cu*/bin/cuobjdump"))
    except ImportError:
        pass
    candidates += [Path("/usr/local/cuda-13.0/bin/cuobjdump"), shutil.which("cuobjdump")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    pytest.fail("cuobjdump not found: install the test extra (pip install -e '.[test]' brings nvidia-cuda-cuobjdump) "
                "or a CUDA 13 toolkit at /usr/local/cuda-13.0")
