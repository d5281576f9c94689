"""builder.audit against real binaries: tiny CUDA libraries compiled here, and wheels from PyPI.

The Docker half of tests/unit/builds/test_audit.py: its docstring says the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from builder.audit import audit_image, format_report
from builder.errors import CommandError

from tests.support import audit as support
from tests.support.audit import LINKER_SCRIPT, S

# fixtures shared with the other half, found by pytest under these names
built = support.built
host_cc = support.host_cc


def test_audit_image_of_a_missing_image_raises_command_error(docker_engine):
    # Without the daemon this would raise CommandError too: the fixture makes it a test of the image lookup.
    missing = f"builder-audit-missing-{uuid.uuid4().hex[:12]}:none"
    with pytest.raises(CommandError) as info:
        audit_image(missing, [80])
    argv = info.value.argv
    assert argv[:2] == ["docker", "create"] and argv[argv.index("--pull") + 1] == "never"  # never pulled
    assert f"No such image: {missing}" in info.value.output


def test_audit_image(docker_engine, built, tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "opt" / "app").mkdir(parents=True)
    shutil.copy(built["sm80"], root / "usr" / "lib" / "libold.so")
    shutil.copy(built["sm80_sm90"], root / "opt" / "app" / "_C.so")
    os.link(root / "opt" / "app" / "_C.so", root / "opt" / "app" / "_C_hard.so.1")
    os.symlink("libold.so", root / "usr" / "lib" / "libold.so.1")
    (root / "usr" / "lib" / "libc.so").write_bytes(LINKER_SCRIPT)
    tag = f"builder-audit-test-{uuid.uuid4().hex[:12]}:latest"
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, check=True, capture_output=True)
    tar.wait()
    try:
        report = audit_image(tag, [80, 90])
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], check=False, capture_output=True)
    assert [b.path for b in report.binaries] == [
        "/opt/app/_C.so", "/opt/app/_C_hard.so.1", "/usr/lib/libc.so", "/usr/lib/libold.so",
    ]  # fmt: skip
    assert report.binary("/opt/app/_C_hard.so.1").entries == (S(80), S(90))
    assert [b.path for b in report.failures] == ["/usr/lib/libold.so"]
    assert "FAIL /usr/lib/libold.so: sm_90 missing (has SASS sm_80, no PTX)" in format_report(report)
