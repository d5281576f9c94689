"""builder doctor --host: which image runs on which GPU, judged from the image's config and labels (never pulled)

The Docker half of tests/unit/deploy/test_host.py: its docstring says the rest."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from builder.deploy import host

from tests.helpers import REPO
from tests.support.host import FIX


@pytest.mark.docker
def test_an_image_is_judged_from_the_local_daemon_and_from_its_registry_without_pulling(local_bases, registry, tmp_path):
    """A small image labelled like builder's (sm_80 only, CUDA 13.0.3): judged from the daemon, then — its local
    tag removed — from the registry (skopeo inspect --config); it is still not local afterwards."""
    tag = f"{registry}/builder-test/host-sm80:{tmp_path.name[-12:].lower()}"
    (tmp_path / "Dockerfile").write_text(f"FROM {local_bases['debian']}\nENV CUDA_VERSION=13.0.3\n"
                                         "LABEL io.builder.cuda=13.0.3 io.builder.package.vllm.sass=sm_80\n")
    build = subprocess.run(["docker", "buildx", "build", "--load", "-t", tag, str(tmp_path)], capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    gpus = tmp_path / "gpus.json"
    data = tomllib.loads((FIX / "gpus.toml").read_text())
    gpus.write_text(json.dumps([data["a100-570"], data["h200-580"]]))
    try:
        local = host.image_facts(tag)
        assert local.source == "local image" and local.cuda == "13.0.3"
        assert subprocess.run(["docker", "push", tag], capture_output=True, timeout=300).returncode == 0
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "builder.cli", "doctor", "--host", tag, "--gpus-file", str(gpus), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    verdicts = {v["gpu"]["name"]: v for v in json.loads(r.stdout)["verdicts"]}
    assert verdicts["NVIDIA A100 80GB PCIe"]["verdict"] == host.COMPAT  # sm_80 runs on 8.0; 570 < 580.65.06
    assert verdicts["NVIDIA H200"]["verdict"] == host.REFUSED and "sm_80" in verdicts["NVIDIA H200"]["rule"]
    assert host.image_facts(tag).source == "registry (not pulled)"
    assert subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0
