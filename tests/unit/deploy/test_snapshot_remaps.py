"""A snapshot's link remaps (builder/deploy/snapshot/remaps.py): a record's entries are trusted only as CRIU's
`link_remap.N` at an absolute path with their copy under remaps/ (a pulled snapshot.json must not make a restore,
which runs as root, write anywhere else), and the readers find what CRIU leaves: the directories of a process's
files open or mapped under a removed name, and the `link_remap.N` files in them. Run against this process and a
real directory (no CRIU here: the dump itself is tested in tests/docker/deploy/test_snapshot.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.deploy.snapshot import remaps
from builder.errors import UserError


class Here:
    """Commands on this host, as the process route's place runs them."""

    where = "on this host"
    local = True

    def run(self, argv, timeout=600):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr

    def inside(self, directory):
        return str(directory)


def snapshot(tmp_path: Path, entries) -> Path:
    (tmp_path / "remaps").mkdir()
    (tmp_path / "remaps" / "0-link_remap.7").write_bytes(b"\0" * 32)
    (tmp_path / "snapshot.json").write_text(json.dumps({"link_remaps": entries}))
    return tmp_path


GOOD = {"path": "/dev/shm/link_remap.7", "file": "remaps/0-link_remap.7"}


def test_a_remap_at_an_absolute_path_with_its_copy_is_taken(tmp_path):
    snap = snapshot(tmp_path, [GOOD])
    assert remaps.checked(snap, {"link_remaps": [GOOD]}) == [GOOD]
    assert remaps.checked(snap, {}) == []  # a snapshot taken before remaps were kept, or of an engine with none


@pytest.mark.parametrize("entry", [
    {"path": "/etc/cron.d/evil", "file": "remaps/0-link_remap.7"},  # not CRIU's name: anywhere as root
    {"path": "dev/shm/link_remap.7", "file": "remaps/0-link_remap.7"},  # relative
    {"path": "/dev/shm/../../etc/link_remap.7", "file": "remaps/0-link_remap.7"},
    {"path": "/dev/shm/link_remap.7", "file": "images/inventory.img"},  # not a copy of a remap
    {"path": "/dev/shm/link_remap.7", "file": "remaps/../key.json"},
    {"path": "/dev/shm/link_remap.7", "file": "remaps/missing"},
    {"path": "/dev/shm/link_remap.7"},
    "link_remap.7",
])
def test_a_hostile_or_damaged_entry_is_refused_before_anything_runs(tmp_path, entry):
    snap = snapshot(tmp_path, [entry])
    with pytest.raises(UserError, match="take the snapshot again"):
        remaps.checked(snap, {"link_remaps": [entry]})


def test_a_copy_that_is_a_link_is_refused(tmp_path):
    snap = snapshot(tmp_path, [])
    (snap / "remaps" / "1-link_remap.8").symlink_to("/etc/passwd")
    entry = {"path": "/dev/shm/link_remap.8", "file": "remaps/1-link_remap.8"}
    with pytest.raises(UserError):
        remaps.checked(snap, {"link_remaps": [entry]})
    with pytest.raises(UserError):
        remaps.checked(snap, {"link_remaps": "not a list"})


