"""What the registry-reuse tests share (tests/docker/image/test_registry_reuse.py, tests/docker/image/test_ledger_signing.py): a builder run as
a fresh runner would make it, and the registry reads and pushes around it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from builder.image import reuse

from .helpers import CUDA_EXT_CELL as CELL
from .helpers import HOST_CA, fixture_copy

TAG = CELL.removeprefix("cuda-ext-")


def builder(*args: str, cwd: Path, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000", **(env or {})}, timeout=timeout)


def digest_in(registry: str, repo: str, ref: str) -> str | None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{ref}", headers={"Accept": reuse.ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return "sha256:" + hashlib.sha256(resp.read()).hexdigest()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def local_id(ref: str) -> str:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def forget_locally(*refs: str) -> None:
    for ref in refs:
        subprocess.run(["docker", "image", "rm", ref], capture_output=True)


class Run:
    """One fresh runner after another: same matrix and committed pins, nothing else kept between them."""

    def __init__(self, tmp: Path, names: str, registry: str):
        self.tmp, self.registry = tmp, registry
        self.matrix = fixture_copy(tmp, names)
        self.ref = f"{names}/cuda-ext:{TAG}"
        self.repo = f"{registry}/cuda-ext"
        self.remote = ["--cache-remote", f"registry:{registry}/wheels"]
        self.n = 0

    def fresh(self) -> Path:
        """A new wheelhouse (so a new, empty ledger), work and log dirs; the cell's tag gone from the daemon."""
        self.n += 1
        forget_locally(self.ref)
        assert not local_id(self.ref)
        return self.tmp / f"runner{self.n}"

    def args(self, verb: str, where: Path, *extra: str) -> list[str]:
        out = [verb, "--matrix", str(self.matrix), "--wheelhouse", str(where / "wheelhouse"), "--work-dir",
               str(where / "work"), "--log-dir", str(where / "logs"), "--pins-dir", str(self.tmp / "pins"),
               "--ca-bundle", str(HOST_CA), "--quiet", "--json", *self.remote, *extra]
        if verb == "publish":
            out += ["--registry", self.registry, "--images-json", str(where / "images.json")]
        return out

    def run(self, verb: str, *extra: str, env: dict | None = None,
            where: Path | None = None) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
        """A fresh runner (or, with `where`, that runner again: its wheelhouse and image ledger kept)."""
        where = where or self.fresh()
        started = time.monotonic()
        res = builder(*self.args(verb, where, *extra), cwd=self.tmp, env=env)
        res.seconds = time.monotonic() - started
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
        (cell,) = json.loads(res.stdout[:res.stdout.rindex("]") + 1] if verb == "publish" else res.stdout)
        return res, {r["step"] + ":" + r["subject"]: r for r in cell["steps"]}, where



def push_under_tag(image: str, dest: str) -> None:
    """Push a local image over the registry tag `dest`."""
    subprocess.run(["docker", "tag", image, dest], check=True, capture_output=True)
    try:
        push = subprocess.run(["docker", "push", "--quiet", dest], capture_output=True, text=True)
        assert push.returncode == 0, push.stderr
    finally:
        forget_locally(dest)


