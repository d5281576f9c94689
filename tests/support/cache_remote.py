"""What the two halves of test_cache_remote.py share: tests/unit/cache/test_cache_remote.py (its tests that need no
Docker) and tests/docker/cache/test_cache_remote.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from builder.cache import file_records

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
KEY = hashlib.sha256(b"cuda-ext test entry").hexdigest()
ARCHS = (80, 90)


# -- helpers ---------------------------------------------------------------------------------------------
def make_wheel(dest: Path, payload: bytes = b"\x7fELF fake kernel library", dist: str = "cuda_ext", version: str = "1.0.0") -> Path:
    """A valid wheel (METADATA, WHEEL, a correct RECORD) carrying `payload` as a library."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-{version}-cp311-cp311-linux_x86_64.whl"
    info = f"{dist}-{version}.dist-info"
    members = {
        f"{dist}/__init__.py": b"__version__ = '1.0.0'\n",
        f"{dist}/libsaxpy.so": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: cuda-ext\nVersion: {version}\n\nA test wheel.\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
    }
    import base64

    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}" for n, d in members.items()]
    members[f"{info}/RECORD"] = ("\n".join(rows + [f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return path


def manifest_for(wheels: list[Path], key: str = KEY, audit_ok: bool = True) -> dict:
    return {"format": 2, "package": "cuda-ext", "version": "1.0.0", "key": key,
            "key_inputs": {"cuda": "13.0.88", "torch": "2.14.0", "built_archs": [80, 90]},
            "wheels": [w.name for w in wheels], "files": file_records(wheels), "compiled": False,
            "audit": {"ok": audit_ok, "archs": [80, 90]}, "built_by": {"at": "2026-11-29T00:00:00Z", "user": "test"}}


def rewrite_member(wheel: Path, member_suffix: str, data: bytes, out: Path) -> Path:
    """A copy of `wheel`, still a valid zip, with one member's content replaced (RECORD left as it was)."""
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info, data if info.filename.endswith(member_suffix) else zin.read(info))
    return out


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=600)
