"""`builder snapshot criu`: CRIU for a GPU host without Docker, built by the real BuildKit from the runtime images'
own criu stage on a Debian bookworm base (the local base; the GPU host runs the same directory), exported whole, its
libraries found beside it wherever it is put. This machine plays the host: the binary runs here after the directory
is moved, and `criu check` passes on this kernel. A build that fails leaves nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import HOST_CA, REPO

BASE = "builder-local/debian:bookworm"


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=1800, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_criu_for_a_host_is_built_on_the_base_and_runs_from_wherever_it_is_put(local_bases, tmp_path):
    out = tmp_path / "criu"
    built = builder("snapshot", "criu", "--base", BASE, "--out", str(out), "--ca-bundle", str(HOST_CA), "--json",
                    cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    done = json.loads(built.stdout)
    assert done["criu"] == "4.1.1" and done["patches"] == ["criu-4.1.1-sockopts-linux-6.16.patch"]
    assert set(done["files"]) == {"BUILT_ON", "bin/criu", "lib/libnet.so.1", "lib/libnl-3.so.200",
                                  "lib/libprotobuf-c.so.1", "lib/libuuid.so.1"}
    assert done["built_on"][0] == f"base {BASE}" and "GLIBC 2.36" in done["built_on"][1]  # what the host must have
    assert (out.stat().st_mode & 0o777) == 0o755 and os.access(out / "bin" / "criu", os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == ["criu"]  # no temporary directory left beside it
    moved = tmp_path / "elsewhere" / "tools"
    moved.parent.mkdir()
    shutil.move(out, moved)  # where a host puts it: the libraries come with it ($ORIGIN/../lib)
    linked = subprocess.run(["ldd", str(moved / "bin" / "criu")], capture_output=True, text=True, check=True).stdout
    assert f"{moved}/bin/../lib/libprotobuf-c.so.1" in linked and "not found" not in linked, linked
    version = subprocess.run([str(moved / "bin" / "criu"), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "Version: 4.1.1" in version.stdout
    check = subprocess.run([str(moved / "bin" / "criu"), "check"], capture_output=True, text=True)
    assert check.returncode == 0 and "Looks good." in check.stdout + check.stderr, check.stdout + check.stderr


def test_a_build_that_fails_leaves_nothing(local_bases, tmp_path):
    out = tmp_path / "criu"
    failed = builder("snapshot", "criu", "--base", "builder-test/no-such-base:never", "--out", str(out), cwd=tmp_path)
    assert failed.returncode == 1 and "building CRIU on builder-test/no-such-base:never failed" in failed.stderr, \
        failed.stderr[-2000:]
    assert "nothing written" in failed.stderr and list(tmp_path.iterdir()) == []
