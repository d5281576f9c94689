"""Bounded against hostile remotes (builder/net.py): every answer read from a registry, an index or a download

The Docker half of tests/unit/net/test_hostile_remotes.py: its docstring says the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


# -- a full disk during `wheels pull` ----------------------------------------------------------------------
@pytest.mark.parametrize("free_kib", [0, 600], ids=["full-before-the-download", "room-for-the-download-only"])
def test_a_disk_that_fills_during_a_pull_names_the_wheelhouse_not_a_removed_directory(registry, tmp_path, free_kib):
    """Issue 28: after ENOSPC during `wheels pull` the message named the staging directory the pull had already
    removed ("the wheels are still in …/.pulls/…"). A real registry holds a 400 KiB wheel; the wheelhouse is a
    1 MiB tmpfs filled so that the download fails (0 KiB free) or only the copy into the entry does (600 KiB
    free). Either way: exit 1, the message names the wheelhouse and the OS error, every path it names exists,
    and nothing is left in the wheelhouse."""
    import re

    from builder.cache import file_records
    from builder.cache.local import Wheelhouse

    from tests.helpers import a_wheel

    key = "f" * 64
    src = Wheelhouse(tmp_path / "src")
    whl = a_wheel(tmp_path / "out", payload=os.urandom(400 << 10))  # incompressible: the wheel is ~400 KiB
    src.store("demo", key, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]}, "compiled": False})
    m = ["--matrix", str(REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml")]
    remote = ["--cache-remote", f"registry:{registry}/full-disk-{free_kib}", "--key", f"demo:{key}"]
    pushed = subprocess.run([sys.executable, "-m", "builder.cli", "wheels", "push", *m, "--wheelhouse", str(src.root),
                             *remote], capture_output=True, text=True, cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"mounting a tmpfs failed (tests run as root on the CI machines): {mounted.stderr}"
    try:
        wh = mnt / "wh"
        wh.mkdir()
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'filler'}", "bs=4k"], capture_output=True)  # until ENOSPC
        if free_kib:
            subprocess.run(["truncate", "-s", f"-{free_kib}K", str(mnt / "filler")], check=True)
        res = subprocess.run([sys.executable, "-m", "builder.cli", "wheels", "pull", *m, "--wheelhouse", str(wh), *remote],
                             capture_output=True, text=True, cwd=tmp_path)
        out = res.stdout + res.stderr
        assert res.returncode == 1 and "Traceback" not in out, out
        line = next(l for l in res.stderr.splitlines() if l.startswith("error: "))
        assert "No space left on device" in line and str(wh) in line and "nothing was written" in line, line
        named = [Path(p.rstrip(":;,.)")) for p in re.findall(r"(?<![\w:.])(/[^\s'\"]+)", line)]
        assert named and all(p.exists() for p in named), f"names a path that does not exist: {line}"
        assert not list(wh.rglob("*.whl")) and not list(wh.rglob("builder-wheel.json")), sorted(wh.rglob("*"))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
