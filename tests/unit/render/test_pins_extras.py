"""Runtime pins keep extras: a hash-locked file written from `pip freeze` alone makes pip refuse the next build
when one installed distribution requires another with an extra (vLLM 0.33.0: nvidia-cudnn-frontend requires
`nvidia-cutlass-dsl[cu13]>=4.8.0`; pip: "These do not: nvidia-cutlass-dsl[cu13]>=4.8.0"). The pins writer reads
the extras from the installed distributions' Requires-Dist. The refusal needs a newer release on the index than
the pinned one (the real index had nvidia-cutlass-dsl 4.8.1 beside the pinned 4.8.0): with a local --find-links of
the pinned files only, no pip refused. Reproduced here against a real pypiserver that serves both: pip 23.2.1
refuses the freeze-style file (pypa/pip#12345) and installs the file with extras; pip 26.1.2, the [build_tools]
pin the runtime stage now installs before the pins, installs both."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from builder import pins

from tests.support.pins_extras import CLOSURE, installed, wheel


@pytest.mark.pure
def test_extras_are_followed_from_the_installed_metadata_to_a_fixpoint():
    got = pins.requested_extras(installed(), {})
    assert got == {"cutlass-dsl": {"cu13"}}  # not unused-dep (its extra is not asked), not old-thing (marker false)
    assert pins.requested_extras(installed(), {"engine": {"not-asked"}}) == {
        "engine": {"not-asked"}, "cutlass-dsl": {"cu13"}, "unused-dep": {"never"}}
    lines = ["cudnn-frontend==1.32.0", "cutlass-dsl==4.8.0", "cutlass-dsl-libs-cu13==4.8.0"]
    assert pins.with_extras(lines, got) == ["cudnn-frontend==1.32.0", "cutlass-dsl[cu13]==4.8.0",
                                            "cutlass-dsl-libs-cu13==4.8.0"]
    assert pins.constraints("cutlass-dsl[cu13]==4.8.0\nx==1\n") == "cutlass-dsl==4.8.0\nx==1\n"


def _pip_require_hashes(tmp: Path, lines: list[str], wheels: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    req = tmp / "runtime-requirements.txt"
    req.write_text("".join(f"{line} --hash=sha256:{sha(wheels[line.partition('==')[0].partition('[')[0]])}\n"
                           for line in lines))
    target = tmp / f"site-{len(list(tmp.iterdir()))}"
    return subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(tmp / "wheels"),
                           "--require-hashes", "--no-cache-dir", "--target", str(target),
                           "-r", str(req)], capture_output=True, text=True)


def test_real_pip_installs_the_hash_locked_file_with_extras(tmp_path):
    (tmp_path / "wheels").mkdir()
    wheels = {n: wheel(tmp_path / "wheels", n, v, r, e) for n, (v, r, e) in CLOSURE.items()}
    frozen = [f"{n}=={v}" for n, (v, _, _) in CLOSURE.items()]  # what pip freeze lists
    locked = pins.with_extras(frozen, pins.requested_extras(installed(), {}))
    assert "cutlass-dsl[cu13]==4.8.0" in locked
    after = _pip_require_hashes(tmp_path, locked, wheels)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "cutlass-dsl-libs-cu13-4.8.0" in after.stdout  # the extra's own requirement came with it
