"""builder.doctor against the real daemon and a real registry."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from builder import doctor
from builder.doctor import Check, check_gpus, check_host_nvcc, check_registry, run_checks
from builder.errors import EXIT_ENVIRONMENT

pytestmark = pytest.mark.docker


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_checks_report_the_real_engine(docker_engine, registry):
    checks = run_checks(registry)
    named = by_name(checks)
    gpu_names = ["GPU containers"] if shutil.which("nvidia-smi") else []
    assert [c.name for c in checks] == [
        "docker client", "docker daemon", "buildx", "BuildKit", "containerd snapshotter", "skopeo", "registry",
        "NVIDIA GPUs", *gpu_names, "nvcc (host)",
    ]  # fmt: skip

    for name in ("docker client", "docker daemon", "buildx", "BuildKit", "containerd snapshotter", "skopeo", "registry"):
        assert named[name].ok, named[name]

    server = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert named["docker daemon"].detail.startswith(server)
    assert server == docker_engine.server_version
    assert named["buildx"].detail == docker_engine.buildx_version
    assert Version(named["buildx"].detail.split("+")[0]) >= Version("0.13")
    assert named["docker client"].detail.startswith(docker_engine.client_version)
    assert docker_engine.containerd_snapshotter
    assert named["registry"].detail == f"http://{registry}/v2/ answers 200 (no auth)"
    # A check carries a fix exactly when it fails (the failing side: the tests below).
    assert [c.name for c in checks if c.fix] == [c.name for c in checks if not c.ok]


def test_gpu_check_matches_this_host():
    checks = run_checks()
    named = by_name(checks)
    assert "registry" not in named
    gpus = named["NVIDIA GPUs"]
    if shutil.which("nvidia-smi") is None:
        # no driver tools here: informational, builds need no GPU, and no container-runtime check follows
        assert gpus == Check("NVIDIA GPUs", True, "no GPU (nvidia-smi not found): GPU boot tests will skip")
        assert "GPU containers" not in named
    else:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0 and listed.stdout.strip(), f"nvidia-smi is on PATH but fails: {listed.stderr}"
        first = [f.strip() for f in listed.stdout.splitlines()[0].split(",")]
        assert gpus.ok, gpus
        assert f"{first[1]} (sm_{first[3].replace('.', '')})" in gpus.detail
        assert gpus.detail.endswith(f"; driver {first[1]}")
        assert "GPU containers" in named


def _fake_nvcc(path: Path, release: str) -> Path:
    """A TEST DOUBLE of a toolkit's nvcc: prints what nvcc --version prints, for `release`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.41'\n")
    path.chmod(0o755)
    return path


def test_host_nvcc_is_looked_up_on_path_then_cuda_then_the_newest_toolkit(tmp_path, monkeypatch):
    root = tmp_path / "usr-local"
    monkeypatch.setattr(doctor, "CUDA_ROOT", root)
    on_path = _fake_nvcc(tmp_path / "bin" / "nvcc", "12.9")
    default = _fake_nvcc(root / "cuda" / "bin" / "nvcc", "12.8")
    for release in ("9.2", "13.0", "12.4"):
        _fake_nvcc(root / f"cuda-{release}" / "bin" / "nvcc", release)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert check_host_nvcc() == Check("nvcc (host)", True, f"12.9 (V12.9.41) at {on_path}")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert check_host_nvcc() == Check("nvcc (host)", True, f"12.8 (V12.8.41) at {default}")
    shutil.rmtree(root / "cuda")
    # the newest by version: as text, cuda-9.2 would sort after cuda-13.0
    assert check_host_nvcc() == Check("nvcc (host)", True, f"13.0 (V13.0.41) at {root / 'cuda-13.0' / 'bin' / 'nvcc'}")
    shutil.rmtree(root)
    assert check_host_nvcc() == Check("nvcc (host)", True, "not found; not needed: images compile with their own nvcc")


