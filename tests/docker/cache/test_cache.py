"""The local wheel cache never trusts an entry blindly: hashes, sizes and the recorded audit are checked on

The Docker half of tests/unit/cache/test_cache.py: its docstring says the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from builder.cache.local import QUARANTINE

from tests.helpers import run_cli
from tests.support.cache import FIXTURE

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# --------------------------------------------------------------------------- end to end on the engine


def build(tmp: Path, *extra: str, wheelhouse: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "builder.cli", "build", "--matrix", str(FIXTURE / "matrix.toml"),
            "--wheelhouse", str(wheelhouse or tmp / "wheelhouse"), "--work-dir", str(tmp / "work"),
            "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"), "--ca-bundle", str(HOST_CA),
            "--quiet", "--json", *extra]
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, err_so_far: str = "") -> tuple[int, list, str]:
    out, err = proc.communicate(timeout=900)
    return proc.returncode, json.loads(out) if out.strip().startswith("[") else [], err_so_far + err


# slow: two builds racing over a full compile; the default tier holds the key lock in tests/unit/cache/test_cache.py
@pytest.mark.slow
def test_two_concurrent_builds_of_one_cell_compile_once(local_bases, docker_engine, tmp_path):
    shared = tmp_path / "shared-wheelhouse"
    # a SOURCE_DATE_EPOCH no earlier build used: BuildKit cannot take the compile from its layer cache, so
    # the first build holds the key's lock for the whole nvcc run (it is not part of the cache key)
    env = {"SOURCE_DATE_EPOCH": str(1_600_000_000 + os.getpid() % 100_000 + int(time.time()) % 1000)}
    first = build(tmp_path / "a", wheelhouse=shared, env=env)
    seen = ""
    while "build cuda-ext==1.0.0" not in seen:  # the first build has the lock and is compiling
        line = first.stderr.readline()
        assert line, seen
        seen += line
    second = build(tmp_path / "b", wheelhouse=shared, env=env)
    (rc1, out1, err1), (rc2, out2, err2) = finish(first, seen), finish(second)
    assert rc1 == 0 and rc2 == 0, err1 + err2
    assert out1[0]["built"] == ["cuda-ext==1.0.0"] and out1[0]["reused"] == []
    assert out2[0]["built"] == [] and out2[0]["reused"] == ["cuda-ext==1.0.0"], err2
    assert "waiting for another build of cuda-ext" in err2
    assert len(list(shared.glob("cuda-ext/*/*.whl"))) == 1


@pytest.mark.parametrize("targets", ["same", "different"])
def test_two_builds_moving_one_cell_tag_at_once_both_succeed(local_bases, docker_engine, targets):
    """The race of the test above, alone: in the containerd image store a tag move is a delete and a create, so
    of two `docker tag`s of one name at the same moment one fails with "already exists" (12 of 15 rounds here
    with the plain command). docker.point_tag accepts that answer when the name points at its digest (the
    other build loaded the same image) and tries again otherwise: every move succeeds."""
    import threading
    import uuid

    from builder import docker

    a, b, before = (docker.image_id(local_bases[n]) for n in ("debian", "cuda_base", "cuda_devel"))
    name = f"builder-test-tagrace-{uuid.uuid4().hex[:8]}/cell:1.0"
    wanted = [b, b] if targets == "same" else [a, b]
    try:
        for _ in range(15):
            docker.point_tag(name, before)  # the name exists and names another image: both moves delete it
            errors: list[BaseException] = []

            def move(digest: str) -> None:
                try:
                    docker.point_tag(name, digest)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=move, args=(d,)) for d in wanted]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
            assert docker.image_id(name) in wanted
    finally:
        subprocess.run(["docker", "image", "rm", name], capture_output=True)


# slow: a compile and a rebuild; the default tier holds a damaged entry never returned and quarantined in
# tests/unit/cache/test_cache.py
@pytest.mark.slow
def test_a_tampered_cached_wheel_is_quarantined_and_rebuilt(local_bases, docker_engine, tmp_path):
    rc, out, err = finish(build(tmp_path))
    assert rc == 0, err
    (whl,) = (tmp_path / "wheelhouse").glob("cuda-ext/*/*.whl")
    # a valid zip, another library inside: same name, other bytes
    with zipfile.ZipFile(whl) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    members["cuda_ext/libsaxpy.so"] = members["cuda_ext/libsaxpy.so"][:-64] + b"\0" * 64
    os.unlink(whl)
    with zipfile.ZipFile(whl, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    rc, out, err = finish(build(tmp_path))
    assert rc == 0, err
    assert "cache entry of cuda-ext==1.0.0" in err and "is bad:" in err and "compiling again" in err
    assert out[0]["built"] == ["cuda-ext==1.0.0"] and out[0]["reused"] == []
    (quarantined,) = (tmp_path / "wheelhouse" / QUARANTINE / "cuda-ext").iterdir()
    assert whl.name in (quarantined / "QUARANTINED").read_text()  # names the file and what differs
    # the rebuilt entry verifies, and the image has the audited bytes
    res = run_cli("wheels", "verify", "--wheelhouse", str(tmp_path / "wheelhouse"))
    assert res.exit_code == 0, res.output
