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
from pathlib import Path

import pytest

from builder.cache import CacheCorrupt, file_records
from builder.cache.local import MANIFEST, QUARANTINE, Wheelhouse

from tests.helpers import a_wheel, run_cli
from tests.support.cache import FIXTURE

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