def test_the_directories_of_a_removed_but_mapped_file_are_found_and_its_remaps_listed(tmp_path):
    """A child maps a file and removes its name (as glibc does to a semaphore's temporary name); the reader finds
    its directory, and lists the link_remap.N files there that were not there before."""
    d = tmp_path / "shm"
    d.mkdir()
    child = subprocess.Popen([sys.executable, "-c", (
        "import mmap,os,sys,time\n"
        f"p={str(d / 'sem.tmpXYZ')!r}\n"
        "f=open(p,'w+b'); f.write(b'\\0'*4096); f.flush()\n"
        "m=mmap.mmap(f.fileno(),4096)\n"
        "os.unlink(p); print('ready',flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        (d / "link_remap.3").write_bytes(b"old")  # another dump's, left there
        dirs = remaps.dirs_of(Here(), [child.pid], python=sys.executable)
        before = remaps.present(Here(), dirs, python=sys.executable)
        assert str(d) in dirs and before == {str(d / "link_remap.3")}
        (d / "link_remap.11").write_bytes(b"\1" * 32)  # as CRIU's dump makes it
        os.chmod(d / "link_remap.11", 0o600)
        snap = tmp_path / "snap"
        snap.mkdir()
        entries = remaps.keep(Here(), snap, dirs, before, python=sys.executable)
    finally:
        child.kill()
        child.wait()
    assert entries == [{"path": str(d / "link_remap.11"), "file": "remaps/0-link_remap.11"}]
    assert not (d / "link_remap.11").exists() and (d / "link_remap.3").exists()  # moved; another's left alone
    kept = snap / "remaps" / "0-link_remap.11"
    assert kept.read_bytes() == b"\1" * 32 and (kept.stat().st_mode & 0o777) == 0o600
    # each restore puts it back with its mode; a failed one removes what it placed
    placed = remaps.put_back(Here(), snap, remaps.checked(snap, {"link_remaps": entries}))
    assert placed == [str(d / "link_remap.11")] and (d / "link_remap.11").read_bytes() == b"\1" * 32
    assert (d / "link_remap.11").stat().st_mode & 0o777 == 0o600
    remaps.remove(Here(), placed)
    assert not (d / "link_remap.11").exists() and kept.exists()


def test_a_remap_whose_directory_is_missing_where_it_is_restored_says_so_and_places_nothing(tmp_path):
    snap = snapshot(tmp_path, [])
    first = {"path": str(tmp_path / "here" / "link_remap.1"), "file": "remaps/0-link_remap.7"}
    (tmp_path / "here").mkdir()
    gone = {"path": str(tmp_path / "gone" / "link_remap.2"), "file": "remaps/0-link_remap.7"}
    with pytest.raises(Exception, match="must exist"):
        remaps.put_back(Here(), snap, [first, gone])
    assert not (tmp_path / "here" / "link_remap.1").exists()  # the one placed before is removed again


# another process holding the lock of a directory, as a second `builder snapshot restore` on the host would
HOLDER = ("import sys,time\n"
          "from builder.deploy.snapshot import remaps\n"
          "class P:\n local = True\n"
          "with remaps.held(P(), [sys.argv[1]]):\n"
          " print('held', flush=True); time.sleep(float(sys.argv[2]))\n"
          " open(sys.argv[3], 'w').write(str(time.time()))\n")


def holder(d: Path, seconds: float, done: Path) -> subprocess.Popen:
    from tests.helpers import REPO

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(d), str(seconds), str(done)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_two_restores_on_one_host_take_the_remaps_directory_one_after_the_other(tmp_path):
    """Two snapshots of the same engine have remaps of the same name (vLLM's was link_remap.428 on every H100): a
    restore (or a take's dump) holds the directory from putting its remaps back until CRIU has consumed them, so
    the other waits, says so once, and goes on only when the first has let go."""
    d = tmp_path / "shm"
    d.mkdir()
    done = tmp_path / "first-done"
    first = holder(d, 1.0, done)
    said = []
    try:
        with remaps.held(Here(), [str(d), str(tmp_path / "absent")], said.append):
            import time

            entered = time.time()
            assert done.exists() and float(done.read_text()) <= entered  # only after the first let go
    finally:
        first.wait(timeout=30)
    assert len(said) == 1 and f"CRIU's link remaps in {d}" in said[0] and (d / remaps.LOCK).is_file()
    # a holder that does not let go: refused after the wait, naming the lock, nothing held
    stuck = holder(d, 30, tmp_path / "never")
    try:
        with pytest.raises(Exception, match="another snapshot take or restore on this host has held"):
            with remaps.held(Here(), [str(d)], wait_s=0.5):
                pytest.fail("entered while another held it")
    finally:
        stuck.kill()
        stuck.wait()
    with remaps.held(Here(), [str(d)], wait_s=0.5):  # its lock died with it
        pass


def test_a_container_holds_nothing_on_the_host(tmp_path):
    class InAContainer(Here):
        local = False

    d = tmp_path / "shm"
    d.mkdir()
    with remaps.held(InAContainer(), [str(d)]):
        pass
    assert not (d / remaps.LOCK).exists()  # its /dev/shm is its own: no lock file, no wait


def test_a_restore_waits_until_criu_has_consumed_its_remaps_and_removes_what_it_did_not(tmp_path):
    import threading

    gone, stays = tmp_path / "link_remap.1", tmp_path / "link_remap.2"
    gone.write_bytes(b"x")
    stays.write_bytes(b"y")
    threading.Timer(0.3, gone.unlink).start()  # CRIU removing the one it linked back, a moment after
    assert remaps.wait_consumed(Here(), [str(gone), str(stays)], timeout=1.0) == [str(stays)]
    assert not gone.exists()
    assert remaps.wait_consumed(Here(), [], timeout=1.0) == []
