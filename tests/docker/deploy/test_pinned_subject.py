"""Issue 34, item 3: smoke, bench and serve run exactly the image they read. The tag is read (its labels, its
digest), then moved to another image; what runs is still the image read: a local one by its ID, one read from
its registry pulled by the digest read (NAME@sha256:...). smoke.json records the digest and the ID, serve prints
the digest-pinned reference. The images are the stand-in engine's (tests/fixtures/smoke, FROM the local Debian
base), the registry a real one (tests/conftest.py registry)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from builder import render
from builder.deploy import subject
from builder.deploy.runtime import engine

from tests.helpers import REPO, SMOKE_MATRIX, build_stand_in, commit_image, stand_in_cell, stand_in_digest


@pytest.fixture(scope="module")
def stand_in(local_bases) -> str:
    cell = stand_in_cell()
    tag = f"builder-test/smoke-stand-in:{stand_in_digest()}"
    build_stand_in(tag, render.labels(cell, {p.name: "test-double" for p in cell.packages}), local_bases["debian"])
    return tag


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=300).stdout.strip()


def image_id(ref: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", ref)


def container_image(run_ref: str, client) -> str:
    """The image ID of a container the smoke launcher starts from `run_ref` (removed after)."""
    launcher = engine.DockerLauncher(run_ref, client=client)
    try:
        c = launcher._run(["sleep"], ["30"], {})
        c.reload()
        return c.attrs["Image"]
    finally:
        launcher.close()


def test_a_local_tag_moved_after_the_read_is_not_what_runs(stand_in, tmp_path):
    ref = f"builder-test/pin-local-{uuid.uuid4().hex[:10]}:t"
    docker("tag", stand_in, ref)
    read_id = image_id(ref)
    client = engine.docker_client()
    try:
        found = subject.read_local(ref, client)
        moved = commit_image(stand_in, ref)  # the tag now names another image
        assert moved != read_id and image_id(ref) == moved
        run_ref = subject.pinned(found, client)
        assert run_ref == read_id and container_image(run_ref, client) == read_id
        # the whole verb: smoke.json records the image read (read and run in one process: the tag stays)
        docker("tag", stand_in, ref)
        res = subprocess.run([sys.executable, "-m", "builder.cli", "smoke", ref, "--matrix", str(SMOKE_MATRIX), "--gpus",
                              "none", "--layers", "L0,L1", "--json", "--report-dir", str(tmp_path / "r")],
                             capture_output=True, text=True, cwd=REPO, timeout=300,
                             env={**os.environ, "BUILDER_CACHE_DIR": str(tmp_path / "cache")})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        rep = json.loads(res.stdout)
        assert rep["image_id"] == read_id and rep["digest"] in (read_id, *json.loads(
            docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref)))
        on_disk = json.loads(next((tmp_path / "r").rglob("smoke.json")).read_text())
        assert on_disk[0]["image_id"] == read_id and on_disk[0]["digest"] == rep["digest"]
    finally:
        subprocess.run(["docker", "rmi", "-f", ref], capture_output=True)
        client.close()


def test_a_registry_tag_moved_after_the_read_is_not_what_runs_nor_what_serve_prints(stand_in, registry, tmp_path):
    repo = f"{registry}/pin/stand-in-{uuid.uuid4().hex[:10]}"
    ref = f"{repo}:t"
    local_other = f"builder-test/pin-other-{uuid.uuid4().hex[:10]}:t"
    client = engine.docker_client()
    try:
        docker("tag", stand_in, ref)
        docker("push", "--quiet", ref)
        read_id = image_id(ref)
        docker("rmi", ref)  # not local any more: read from the registry
        found = subject.read_registry(ref)
        assert found is not None and found.source == subject.REGISTRY and found.digest.startswith(f"{repo}@sha256:")
        # serve prints the digest read, not the tag
        (tmp_path / "model").mkdir()
        served = subprocess.run([sys.executable, "-m", "builder.cli", "serve", ref, "--strategy", "MTP2", "--model",
                                 str(tmp_path / "model"), "--matrix", str(SMOKE_MATRIX)], capture_output=True, text=True,
                                cwd=REPO, timeout=120)
        assert served.returncode == 0, served.stdout + served.stderr
        assert found.digest in served.stdout and f" {ref} " not in served.stdout + " ", served.stdout
        # the tag moves to another image, in the registry
        commit_image(stand_in, local_other)
        docker("tag", local_other, ref)
        docker("push", "--quiet", ref)
        docker("rmi", ref)
        assert subject.read_registry(ref).digest != found.digest
        run_ref = subject.pinned(found, client)
        assert run_ref == read_id and container_image(run_ref, client) == read_id
    finally:
        for r in (ref, local_other):
            subprocess.run(["docker", "rmi", "-f", r], capture_output=True)
        subprocess.run(f"docker images --digests --format '{{{{.Repository}}}}@{{{{.Digest}}}}' {repo} | xargs -r docker rmi -f",
                       shell=True, capture_output=True)
        client.close()
