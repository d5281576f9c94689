"""builder snapshot's launcher (builder/deploy/snapshot/noring.py) against the real uvloop: CRIU cannot dump an
io_uring, and uvloop's libuv sets one up at every event loop even with UV_USE_IO_URING=0 (measured here and on the
GPU host with vLLM 0.26.0's API server). The engines start their loop through uvloop.run (vLLM) or a console script;
under the launcher the same program runs, with its loop from asyncio and no io_uring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.deploy.snapshot import noring

ENGINE = '''
import os, sys, uvloop

def rings():
    out = []
    for f in os.listdir("/proc/self/fd"):
        try:
            if "io_uring" in os.readlink(f"/proc/self/fd/{f}"):
                out.append(f)
        except OSError:
            pass
    return out

async def serve():
    print("argv", sys.argv[1:], "rings", len(rings()), flush=True)

def main():
    uvloop.run(serve())
    return 0

if __name__ == "__main__":
    main()
'''


@pytest.fixture()
def env(tmp_path: Path) -> dict:
    """An engine package with a console script (`fake-engine`, as `vllm`), found through its dist-info."""
    (tmp_path / "fake_engine.py").write_text(ENGINE)
    info = tmp_path / "fake_engine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nfake-engine = fake_engine:main\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path), **noring.ENV}


def run(argv, env) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_uvloop_alone_makes_an_io_uring_that_the_environment_does_not_stop(env):
    assert run([sys.executable, "-m", "fake_engine", "serve"], env) == "argv ['serve'] rings 1"


def test_the_launcher_runs_the_module_form_with_no_io_uring(env):
    assert run(noring.wrap(sys.executable, (sys.executable, "-m", "fake_engine", "serve", "--port", "1")), env) == \
        "argv ['serve', '--port', '1'] rings 0"


def test_the_launcher_runs_a_console_script_by_its_entry_point_with_no_io_uring(env):
    assert run(noring.wrap(sys.executable, ("fake-engine", "serve", "m")), env) == "argv ['serve', 'm'] rings 0"


def test_an_unknown_console_script_is_named(env):
    proc = subprocess.run(list(noring.wrap(sys.executable, ("no-such-engine", "serve"))), capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "no console script 'no-such-engine'" in proc.stderr


def test_take_at_the_images_paths_refuses_an_interpreter_that_is_not_the_images_and_writes_nothing(tmp_path):
    """`snapshot take --launcher process --image-paths` boots the engine as a warm image would (its venv's prefix, the
    caches at the image's root, a generated model under the image's model root): an interpreter elsewhere is refused
    before anything is written, naming the image's prefix (scripts/gpu-host-run --image-paths makes one)."""
    from tests.helpers import REPO

    out = tmp_path / "snap"
    res = subprocess.run([sys.executable, "-m", "builder.cli", "snapshot", "take",
                          "stand-in-engine-1.0.0-cu130-py311-sm80.90", "--matrix",
                          str(REPO / "tests" / "fixtures" / "smoke" / "matrix.toml"), "--launcher", "process",
                          "--python", sys.executable, "--port", "1", "--image-paths", "--strategy", "MTP2",
                          "--model", "m", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2, res.stderr
    assert "does not run at the image's paths" in res.stderr and "(the image's: /opt/venv)" in res.stderr
    assert not out.exists() and "Traceback" not in res.stderr
