"""Runtime pins keep extras: a hash-locked file written from `pip freeze` alone makes pip refuse the next build

The Docker half of tests/unit/render/test_pins_extras.py: its docstring says the rest."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder import pins

from tests.support.pins_extras import CLOSURE, installed, wheel


# The refusal needs what the real index had: a newer release of the package asked for with an extra than the one
# pinned (nvidia-cutlass-dsl 4.8.1 beside the pinned 4.8.0). pip's resolver then looks for `cutlass-dsl[cu13]>=4.8.0`
# among the index's files, takes 4.8.1, and in --require-hashes mode refuses that requirement as unpinned — pip
# 23.2.1 (pypa/pip#12345); newer pips (26.1.2 here) derive the base requirement from it and keep the pinned release.
INDEX_CLOSURE = {**CLOSURE, "cutlass-dsl-new": ("4.8.1", CLOSURE["cutlass-dsl"][1], ["cu13"]),
                 "cutlass-dsl-libs-cu13-new": ("4.8.1", [], [])}


def _publish(host: str, path: Path, name: str, version: str) -> None:
    import requests

    with path.open("rb") as fh:
        resp = requests.post(f"http://{host}/", data={":action": "file_upload", "name": name, "version": version},
                             files={"content": (path.name, fh)}, timeout=30)
    assert resp.status_code == 200, resp.text


def _pip(where: Path, version: str) -> list[str]:
    """The argv of a real pip of that version, run from its wheel (pip runs from a zip: python pip.whl/pip)."""
    where.mkdir()
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
                          "--dest", str(where), f"pip=={version}"], capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr
    (whl,) = where.glob("pip-*.whl")
    return [sys.executable, f"{whl}/pip"]


# slow: two pips against a real index in a container; the default tier installs the pins with extras with a real pip
# in tests/unit/render/test_pins_extras.py
@pytest.mark.slow
def test_pip_refuses_freeze_style_pins_and_installs_the_pins_with_extras_from_a_real_index(tmp_path, local_bases):
    """A real pypiserver (tests/services.py) serves the closure with the newer releases, and a real pip installs the
    hash-locked file from it. pip 23.2.1 refuses the freeze-style pins (no extras) with its own message and installs
    the pins builder writes (extras kept): exactly the pinned releases. pip 26.1.2 (the [build_tools] pin the
    runtime stage installs first) installs both, which is why the refusal did not reproduce there."""
    from tests import services

    services.build_image(services.INDEX_IMAGE, services.SERVICES / "pypiserver")
    old, new = _pip(tmp_path / "pip23", "23.2.1"), _pip(tmp_path / "pip26", "26.1.2")
    dist = tmp_path / "dist"
    dist.mkdir()
    files = {}
    for key, (version, requires, extras) in INDEX_CLOSURE.items():
        name = key.removesuffix("-new")
        files[(name, version)] = wheel(dist, name, version, requires, extras)
    sha = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items()}
    frozen = [f"{n}=={v}" for n, (v, _, _) in CLOSURE.items()]  # what pip freeze lists after the first build
    fixed = pins.with_extras(frozen, pins.requested_extras(installed(), {}))
    assert frozen != fixed and "cutlass-dsl[cu13]==4.8.0" in fixed

    def install(pip: list[str], lines: list[str], name: str) -> subprocess.CompletedProcess[str]:
        req = tmp_path / f"{name}.txt"
        req.write_text("".join(f"{l} --hash=sha256:{sha[(l.partition('==')[0].partition('[')[0], l.partition('==')[2])]}\n"
                               for l in lines))
        return subprocess.run([*pip, "install", "--disable-pip-version-check", "--no-cache-dir",
                               "--index-url", f"http://{idx.host}/simple/", "--require-hashes", "--target",
                               str(tmp_path / f"site-{name}"), "-r", str(req)], capture_output=True, text=True)

    with services.index(overwrite=True) as idx:
        for (name, version), path in files.items():
            _publish(idx.host, path, name, version)
        refused = install(old, frozen, "frozen-pip23")
        assert refused.returncode != 0, refused.stdout
        assert "In --require-hashes mode, all requirements must have their versions pinned with ==" in refused.stderr
        assert re.search(r"These do not:\s+cutlass-dsl\[cu13\]>=4\.8\.0 from .*cutlass_dsl-4\.8\.1", refused.stderr), \
            refused.stderr
        for pip, name in ((old, "fixed-pip23"), (new, "fixed-pip26"), (new, "frozen-pip26")):
            passed = install(pip, fixed if name.startswith("fixed") else frozen, name)
            assert passed.returncode == 0, (name, passed.stdout + passed.stderr)
            # exactly the pinned releases, the extra's own requirement with them: never the index's newer 4.8.1
            assert sorted(p.name for p in (tmp_path / f"site-{name}").glob("*.dist-info")) == [
                "cudnn_frontend-1.32.0.dist-info", "cutlass_dsl-4.8.0.dist-info",
                "cutlass_dsl_libs_cu13-4.8.0.dist-info", "engine-1.0.dist-info"], name
