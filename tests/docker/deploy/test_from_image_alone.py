"""A deployer has an image, not our matrix.toml: `smoke IMAGE`, `bench IMAGE`, `serve IMAGE` and `doctor --host
IMAGE` run in an empty directory, for an image in the local daemon and for one only in a registry (a real local
registry; the local tag removed), whose config is read there without pulling it.

The image is a TEST DOUBLE labelled as builder labels a vLLM 0.33.0 image (built here from the local CUDA base):
a Python with vLLM's distribution metadata and a `vllm` that is no engine, so L0 (labels and versions against the
built-in engine data) can pass and the engine itself can not boot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.docker

CELL = "vllm-0.33.0-cu130-py311-sm80.90"
LABELS = {"io.builder.cell": CELL, "io.builder.engine": "vllm", "io.builder.engine.version": "0.33.0",
          "io.builder.cuda": "13.0.3", "io.builder.python": "3.11", "io.builder.archs": "80,90",
          "io.builder.strategies": "MTP2", "io.builder.package.vllm.version": "0.33.0",
          "io.builder.package.vllm.sass": "sm_80,sm_90"}


def _build(tag: str, base: str, ctx: Path) -> None:
    site = "/usr/local/lib/python3.11/dist-packages"
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        f"RUN mkdir -p {site}/vllm-0.33.0.dist-info && printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: 0.33.0\\n' "
        f"> {site}/vllm-0.33.0.dist-info/METADATA\n"
        "RUN printf '%s\\n' '#!/bin/sh' 'echo \"not an engine: $*\"' 'exit 3' > /usr/local/bin/vllm && chmod 0755 /usr/local/bin/vllm\n"
        'ENTRYPOINT ["vllm", "serve"]\n')
    argv = ["docker", "buildx", "build", "--load", "-t", tag]
    for k, v in LABELS.items():
        argv += ["--label", f"{k}={v}"]
    res = subprocess.run([*argv, str(ctx)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]


def _local(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def images(local_bases, registry, tmp_path_factory):
    """{"local": a tag the daemon holds, "registry": one only the registry holds (pushed, then untagged)}."""
    ctx = tmp_path_factory.mktemp("from-image-alone")
    name = uuid.uuid4().hex[:8]
    local = f"{registry}/builder-test/alone-vllm:{name}-local"
    remote = f"{registry}/builder-test/alone-vllm:{name}-remote"
    _build(local, local_bases["cuda_base"], ctx)
    subprocess.run(["docker", "tag", local, remote], check=True, capture_output=True)
    push = subprocess.run(["docker", "push", remote], capture_output=True, text=True, timeout=300)
    assert push.returncode == 0, push.stderr
    subprocess.run(["docker", "image", "rm", remote], check=True, capture_output=True)
    assert not _local(remote)
    yield {"local": local, "registry": remote}
    subprocess.run(["docker", "image", "rm", "-f", local, remote], capture_output=True)


def builder(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    assert not (cwd / "matrix.toml").exists()
    env = {**os.environ, "PYTHONPATH": str(REPO), "BUILDER_CACHE_DIR": str(cwd.parent / "cache")}
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def empty(tmp_path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


@pytest.mark.parametrize("where", ["local", "registry"])
def test_smoke_of_an_image_alone_holds_it_to_its_labels_and_the_built_in_engine_data(images, where, empty):
    image = images[where]
    try:
        r = builder(empty, "smoke", image, "--layers", "L0", "--out-dir", "out", "--json")
    finally:  # smoke pulls an image it read from the registry, to run it: the other tests want it remote again
        if where == "registry":
            subprocess.run(["docker", "image", "rm", image], capture_output=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["cell"] == CELL and rep["subject"] == image
    (l0,) = [x for x in rep["results"] if x["layer"] == "L0"]
    assert l0["status"] == "pass" and l0["figures"]["vllm"] == "0.33.0", l0
    assert (empty / "out" / CELL / "smoke.json").is_file()
    # a registry's image runs by the digest read (pulled by it), never by what its tag names by then
    assert bool(re.search(r"read from its registry; pulling \S+@sha256:[0-9a-f]{64} to run it", r.stderr)) == \
        (where == "registry"), r.stderr


def test_smoke_of_an_image_alone_fails_l0_on_a_version_its_labels_do_not_say(images, empty, tmp_path):
    """The labels are the plan without a matrix: an image whose vLLM is not the labelled one fails L0."""
    tag = f"{images['local']}-wrong"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {images['local']}\nRUN sed -i 's/^Version: 0.33.0/Version: 0.32.0/' "
        "/usr/local/lib/python3.11/dist-packages/vllm-0.33.0.dist-info/METADATA\n")
    subprocess.run(["docker", "buildx", "build", "--load", "-t", tag, str(tmp_path / "ctx")], check=True,
                   capture_output=True, timeout=600)
    try:
        r = builder(empty, "smoke", tag, "--layers", "L0", "--json")
        assert r.returncode == 1, r.stderr[-2000:]
        (l0,) = [x for x in json.loads(r.stdout)["results"] if x["layer"] == "L0"]
        assert l0["status"] == "fail" and "vllm 0.32.0, the plan says 0.33.0" in l0["reason"]
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


@pytest.mark.parametrize("where", ["local", "registry"])
def test_bench_of_an_image_alone_reads_what_it_was_built_for(images, where, empty):
    """A strategy the labels do not list is refused (exit 2) before any container, and nothing is pulled."""
    image = images[where]
    r = builder(empty, "bench", image, "--strategy", "none,MTP7", "--gpus", "none", "--out-dir", "out")
    assert r.returncode == 2, r.stderr
    assert f"--strategy MTP7: {image} was built and smoke-tested for MTP2" in r.stderr
    if where == "registry":
        assert not _local(image)


def test_bench_of_a_local_image_alone_boots_it_and_records_the_failure(images, empty):
    """Past the checks, bench starts the image's engine (no engine here: it exits) and records that row's
    failure with the facts the labels gave; the default is three measured repeats."""
    r = builder(empty, "bench", images["local"], "--strategy", "none", "--gpus", "none", "--client-python",
                sys.executable, "--workload", "quick", "--boot-timeout", "60", "--no-lossless")
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads((empty / "logs" / "bench" / CELL / "bench.json").read_text())
    env = doc["environment"]
    assert (env["engine"], env["engine_version"], env["cuda"]) == ("vllm", "0.33.0", "13.0.3")
    assert env["digest"]
    (failure,) = doc["failures"]
    assert failure["strategy"] == "none" and "the engine exited with code 3 during boot" in failure["why"]
    assert "not an engine: " in failure["log_tail"]


@pytest.mark.parametrize("where", ["local", "registry"])
def test_serve_of_an_image_alone_prints_its_docker_run(images, where, empty):
    model = empty / "model"
    model.mkdir()
    image = images[where]
    r = builder(empty, "serve", image, "--strategy", "mtp2", "--model", str(model), "--gpus", "0,1")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith(f"docker run --rm --gpus device=0,1 --shm-size 16g -p 127.0.0.1:8000:8000 -v "
                           f"{model}:/models/model:ro")
    # the image by the digest serve read, never the tag (which may move before the line is run)
    pinned = re.search(r" (\S+@sha256:[0-9a-f]{64}) /models/model", line)
    assert pinned and pinned.group(1).startswith(image.rsplit(":", 1)[0] + "@") and "--speculative-config" in line, line
    if where == "registry":
        assert not _local(image)


@pytest.mark.parametrize("where", ["local", "registry"])
def test_doctor_host_of_an_image_alone_judges_it_without_pulling(images, where, empty):
    gpus = empty / "gpus.json"
    data = tomllib.loads((REPO / "tests" / "fixtures" / "host" / "gpus.toml").read_text())
    gpus.write_text(json.dumps([data["h200-580"]]))
    image = images[where]
    r = builder(empty, "doctor", "--host", image, "--gpus-file", str(gpus), "--json")
    assert r.returncode == 0, r.stderr
    (verdict,) = json.loads(r.stdout)["verdicts"]
    assert verdict["image"] == image and verdict["verdict"] == "runs"
    if where == "registry":
        assert not _local(image)
