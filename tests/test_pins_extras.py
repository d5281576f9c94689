"""Runtime pins keep extras: a hash-locked file written from `pip freeze` alone makes pip refuse the next build
when one installed distribution requires another with an extra (vLLM 0.33.0: nvidia-cudnn-frontend requires
`nvidia-cutlass-dsl[cu13]>=4.8.0`; pip: "These do not: nvidia-cutlass-dsl[cu13]>=4.8.0"). The pins writer reads
the extras from the installed distributions' Requires-Dist. The file it writes is installed by the real pip of this
environment from wheels written here, in the shape of that closure (--no-index --find-links). The refusal itself
did not reproduce on these synthetic wheels with pip 23.0.1, 23.2.1, 24.0, 25.0 or 25.3 (each installed both
files), nor with the real packages: nvidia-cudnn-frontend 1.32.0's closure from PyPI (nvidia-cutlass-dsl 4.8.0
and 4.8.1 with their libs, apache-tvm-ffi, cuda-bindings, ...) hash-locked without the extra, `pip install --dry-run
--require-hashes` with pip 24.0 and 26.1.2 on Python 3.11 installs it. It was seen with the whole real vLLM 0.33.0
closure from PyPI in the image (Python 3.12), which the slow test of the real cell covers."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder import pins


def wheel(dir: Path, name: str, version: str, requires: list[str], extras: list[str] = ()) -> Path:
    """A minimal valid pure-Python wheel (METADATA, WHEEL, RECORD)."""
    dist = name.replace("-", "_")
    path = dir / f"{dist}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Provides-Extra: {e}\n" for e in extras) + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{dist}/__init__.py": "", f"{dist}-{version}.dist-info/METADATA": meta,
             f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},{len(c)}\n"
                     for n, c in files.items()) + f"{dist}-{version}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, c in files.items():
            zf.writestr(n, c)
        zf.writestr(f"{dist}-{version}.dist-info/RECORD", record)
    return path


CLOSURE = {  # name: (version, Requires-Dist, Provides-Extra)
    "engine": ("1.0", ["cudnn-frontend==1.32.0", 'unused-dep[never]; extra == "not-asked"'], ["not-asked"]),
    "cudnn-frontend": ("1.32.0", ["cutlass-dsl[cu13]>=4.8.0"], []),
    "cutlass-dsl": ("4.8.0", ['cutlass-dsl-libs-cu13==4.8.0; extra == "cu13"', 'old-thing[x]; python_version < "3"'], ["cu13"]),
    "cutlass-dsl-libs-cu13": ("4.8.0", [], []),
}


def installed() -> dict:
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
           "platform_machine": "x86_64", "platform_system": "Linux", "platform_release": "", "platform_version": "",
           "implementation_name": "cpython", "implementation_version": "3.12.3", "platform_python_implementation": "CPython"}
    return {"env": env, "dists": [{"name": n, "version": v, "requires": r} for n, (v, r, _) in CLOSURE.items()]}


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
