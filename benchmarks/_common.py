"""Shared bits of the benchmarks: they drive the real CLI on the test fixture and the local bases."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE_MATRIX = REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml"
CA = os.environ.get("BUILDER_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")


def builder(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, check=check, cwd=REPO)


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def ensure_local_bases() -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "make-local-bases.sh")], check=True, stdout=subprocess.DEVNULL)


def dry_run_commands(*args: str) -> list[list[str]]:
    out = builder("build", *args, "--dry-run").stdout
    return [shlex.split(line) for line in out.splitlines() if line.startswith("docker buildx build")]
