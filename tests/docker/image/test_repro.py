"""Reproducible images: `builder lock` pins the base images by digest, and `builder verify-repro` builds the

The Docker half of tests/unit/image/test_repro.py: its docstring says the rest."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from builder.image import oci

from tests.support.repro import FIXTURE

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"


# -- the fixture cell, for real -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixture_copy(tmp_path_factory, local_bases):
    """The fixture with image names of its own (its builds retag nothing another test or session uses)."""
    root = tmp_path_factory.mktemp("repro") / "fixture"
    shutil.copytree(FIXTURE, root)
    ns = f"repro-{uuid.uuid4().hex[:10]}"
    text = (root / "matrix.toml").read_text()
    (root / "matrix.toml").write_text(text.replace('registry = "127.0.0.1:5000/builder-test"', f'registry = "127.0.0.1:5000/{ns}"'))
    yield root
    names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"127.0.0.1:5000/{ns}/*"],
                           capture_output=True, text=True).stdout.split()
    if names:
        subprocess.run(["docker", "image", "rm", *names], capture_output=True)


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=1800)


def test_lock_pins_the_base_images_by_digest(fixture_copy):
    res = builder("lock", "--matrix", "matrix.toml", cwd=fixture_copy)
    assert res.returncode == 0, res.stderr
    lock = (fixture_copy / "matrix.lock").read_text()
    for name, ref in (("devel", "builder-local/cuda:13.0-devel"), ("runtime", "builder-local/cuda:13.0-base")):
        digest = subprocess.run(["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", ref],
                                capture_output=True, text=True, check=True).stdout.strip().split("@")[1]
        assert f'[base_images."{ref}"]\ndigest = "{digest}"' in lock
        assert f"locked base {ref}@{digest}" in res.stderr
    dockerfile = builder("render", "--matrix", "matrix.toml", cwd=fixture_copy).stdout
    assert "ARG BASE_DEVEL_IMAGE=builder-local/cuda:13.0-devel@sha256:" in dockerfile
    assert "ARG BASE_RUNTIME_IMAGE=builder-local/cuda:13.0-base@sha256:" in dockerfile
    check = builder("lock", "--matrix", "matrix.toml", "--check", cwd=fixture_copy)
    assert check.returncode == 0 and "up to date" in check.stdout


# slow: two builds from nothing, 2 min 19 s of the default suite on 2 cores (the suite's 20-minute budget); the
# default suite keeps reproducibility through test_hardening's two compiles giving the same wheel bytes, this
# module's nvcc-object checks and test_build's reuse with one digest
@pytest.mark.slow
def test_verify_repro_builds_the_fixture_twice_from_nothing_and_gets_one_digest(fixture_copy, tmp_path):
    if not (fixture_copy / "matrix.lock").exists():  # run alone: pin the bases first, as the test above does
        assert builder("lock", "--matrix", "matrix.toml", cwd=fixture_copy).returncode == 0
    res = builder("verify-repro", CELL, "--matrix", "matrix.toml", "--work-dir", str(tmp_path / "work"),
                  "--log-dir", str(tmp_path / "logs"), "--pins-dir", str(tmp_path / "pins"),
                  "--ca-bundle", str(HOST_CA), "--json", cwd=fixture_copy)
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    verdict = json.loads(res.stdout)
    assert verdict["reproducible"] and verdict["differences"] == []
    first, second = verdict["runs"]
    assert first["digest"] == second["digest"] and first["digest"].startswith("sha256:")
    assert first["wheels"] == second["wheels"] and first["wheels"]["cuda-ext"]
    assert "no runtime pins yet; the first build resolves them and the second installs exactly those" in res.stderr
    # both really built from nothing: a compile each, no BuildKit cache; both installed the hash-locked pins, the
    # first those it resolved before its install, the second those the first recorded
    for run in ("first", "second"):
        log = (tmp_path / "logs" / "verify-repro" / run / f"{CELL}.log").read_text()
        assert ("--target runtime-resolved" in log) == (run == "first")
        assert ("resolved" if run == "first" else "runtime dependencies hash-locked by") in log
        assert "--require-hashes" in log
        assert "--target wheels-cuda-ext" in log and "--no-cache" in log and "nvcc" in log
        steps = log.split("\n\n")  # BuildKit's plain progress: one block per step
        cached = [s.splitlines()[0] for s in steps if "CACHED" in s and "FROM " not in s.splitlines()[0]]
        assert not cached, cached  # only the base images themselves come from the store
        assert "@sha256:" in log  # FROM the pinned bases
    # what makes it so: no apt caches or logs, and only hash-based bytecode, in any layer
    archive = tmp_path / "work" / "verify-repro" / CELL / "first" / "work" / CELL / "image.oci.tar"
    pycs = 0
    base_layers = int(subprocess.run(["docker", "image", "inspect", "--format", "{{len .RootFS.Layers}}",
                                      "builder-local/cuda:13.0-base"], capture_output=True, text=True,
                                     check=True).stdout)
    with oci.Archive(archive) as a:
        image = a.image()
        assert image.digest == first["digest"]
        for layer in image.layers[base_layers:]:  # what the runtime stage added to its base
            with a.open_layer(layer) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:  # gzip or zstd
                for m in tar:
                    name = "/" + m.name.lstrip("./")
                    if name.rsplit("/", 1)[-1].startswith(".wh."):
                        continue  # a whiteout: the file was removed (apt-get clean of the base's own .debs)
                    assert not name.startswith(("/var/lib/apt/lists/", "/var/log/apt/", "/var/cache/apt/")) \
                        or m.isdir() or name.endswith(("/partial", "/lock", "/auxfiles")), name
                    assert name not in ("/var/log/dpkg.log", "/var/log/alternatives.log"), name
                    if m.isreg() and name.endswith(".pyc") and name.startswith("/opt/venv/"):
                        flags = int.from_bytes(tar.extractfile(m).read(8)[4:8], "little")
                        assert flags == 0b01, f"{name}: pyc flags {flags:#b}, not unchecked-hash"
                        pycs += 1
    assert pycs > 50  # pip, packaging, cuda_ext: compiled once, hash-based


# slow: a build whose runtime stage fails; the default tier installs a hash-locked file with a real pip in
# tests/unit/render/test_pins_extras.py
@pytest.mark.slow
def test_a_pinned_file_whose_sha256_differs_stops_the_build(fixture_copy, tmp_path):
    """The pins carry every release's sha256; a file from the index that is not the pinned one (here: a pin
    whose hash was altered) stops the runtime stage instead of being installed."""
    args = ["build", "--matrix", "matrix.toml", "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "w"),
            "--log-dir", str(tmp_path / "logs"), "--pins-dir", str(tmp_path / "pins"), "--ca-bundle", str(HOST_CA),
            "--quiet", "--no-smoke"]
    first = builder(*args, cwd=fixture_copy)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    pins = tmp_path / "pins" / f"{CELL}.txt"
    text = pins.read_text()
    line = next(l for l in text.splitlines() if l.startswith("packaging=="))
    assert " --hash=sha256:" in line and "hash-locked requirements" in text
    assert f"recorded the resolved runtime dependencies in {pins}, each with its sha256" in first.stderr
    again = builder(*args, cwd=fixture_copy)  # installs from the hash-locked file
    assert again.returncode == 0 and f"runtime dependencies hash-locked by {pins}" in again.stderr
    digests = [h.split(":", 1)[1] for h in line.split() if h.startswith("--hash=sha256:")]
    pins.write_text(text.replace(digests[0], "0" * 64).replace(" --hash=sha256:".join([""] + digests[1:]), ""))
    bad = builder(*args, cwd=fixture_copy)
    assert bad.returncode == 1
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert "DO NOT MATCH THE HASHES" in log, log[-3000:]
