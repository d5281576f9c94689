"""builder.doctor against the real daemon and a real registry."""

from __future__ import annotations

import dataclasses
import socket
import subprocess

import pytest
from packaging.version import Version

from builder.doctor import Check, check_registry, run_checks

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
    assert len(named) == len(checks), "check names are unique"
    assert all(isinstance(c, Check) for c in checks)
    with pytest.raises(dataclasses.FrozenInstanceError):
        checks[0].ok = False  # type: ignore[misc]

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
    assert registry in named["registry"].detail and "200" in named["registry"].detail
    # Failing checks always say how to fix them; passing ones need not.
    assert all(c.fix for c in checks if not c.ok)


def test_gpu_and_nvcc_checks_are_informational_when_absent(docker_engine):
    named = by_name(run_checks())
    assert "registry" not in named
    gpus = named["NVIDIA GPUs"]
    assert gpus.ok or gpus.fix
    if "no GPU" in gpus.detail:
        assert gpus.ok and "GPU containers" not in named
    assert named["nvcc (host)"].ok or named["nvcc (host)"].fix


def test_auth_registry_counts_as_reachable(auth_registry):
    check = check_registry(auth_registry.host)
    assert check.ok, check
    assert "401" in check.detail


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

    from .helpers import run_cli

    res = run_cli("doctor", "--registry", registry, "--json")
    checks = {c["name"]: c for c in _json.loads(res.output)}
    assert {"docker client", "docker daemon", "buildx", "BuildKit", "containerd snapshotter", "skopeo", "registry",
            "NVIDIA GPUs"} <= set(checks), sorted(checks)
    assert all(checks[n]["ok"] for n in ("docker daemon", "buildx", "registry")), checks
    assert registry in checks["registry"]["detail"] or "200" in checks["registry"]["detail"]
    text = run_cli("doctor", "--registry", registry)
    assert "ok" in text.output
    closed = run_cli("doctor", "--registry", "127.0.0.1:9")
    assert closed.exit_code == 1 and "fix:" in closed.output
