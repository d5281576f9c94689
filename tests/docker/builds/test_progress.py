"""Progress and estimates for long compiles: counters read from real build-output shapes, the ETA from the

The Docker half of tests/unit/builds/test_progress.py: its docstring says the rest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.progress import FIXTURE

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def _build(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    # a SOURCE_DATE_EPOCH no earlier build used, so BuildKit really compiles (no layer-cache hit)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(1_500_000_000 + int(time.time() * 1000) % 10_000_000)}
    return subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(FIXTURE / "matrix.toml"),
                           "--wheelhouse", str(tmp / "wh"), "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"),
                           "--pins-dir", str(tmp / "pins"), "--ca-bundle", str(HOST_CA), *extra],
                          capture_output=True, text=True, cwd=tmp, env=env)


@pytest.mark.slow  # two real compiles (~45 s); the progress lines and the estimate stay in the default tier in-process
def test_a_real_compile_reports_progress_records_itself_and_is_estimated_next_time(local_bases, docker_engine, tmp_path):
    first = _build(tmp_path, "--progress", "plain", "--arch", "80,90")
    assert first.returncode == 0, first.stderr
    # the plain display: a closing status line for the compile, no build output, no control characters
    done = [line for line in first.stderr.splitlines() if line.endswith("— done")]
    assert len(done) == 1 and "cuda-ext==1.0.0, 1 objects, elapsed" in done[0], first.stderr
    assert "#1 " not in first.stderr and "\x1b" not in first.stderr
    assert "nvcc" in (tmp_path / "logs" / "cuda-ext-1.0.0-cu130-py311-sm80.90.log").read_text()
    (manifest,) = (tmp_path / "wh").glob("cuda-ext/*/builder-wheel.json")
    compiled = json.loads(manifest.read_text())["compile"]
    assert compiled["objects"] == 1 and compiled["seconds"] > 0 and compiled["archs"] == 2 and compiled["threads"] >= 1
    # sm_80 only is another key of the same version: plan estimates it from the first compile, halved
    plan = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--matrix", str(FIXTURE / "matrix.toml"),
                           "--wheelhouse", str(tmp_path / "wh"), "--arch", "80", "--json"], capture_output=True, text=True)
    (pkg,) = json.loads(plan.stdout)["cells"][0]["packages"]
    assert pkg["action"] == "build" and pkg["estimate"]["seconds"] == pytest.approx(compiled["seconds"] / 2, abs=0.2)
    second = _build(tmp_path, "--progress", "quiet", "--arch", "80")
    assert second.returncode == 0, second.stderr
    row = next(line for line in second.stdout.splitlines() if line.startswith("cuda-ext-1.0.0-cu130-py311-sm80 "))
    # actual vs estimate, then what the object cache did: sm_80's steps were compiled by the first build
    assert re.search(r"cuda-ext \d+s \(est \d+s; sccache \d+/\d+ hits\)", row), row
