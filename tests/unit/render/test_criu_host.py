"""The Dockerfile `builder snapshot criu` builds (dockerfiles/criu-host.Dockerfile.j2): the runtime images' own criu
stage (the source, its sha256 and the patch from builder/data/criu/criu.toml), then the binary made relocatable and
checked after a move, exported from scratch. hadolint-clean, no syntax line, no secret in a layer (the CA bundle is
a BuildKit secret mount). Built for real in tests/docker/deploy/test_snapshot_criu_host.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from builder.deploy.snapshot import hostcriu
from builder.resolve import criu_data


def test_the_host_dockerfile_is_the_image_stage_made_relocatable_and_hadolint_clean(tmp_path):
    criu = criu_data()
    text = hostcriu.dockerfile(criu)
    assert not text.lstrip().startswith("# syntax")
    assert text.index("ARG BASE_DEVEL_IMAGE") < text.index("FROM ${BASE_DEVEL_IMAGE} AS criu")  # a global ARG
    assert f'echo "{criu["sha256"]}  criu.tar.xz" | sha256sum --check --strict -' in text
    assert all(f"patch -d criu -p1 < {p}" in text for p in criu["patches"])
    assert "--set-rpath '$ORIGIN/../lib'" in text and "cp -a /opt/builder/criu /moved/criu" in text
    assert text.rstrip().endswith("FROM scratch AS out\nCOPY --from=relocatable /opt/builder/criu /")
    assert "--mount=type=secret,id=ca" in text and "/run/secrets/ca" in text and "COPY ca" not in text
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    path = tmp_path / "criu-host.Dockerfile"
    path.write_text(text)
    res = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