def test_host_nvcc_check_reads_the_real_toolkit(nvcc, tmp_path, monkeypatch):
    """This machine's CUDA 13 nvcc (the nvcc fixture), found on PATH: its release and full version, and where."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(nvcc)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    check = check_host_nvcc()
    assert check.ok and check.fix is None, check
    assert re.fullmatch(rf"13\.\d+ \(V13\.\d+\.\d+\) at {re.escape(str(tmp_path / 'bin' / 'nvcc'))}", check.detail), check


def _fake_tool(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\n" + script + "\n")
    tool.chmod(0o755)


def test_gpu_and_nvcc_checks_read_what_the_tools_print(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    _fake_tool(bindir, "nvidia-smi", "[ \"$1\" = -q ] && exit 0; echo '0, NVIDIA H200, 570.124.06, 9.0'; echo '1, NVIDIA H200, 570.124.06, 9.0'")
    _fake_tool(bindir, "nvcc", "echo 'Cuda compilation tools, release 12.8, V12.8.93'")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert check_gpus() == (Check("NVIDIA GPUs", True, "2 x NVIDIA H200 (sm_90); driver 570.124.06"), True)
    assert check_host_nvcc() == Check("nvcc (host)", True, f"12.8 (V12.8.93) at {bindir / 'nvcc'}")
    assert "GPU containers" in by_name(run_checks())


def test_broken_gpu_driver_and_nvcc_fail_with_a_fix(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    _fake_tool(bindir, "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver' >&2; exit 9")
    _fake_tool(bindir, "nvcc", "echo 'nvcc: cannot execute' >&2; exit 126")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    gpus, found = check_gpus()
    assert not gpus.ok and not found
    assert gpus.detail == "nvidia-smi fails: NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"
    assert "fix the NVIDIA driver installation" in gpus.fix
    nvcc = check_host_nvcc()
    assert not nvcc.ok and nvcc.detail == f"{bindir / 'nvcc'} --version fails: nvcc: cannot execute"
    assert nvcc.fix == f"repair or remove {bindir / 'nvcc'}; the host nvcc is optional"


def test_auth_registry_counts_as_reachable(auth_registry):
    check = check_registry(auth_registry.host)
    assert check == Check("registry", True, f"http://{auth_registry.host}/v2/ answers 401 (auth required)")


def test_closed_port_is_reported_with_a_fix():
    host = f"127.0.0.1:{closed_port()}"
    check = check_registry(host, timeout=3)
    assert not check.ok
    assert host in check.detail
    assert check.fix and "/v2/" in check.fix
    named = by_name(run_checks(host))
    assert not named["registry"].ok and named["registry"].fix


def test_unreachable_daemon_fails_with_the_setup_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    named = by_name(run_checks())
    for name in ("docker daemon", "BuildKit", "containerd snapshotter"):
        assert not named[name].ok, named[name]
        assert "scripts/setup-docker.sh" in named[name].fix
    assert named["docker client"].ok  # the client itself is fine


def test_doctor_cli_reports_every_check(registry):
    """The `builder doctor` verb over the real daemon and a real registry on 127.0.0.1."""
    import json as _json

    from tests.helpers import run_cli

    res = run_cli("doctor", "--registry", registry, "--json")
    checks = {c["name"]: c for c in _json.loads(res.output)}
    assert {"docker client", "docker daemon", "buildx", "BuildKit", "containerd snapshotter", "skopeo", "registry",
            "NVIDIA GPUs"} <= set(checks), sorted(checks)
    assert all(checks[n]["ok"] for n in ("docker daemon", "buildx", "registry")), checks
    assert checks["registry"]["detail"] == f"http://{registry}/v2/ answers 200 (no auth)"
    assert res.exit_code == (0 if all(c["ok"] for c in checks.values()) else EXIT_ENVIRONMENT), res.output
    text = run_cli("doctor", "--registry", registry)
    assert text.exit_code == res.exit_code
    lines = text.output.splitlines()
    for c in checks.values():  # one line per check, as the JSON says: ok/FAIL, name, detail
        assert f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']:<22} {c['detail']}" in lines, (c, text.output)
    closed = run_cli("doctor", "--registry", "127.0.0.1:9")
    assert closed.exit_code == EXIT_ENVIRONMENT  # a failing check: the host must be fixed
    fail = next(i for i, line in enumerate(closed.output.splitlines()) if line.startswith("FAIL registry "))
    assert "not reachable: http://127.0.0.1:9/v2/" in closed.output.splitlines()[fail]
    assert "fix: start the registry or fix the address" in closed.output.splitlines()[fail + 1]
