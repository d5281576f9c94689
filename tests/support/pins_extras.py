"""What the two halves of test_pins_extras.py share: tests/unit/render/test_pins_extras.py (its tests that need no
Docker) and tests/docker/render/test_pins_extras.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


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
