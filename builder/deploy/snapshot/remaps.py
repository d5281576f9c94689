"""CRIU's link remaps, kept in the snapshot so that it restores more than once and anywhere.

A file that is still open or mapped but whose name was removed while another name keeps it (glibc's named
semaphores: made under a temporary name in /dev/shm, linked to the real one, the temporary name unlinked; Python's
multiprocessing makes one in every vLLM and SGLang process tree) is dumped with `--link-remap`: CRIU links it as
`link_remap.N` in the same directory, and the restore links that name back and removes it. So the remap lives
outside the snapshot, on the tmpfs where the engine ran: a restore in a fresh container (whose /dev/shm is empty),
on another host, or a second restore on the same host failed with "Can't link dev/shm/link_remap.428 ->
dev/shm/sem.7ug0SC: No such file or directory" (vLLM 0.26.0 on an H100; the stand-in holds such a semaphore too).
take copies each remap CRIU made into `remaps/` and removes it where it was; every restore puts the copies back
first; CRIU consumes them.

On a host (the process route) the directory is shared: two restores at once of snapshots whose remaps have the same
name (CRIU numbers them by the file's id in the dump, so takes of the same engine do: vLLM's was link_remap.428 on
every H100), or a restore beside a take, would put a remap where the other's CRIU expects its own or removes it.
`held` serializes that window per directory with a lock file there, from putting the remaps back until CRIU has
consumed them (a restore) or from listing them until they are kept (a take). A container has /dev/shm of its own."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import time
from pathlib import Path, PurePosixPath

from ...errors import Failed, UserError

REMAPS = "remaps"
NAME = re.compile(r"link_remap\.\d+")
LOCK = ".builder-link-remaps.lock"  # in each directory whose remaps a take or restore on this host handles
WAIT_S = 300  # for another take's or restore's window (seconds: a dump of a sleeping engine, a restore)
CONSUMED_S = 10  # for CRIU to remove the remaps it linked back, once the restored tree runs

# the directories of the tree's files that are open or mapped under a removed name, read from /proc where it runs
DELETED_DIRS_PY = ("import os,sys\n"
                   "dirs=set()\n"
                   "def add(t):\n"
                   " if t.endswith(' (deleted)') and t.startswith('/'): dirs.add(os.path.dirname(t[:-10]))\n"
                   "for p in sys.argv[1:]:\n"
                   " try: lines=open(f'/proc/{p}/maps').read().splitlines()\n"
                   " except OSError: lines=[]\n"
                   " for l in lines:\n"
                   "  f=l.split(None,5)\n"
                   "  if len(f)==6: add(f[5])\n"
                   " try: fds=os.listdir(f'/proc/{p}/fd')\n"
                   " except OSError: fds=[]\n"
                   " for fd in fds:\n"
                   "  try: add(os.readlink(f'/proc/{p}/fd/{fd}'))\n"
                   "  except OSError: pass\n"
                   "print('\\n'.join(sorted(dirs)))\n")
LIST_PY = ("import os,re,sys\n"
           "for d in sys.argv[1:]:\n"
           " try: names=os.listdir(d)\n"
           " except OSError: continue\n"
           " for n in sorted(names):\n"
           "  if re.fullmatch(r'link_remap\\.\\d+',n): print(os.path.join(d,n))\n")


def _lines(place, code: str, args: list[str], python: str) -> list[str]:
    rc, out = place.run([python, "-c", code, *args], timeout=60)
    if rc != 0:
        raise Failed(f"cannot read the engine's files {place.where}: {out.strip()[-200:]}")
    return [line for line in out.splitlines() if line.startswith("/")]


def dirs_of(place, pids: list[int], python: str = "python3") -> list[str]:
    """While the tree runs: the directories where CRIU may make a remap."""
    return _lines(place, DELETED_DIRS_PY, [str(p) for p in pids], python)


def present(place, dirs: list[str], python: str = "python3") -> set[str]:
    """The remaps in `dirs` now (before a dump: not this snapshot's)."""
    return set(_lines(place, LIST_PY, dirs, python)) if dirs else set()


@contextlib.contextmanager
def held(place, dirs, say=lambda text: None, wait_s: float = WAIT_S):
    """This host's lock on CRIU's remaps in `dirs` (a lock file in each, taken in one order), for a take's dump or a
    restore. Nothing to hold in a container (its /dev/shm is its own) or where a directory does not exist (the
    caller refuses that). Waits for another holder up to wait_s, saying so once, then refuses naming the file."""
    if not getattr(place, "local", False):
        yield
        return
    fds: list[int] = []
    try:
        for d in sorted({str(x) for x in dirs if os.path.isdir(x)}):
            lock = os.path.join(d, LOCK)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise Failed(f"cannot lock CRIU's link remaps in {d} ({lock}): {exc.strerror}") from None
            fds.append(fd)
            deadline, waiting = time.monotonic() + wait_s, False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise Failed(f"another snapshot take or restore on this host has held CRIU's link remaps in "
                                     f"{d} for {wait_s:g} s ({lock}); try again when it ends") from None
                    if not waiting:
                        say(f"waiting for another snapshot take or restore on this host (CRIU's link remaps in {d})")
                        waiting = True
                    time.sleep(0.1)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the lock


def wait_consumed(place, paths: list[str], timeout: float = CONSUMED_S) -> list[str]:
    """After a restore: until CRIU has removed the remaps it linked back (the restored tree may run before it
    does); those still there at the timeout (a remap CRIU did not need) are returned, for `remove`."""
    deadline = time.monotonic() + timeout
    left = list(paths)
    while left:
        rc, out = place.run(["sh", "-c", " ".join(f"test -e {shlex.quote(p)} && echo {shlex.quote(p)};"
                                                  for p in left) + " true"], timeout=30)
        left = [p for p in out.splitlines() if p in left] if rc == 0 else []
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return left


def keep(place, directory: Path, dirs: list[str], before: set[str], python: str = "python3") -> list[dict]:
    """After the dump: each remap it made copied into the snapshot (mode and times kept) and removed where it was;
    the record's entries."""
    made = [p for p in _lines(place, LIST_PY, dirs, python) if p not in before] if dirs else []
    entries = []
    inside = place.inside(directory)
    for i, path in enumerate(made):
        name = f"{REMAPS}/{i}-{PurePosixPath(path).name}"
        rc, out = place.run(["sh", "-c", f"mkdir -p {shlex.quote(inside + '/' + REMAPS)} && "
                                         f"cp -p {shlex.quote(path)} {shlex.quote(inside + '/' + name)} && "
                                         f"rm -f {shlex.quote(path)}"], timeout=60)
        if rc != 0:
            raise Failed(f"cannot keep CRIU's link remap {path} {place.where}: {out.strip()[-200:]}")
        entries.append({"path": path, "file": name})
    return entries


def checked(directory: Path, record: dict) -> list[dict]:
    """The record's remaps, refused unless each is a CRIU remap name at an absolute path and a file of the snapshot
    (a pulled record is not trusted: it must not make a restore write anywhere else)."""
    entries = record.get("link_remaps") or []
    if not isinstance(entries, list):
        raise UserError(f"{directory}: snapshot.json's link_remaps is not a list; take the snapshot again")
    for e in entries:
        path = PurePosixPath(str(e.get("path", ""))) if isinstance(e, dict) else PurePosixPath("")
        file = PurePosixPath(str(e.get("file", ""))) if isinstance(e, dict) else PurePosixPath("")
        if not (path.is_absolute() and ".." not in path.parts and NAME.fullmatch(path.name)
                and len(file.parts) == 2 and file.parts[0] == REMAPS and ".." not in file.parts
                and (directory / file).is_file() and not (directory / file).is_symlink()):
            raise UserError(f"{directory}: snapshot.json names a link remap {e!r} that is not CRIU's link_remap.N "
                            f"at an absolute path with its copy under {REMAPS}/; take the snapshot again")
    return entries


def put_back(place, directory: Path, entries: list[dict]) -> list[str]:
    """Before a restore: each remap (of a record `checked` has passed) at its path again (its directory must exist there: CRIU reopens the engine's
    other files in it too). The paths placed, for `remove` if the restore fails."""
    placed = []
    inside = place.inside(directory)
    for e in entries:
        path = e["path"]
        parent = str(PurePosixPath(path).parent)
        rc, out = place.run(["sh", "-c", f"test -d {shlex.quote(parent)} && "
                                         f"cp -p {shlex.quote(inside + '/' + e['file'])} {shlex.quote(path)}"],
                            timeout=60)
        if rc != 0:
            remove(place, placed)
            raise Failed(f"cannot put CRIU's link remap back at {path} {place.where} (its directory {parent} must "
                         f"exist, as when the engine ran): {out.strip()[-200:] or 'no such directory'}")
        placed.append(path)
    return placed


def remove(place, paths: list[str]) -> None:
    """What put_back placed and CRIU did not consume (a restore that failed)."""
    if paths:
        place.run(["rm", "-f", *paths], timeout=60)
