"""SIGTERM (what CI runners and `timeout` send) during `builder bench` and `builder smoke` exits 143, "interrupted
by SIGTERM", as every verb does (cli/app.py decides exit codes), and the engine it started is stopped. The engine
is the stand-in server (tests/fixtures/smoke/stand_in: a TEST DOUBLE, not an engine) kept from becoming ready, so
the signal lands while the verb waits for the boot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "smoke"
MATRIX = FIXTURE / "matrix.toml"
CELL = "stand-in-engine-1.0.0-cu130-py311-sm80.90"


def _engine_pids(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if b"stand_in_engine" in cmd and marker.encode() in env:
                out.append(int(d.name))
    return out


def _terminate_while_booting(args: list[str], tmp_path: Path) -> tuple[int, str]:
    marker = f"STAND_IN_RUN={os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(FIXTURE / "stand_in"), "BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", *args, "--env", "STAND_IN_MODE=never-ready",
                             "--env", marker, "--boot-timeout", "120"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _engine_pids(marker):  # the engine runs: the verb now waits for it to become ready
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the engine never started"
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=90)
    deadline = time.monotonic() + 30
    while _engine_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _engine_pids(marker), "the engine outlived the interrupted verb"
    return proc.returncode, out + err


@pytest.mark.parametrize("verb", ["bench", "smoke"])
def test_sigterm_mid_run_exits_143_and_stops_the_engine(verb, tmp_path):
    common = [CELL, "--matrix", str(MATRIX), "--launcher", "process", "--python", sys.executable, "--gpus", "none",
              "--strategy", "MTP2"]
    if verb == "bench":
        from builder.deploy.smoke import tinymodel

        model = tinymodel.ensure(tmp_path / "models").target
        args = ["bench", *common, "--model", str(model), "--workload", "quick", "--client-python", sys.executable,
                "--out-dir", str(tmp_path / "out")]
    else:
        args = ["smoke", *common, "--layers", "L3", "--report-dir", str(tmp_path / "out")]
    code, output = _terminate_while_booting(args, tmp_path)
    assert code == 143, output[-3000:]
    assert "interrupted by SIGTERM" in output and "SIGINT" not in output, output[-3000:]
    assert "Traceback" not in output
