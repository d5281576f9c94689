"""`builder build` end to end on the real Docker engine: a small real CUDA package (tests/fixtures/cuda-ext)
compiled from source by nvcc through the same templates as the engines, on the local CUDA 13 bases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.support.build import HOST_CA, MATRIX, build_args, builder


def test_dry_run_prints_the_exact_buildx_commands(tmp_path):
    res = builder("build", "--matrix", str(MATRIX), "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "w"),
                  "--ca-bundle", str(HOST_CA), "--dry-run", "--max-jobs", "3", "--nvcc-threads", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stdout.splitlines() if l.startswith("docker buildx build")]
    assert len(lines) == 3
    wheel, resolve, runtime = lines
    # no runtime pins yet: the runtime's dependencies are resolved before the install, never from the layer cache,
    # into the work dir (pip's inspect and --dry-run report), with the same wheels context and CA secret
    assert "--target runtime-resolved" in resolve and "--no-cache-filter runtime-resolve" in resolve
    assert f"--output type=local,dest={tmp_path}/w/cuda-ext-1.0.0-cu130-py311-sm80.90/resolve" in resolve
    assert f"--build-context wheels={tmp_path}/w/" in resolve and f"--secret id=ca,src={HOST_CA}" in resolve
    assert "--target wheels-cuda-ext" in wheel and f"--output type=local,dest={tmp_path}/w/" in wheel
    assert "--build-arg MAX_JOBS=3 --build-arg NVCC_THREADS=1" in wheel
    assert f"--secret id=ca,src={HOST_CA}" in wheel and f"--secret id=ca,src={HOST_CA}" in runtime
    assert "--build-context local-cuda-ext=" in wheel
    assert "--target runtime " in runtime and f"--build-context wheels={tmp_path}/w/" in runtime
    # the runtime image is an OCI archive with rewritten timestamps (reproducible), then loaded as it is
    assert f"--output type=oci,dest={tmp_path}/w/" in runtime and "rewrite-timestamp=true" in runtime
    assert "--load" not in runtime and "--provenance=false --sbom=false" in runtime
    assert f"docker load --input {tmp_path}/w/cuda-ext-1.0.0-cu130-py311-sm80.90/image.oci.tar" in res.stdout
    assert "name=127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90" in runtime  # the tag docker load gives
    assert not (tmp_path / "w").exists() and not (tmp_path / "wh").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("args, message", [
    (["--ca-bundle", "/nonexistent/ca.pem"], "--ca-bundle: /nonexistent/ca.pem is not a file"),
    (["--max-jobs", "0"], "--max-jobs: '0' is not a number of jobs at least 1"),
])
def test_build_refuses_bad_options_before_building(args, message, tmp_path):
    res = builder("build", "--matrix", str(MATRIX), "--work-dir", str(tmp_path / "w"), *args, cwd=tmp_path)
    assert res.returncode == 2 and message in res.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.network  # git ls-remote to the git host
def test_unpinned_git_sources_are_refused_unless_allowed(tmp_path):
    res = builder("build", "--matrix", str(REPO / "matrix.toml"), "--engine", "sglang", "--dry-run", cwd=tmp_path)
    assert res.returncode == 2
    assert "sources not pinned to a commit" in res.stderr and "sglang-kernel 0.4.10" in res.stderr
    ok = builder("build", "--matrix", str(REPO / "matrix.toml"), "--engine", "sglang", "--dry-run", "--allow-unpinned",
                 "--wheelhouse", str(tmp_path / "wh"), cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.count("docker buildx build") == 5  # 3 wheels, the resolve, the runtime


@pytest.mark.network  # git ls-remote to the git host
def test_cmake_dependencies_by_tag_are_refused_unless_allowed(tmp_path):
    res = builder("build", "--matrix", str(REPO / "matrix.toml"), "--engine", "vllm", "--dry-run", cwd=tmp_path)
    assert res.returncode == 2
    assert "vllm 0.33.0: CMake dependency cutlass v4.7.1" in res.stderr
    assert "https://github.com/nvidia/cutlass.git v4.7.1: cannot resolve" in res.stderr  # build tried to pin it


def test_a_missing_docker_daemon_is_exit_3_for_build_and_audit(tmp_path):
    """No daemon at DOCKER_HOST: the environment is missing (3), not bad input (2) nor a failed cell (1)."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    res = subprocess.run([sys.executable, "-m", "builder.cli", *build_args(tmp_path, HOST_CA)], capture_output=True,
                         text=True, cwd=tmp_path, env=env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "the Docker daemon is not reachable" in res.stderr and "scripts/setup-docker.sh" in res.stderr
    assert not (tmp_path / "work").exists()  # nothing ran
    audit_res = subprocess.run([sys.executable, "-m", "builder.cli", "audit", "example/some:image", "--arch", "80"],
                               capture_output=True, text=True, cwd=tmp_path, env=env)
    assert audit_res.returncode == 3 and "the Docker daemon is not reachable" in audit_res.stderr, audit_res.stderr
    # bad input still wins: refused (2) before the environment is looked at
    bad = subprocess.run([sys.executable, "-m", "builder.cli", *build_args(tmp_path, Path("/nonexistent.pem"))],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "--ca-bundle" in bad.stderr
