"""The local wheel cache never trusts an entry blindly: hashes, sizes and the recorded audit are checked on
every reuse; a bad entry is quarantined (not deleted) and rebuilt; one compile per key across concurrent
builds; entries follow the umask. Real files, real locks, real processes; the end-to-end cases run real
builds of the fixture cell (tests/fixtures/cuda-ext) on the Docker engine."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from builder.cache import CacheCorrupt, file_records
from builder.cache.local import MANIFEST, QUARANTINE, Wheelhouse

from .helpers import REPO, a_wheel, run_cli

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
KEY = "a" * 64



def stored(tmp: Path, archs=(80, 90), ok=True) -> tuple[Wheelhouse, Path]:
    wh = Wheelhouse(tmp / "wheelhouse")
    whl = a_wheel(tmp / "out")
    wh.store("demo", KEY, [whl], {"files": file_records([whl]), "audit": {"ok": ok, "archs": list(archs)}})
    return wh, wh.entry_dir("demo", KEY) / whl.name


@pytest.mark.pure
def test_a_good_entry_is_a_hit_and_fetches_verified(tmp_path):
    wh, whl = stored(tmp_path)
    hit = wh.lookup("demo", KEY, (80, 90))
    assert hit.usable and hit.wheels == (whl.name,)
    (got,) = wh.fetch(hit, tmp_path / "dest")
    assert got.read_bytes() == whl.read_bytes()
    assert wh.lookup("demo", "b" * 64, (80, 90)) is None


@pytest.mark.pure
@pytest.mark.parametrize("damage, problem", [
    # a wheel tampered inside a valid zip: same size, other bytes
    ("tamper", "sha256"),
    ("bitflip", "sha256"),
    ("truncate", "bytes, the manifest says"),
])
def test_a_damaged_wheel_is_never_returned(tmp_path, damage, problem):
    wh, whl = stored(tmp_path)
    data = bytearray(whl.read_bytes())
    if damage == "tamper":
        os.unlink(whl)  # hard links elsewhere keep the old bytes; replace the file
        a_wheel(tmp_path / "evil", b"print('HELLO')\n").rename(whl)
        assert whl.stat().st_size == len(data)
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x01
        whl.write_bytes(bytes(data))
    else:
        whl.write_bytes(bytes(data[: len(data) // 2]))
    hit = wh.lookup("demo", KEY, (80, 90))
    if damage == "truncate":  # a size mismatch is seen without hashing
        assert not hit.usable and problem in hit.problem
        return
    assert hit.usable  # lookup is cheap: the hash is checked when the bytes are used
    with pytest.raises(CacheCorrupt, match=problem):
        wh.fetch(hit, tmp_path / "dest")
    assert not list((tmp_path / "dest").glob("*.whl")), "nothing unverified is left for the image"


@pytest.mark.pure
@pytest.mark.parametrize("manifest, problem", [
    ({"audit": {"ok": False, "archs": [80, 90]}}, "its recorded audit did not pass"),
    ({"audit": {"ok": True, "archs": [80]}}, "its audit was for archs [80], not [80, 90]"),
    ({"files": {}}, "records no sha256 and size"),
    ({"wheels": ["../escape.whl"]}, "records no sha256 and size"),
])
def test_a_manifest_that_proves_nothing_is_no_hit(tmp_path, manifest, problem):
    wh, whl = stored(tmp_path)
    path = wh.entry_dir("demo", KEY) / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **manifest}))
    hit = wh.lookup("demo", KEY, (80, 90))
    assert not hit.usable and problem in hit.problem


@pytest.mark.pure
def test_unreadable_manifest_is_reported_not_raised(tmp_path):
    wh, _ = stored(tmp_path)
    (wh.entry_dir("demo", KEY) / MANIFEST).write_text("{not json")
    hit = wh.lookup("demo", KEY, (80, 90))
    assert not hit.usable and MANIFEST in hit.problem


@pytest.mark.pure
def test_discard_quarantines_with_the_reason(tmp_path):
    wh, whl = stored(tmp_path)
    hit = wh.lookup("demo", KEY, (80, 90))
    where = Path(wh.discard(hit, "sha256 mismatch"))
    assert where.parent == wh.root / QUARANTINE / "demo" and (where / whl.name).is_file()
    assert (where / "QUARANTINED").read_text() == "sha256 mismatch\n"
    assert wh.lookup("demo", KEY, (80, 90)) is None


@pytest.mark.pure
def test_entries_follow_the_umask_and_stale_temporaries_go(tmp_path):
    stale = tmp_path / "wheelhouse" / "demo" / f".{KEY[:12]}-dead_123"  # a name mkdtemp gives
    stale.mkdir(parents=True)
    os.utime(stale, (time.time() - 7200, time.time() - 7200))  # left by a build that died two hours ago
    # a concurrent store's (a pull stores without the key's lock): young, so it is left to that store
    young = tmp_path / "wheelhouse" / "demo" / f".{KEY[:12]}-live_456"
    young.mkdir()
    old = os.umask(0o002)
    try:
        wh, whl = stored(tmp_path)
    finally:
        os.umask(old)
    entry = wh.entry_dir("demo", KEY)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o775
    assert stat.S_IMODE(whl.stat().st_mode) == 0o664
    assert stat.S_IMODE((entry / MANIFEST).stat().st_mode) == 0o664
    assert not stale.exists() and young.is_dir()


@pytest.mark.pure
def test_a_store_whose_copy_differs_from_the_audited_hashes_leaves_nothing(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    whl = a_wheel(tmp_path / "out")
    records = file_records([whl])
    records[whl.name]["sha256"] = "0" * 64
    with pytest.raises(CacheCorrupt):
        wh.store("demo", KEY, [whl], {"files": records, "audit": {"ok": True, "archs": [80]}})
    assert not wh.entry_dir("demo", KEY).exists()
    assert not [p for p in (wh.root / "demo").iterdir()], "no temporary directory left behind"


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from builder.cache.local import Wheelhouse
wh = Wheelhouse(Path(sys.argv[1]))
with wh.lock("demo", sys.argv[2]):
    print("locked", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_the_key_lock_makes_a_second_build_wait(tmp_path):
    wh = Wheelhouse(tmp_path / "wheelhouse")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(wh.root), KEY, "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    said = []
    t0 = time.monotonic()
    with wh.lock("demo", KEY, waiting=said.append):
        waited = time.monotonic() - t0
    holder.wait()
    assert waited > 0.5 and said == [f"waiting for another build of demo (key {KEY[:16]}) to finish"]
    with wh.lock("demo", "b" * 64, waiting=said.append):  # another key is not blocked
        pass
    assert len(said) == 1


@pytest.mark.pure
def test_wheels_verb_lists_verifies_and_prunes(tmp_path):
    wh, whl = stored(tmp_path)
    wh2 = Wheelhouse(tmp_path / "wheelhouse")
    other = a_wheel(tmp_path / "out2", b"x = 2\n")
    wh2.store("demo", "c" * 64, [other], {"files": file_records([other]), "audit": {"ok": True, "archs": [80]},
                                         "compiled": False})
    ls = run_cli("wheels", "ls", "--wheelhouse", str(wh.root), "--json")
    assert ls.exit_code == 0
    assert sorted(e["key"] for e in json.loads(ls.output)) == [KEY, "c" * 64]
    # the first entry says compiled (default) but carries no device code: verify names it
    res = run_cli("wheels", "verify", "--wheelhouse", str(wh.root))
    assert res.exit_code == 1
    assert f"BAD  demo==? {KEY[:16]}: no binary carries device code" in res.output
    assert f"ok   demo==? {'c' * 16}" in res.output
    whl.write_bytes(b"junk")  # now its hash is wrong too: the cheaper check speaks first
    res = run_cli("wheels", "verify", "--wheelhouse", str(wh.root), "--quarantine")
    assert res.exit_code == 1 and "bytes, the manifest says" in res.output and "moved to" in res.output
    assert not wh.entry_dir("demo", KEY).exists()
    prune = run_cli("wheels", "prune", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(wh.root),
                    "--unused", "--leftovers", "--dry-run")
    assert prune.exit_code == 0 and "would remove" in prune.output and "2 would be removed" in prune.output
    assert wh.entry_dir("demo", "c" * 64).exists()
    gone = run_cli("wheels", "prune", "--matrix", str(FIXTURE / "matrix.toml"), "--wheelhouse", str(wh.root),
                   "--unused", "--leftovers")
    assert gone.exit_code == 0 and not wh.entry_dir("demo", "c" * 64).exists()
    assert not list((wh.root / QUARANTINE).glob("*/*"))
    none = run_cli("wheels", "prune", "--wheelhouse", str(wh.root))
    assert none.exit_code == 2 and "say what to remove" in none.output


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
