"""Git mirrors inside a real BuildKit build: a RUN that fetches the upstream URL through `with-ca` (the script every
rendered Dockerfile installs) reaches the mirror named in secret "gitmirrors", a git daemon on 127.0.0.1; a second
build through another mirror is a cache hit (the mirror is no part of the layer's key), and neither the image's
history nor its layers hold the mirror."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

from builder import docker, gitmirror
from tests.helpers import git_daemon

GH = "https://github.com/"
UPSTREAM = "https://github.com/acme/widget"  # unreachable here: only the mirror answers

ROOT = Path(__file__).resolve().parents[3]
BASE = "debian:bookworm-slim"


def _base_with_git() -> str:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "builder-test/toolchain-with-repo"],
                         capture_output=True, text=True).stdout.split()
    tags = [t for t in out if not t.endswith("-base")]
    if not tags:
        pytest.skip("no local image with git (builder-test/toolchain-with-repo)")
    return tags[0]


@pytest.fixture
def served(tmp_path):
    with git_daemon(tmp_path) as info:
        yield info


@pytest.fixture(autouse=True)
def _no_active_map():
    gitmirror.activate(())
    yield
    gitmirror.activate(())


def test_a_build_fetches_through_the_mirror_secret_and_keeps_it_out_of_the_image(served, tmp_path):
    if not shutil.which("docker"):
        pytest.skip("no docker")
    base = _base_with_git()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "dockerfiles"))
    with_ca = env.get_template("macros.j2").module.with_ca_script()
    (tmp_path / "ctx").mkdir()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM {base}\n{with_ca}\n"
                          "RUN --mount=type=secret,id=ca --mount=type=secret,id=gitmirrors \\\n"
                          f"    with-ca git ls-remote {UPSTREAM}.git refs/tags/v1.0^{{}} > /ls-remote.txt \\\n"
                          # the commit is the identity: a fresh repository (a new commit) is a fresh layer key
                          f" && grep -q {served['commit']} /ls-remote.txt\n")
    tag = "builder-test/git-mirror:probe"

    def build(mirror: str) -> str:
        gitmirror.activate(((GH, mirror),))
        call = docker.BuildxCall(dockerfile=dockerfile, context=tmp_path / "ctx", target="", tags=(tag,), load=True,
                                 secret_envs=((gitmirror.SECRET_ID, gitmirror.SECRET_ENV),), extra=("--network", "host"))
        argv = [a for a in call.argv() if a not in ("--target", "")]
        assert not any("127.0.0.1" in a for a in argv)
        proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    port = served["port"]
    build(f"git://127.0.0.1:{port}/github/")
    got = subprocess.run(["docker", "run", "--rm", tag, "cat", "/ls-remote.txt"], capture_output=True, text=True,
                         check=True).stdout
    assert got.split()[0] == served["commit"]  # resolved by the mirror: the upstream host is unreachable here
    log = build(f"git://localhost:{port}/github/")  # another mirror of the same repository
    step = next(line.split()[0] for line in log.splitlines() if "git ls-remote" in line and line.startswith("#"))
    assert f"{step} CACHED" in log, log[-3000:]  # the fetch's layer is a cache hit: the mirror is no part of its key
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag],
                             capture_output=True, text=True, check=True).stdout
    inspect = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True, check=True).stdout
    saved = subprocess.run(["docker", "run", "--rm", tag, "sh", "-c", "grep -rl 127.0.0.1: / --exclude-dir=proc "
                            "--exclude-dir=sys --exclude-dir=dev 2>/dev/null | grep -v ^/etc/hosts || true"],
                           capture_output=True, text=True).stdout
    for text in (history, inspect, saved):
        assert f":{port}/github" not in text and "insteadOf" not in text
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
