"""What the two halves of test_build.py share: tests/unit/builds/test_build.py (its tests that need no Docker) and
tests/docker/builds/test_build.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
MATRIX = FIXTURE / "matrix.toml"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd)


def build_args(tmp: Path, ca: Path, *extra: str, matrix: Path = MATRIX) -> list[str]:
    return ["build", "--matrix", str(matrix), "--wheelhouse", str(tmp / "wheelhouse"), "--work-dir", str(tmp / "work"),
            "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"), "--ca-bundle", str(ca), "--quiet", *extra]
