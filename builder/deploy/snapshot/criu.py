"""CRIU where the engine runs: found, judged (>= 4), and the lines that dump a tree and restore it.

Why >= 4: CRIU 3.17 (bookworm) fails `criu check` on kernel 6.x ("vdso: Failed to fill self vdso symtable"), and
CRIU 4 has the CUDA plugin for processes holding an NVIDIA device mapping. On Linux >= 6.16 a TCP socket is dumped
only by CRIU 4.2, or 4.1.1 with that release's socket-option change (tests/fixtures/snapshot): 4.1.1 as released
stops at "sockets: Can't get 1:34 opt: Operation not supported" (SO_PASSSEC, refused on AF_INET since 6.16)."""

from __future__ import annotations

import re

from ...errors import UserError

MIN_MAJOR = 4
# --tcp-established: the engine's listening socket and the connections inside its tree (torch's TCPStore, gloo);
# --file-locks: the lock files its caches hold; --link-remap: a file deleted while open and mapped (Python's
# multiprocessing semaphores under /dev/shm: "Can't create link remap for /dev/shm/sem.… Use link-remap option",
# vLLM 0.26.0's EngineCore on the H100); --network-lock skip: CRIU locks established connections with iptables or
# nft, which a GPU host need not have ("iptables: not found" there), and every connection of the tree is inside it,
# frozen at both ends. All measured on the H100 (issue 52, tests/fixtures/gpu-host/h100-2026-12-05-snapshot).
FLAGS = ("--tcp-established", "--file-locks", "--link-remap", "--network-lock", "skip")


def version(place, criu: str = "criu") -> str:
    """CRIU's version in `place`, refused in one line when it is missing or older than 4."""
    rc, out = place.run([criu, "--version"], timeout=30)
    found = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", out)
    if rc == 127 or (rc != 0 and not found) or "not found" in out and not found:
        raise UserError(f"{criu}: not found {place.where}; a snapshot needs CRIU >= {MIN_MAJOR} (Debian trixie's "
                        "package, or the image's own)")
    if not found:
        raise UserError(f"{criu} --version {place.where} says no version ({out.strip()[:80]!r}); a snapshot needs "
                        f"CRIU >= {MIN_MAJOR}")
    major = int(found.group(1))
    text = ".".join(g for g in found.groups() if g is not None)
    if major < MIN_MAJOR:
        raise UserError(f"{criu} {text} {place.where}: too old, a snapshot needs CRIU >= {MIN_MAJOR} (3.x fails `criu "
                        "check` on kernel 6.x: 'vdso: Failed to fill self vdso symtable'; Debian trixie has 4.1.1)")
    return text


def dump_argv(criu: str, pid: int, images: str, log: str = "dump.log") -> list[str]:
    """Dump the tree of `pid` into `images`; the tree ends (CRIU kills it once dumped)."""
    return [criu, "dump", "--tree", str(pid), "--images-dir", images, *FLAGS, "-v2", "-o", log]


def restore_argv(criu: str, images: str, pidfile: str, log: str = "restore.log") -> list[str]:
    """Restore the tree detached (its root's pid written to pidfile): the caller's PID namespace must be a fresh one."""
    return [criu, "restore", "--images-dir", images, *FLAGS, "--restore-detached", "--pidfile", pidfile, "-v2",
            "-o", log]


# the tree of a pid, read from /proc where it runs: a Python one-liner (every engine image has a Python)
TREE_PY = ("import os,sys\n"
           "kids={}\n"
           "for p in os.listdir('/proc'):\n"
           " if p.isdigit():\n"
           "  try: pp=int(open(f'/proc/{p}/stat').read().rsplit(')',1)[1].split()[1])\n"
           "  except OSError: continue\n"
           "  kids.setdefault(pp,[]).append(int(p))\n"
           "out,todo=[],[int(sys.argv[1])]\n"
           "while todo:\n"
           " p=todo.pop(); out.append(p); todo+=kids.get(p,[])\n"
           "print(' '.join(map(str,sorted(out))))\n")


def tree(place, pid: int, python: str = "python3") -> list[int]:
    rc, out = place.run([python, "-c", TREE_PY, str(pid)], timeout=30)
    if rc != 0:
        raise UserError(f"cannot read the process tree of {pid} {place.where}: {out.strip()[-200:]}")
    return [int(p) for p in out.split()]


MAX_TID_PY = ("import os,sys\n"
              "ids=[int(p) for p in sys.argv[1:]]\n"
              "for p in sys.argv[1:]:\n"
              " try: ids+=[int(t) for t in os.listdir(f'/proc/{p}/task')]\n"
              " except OSError: pass\n"
              "print(max(ids))\n")


def max_tid(place, pids: list[int], python: str = "python3") -> int:
    """The highest process or thread id of the tree (CRIU restores each with its id: a restore must not hold one)."""
    rc, out = place.run([python, "-c", MAX_TID_PY, *map(str, pids)], timeout=30)
    return int(out.strip()) if rc == 0 and out.strip().isdigit() else max(pids)


def name(place, pid: int) -> str:
    """The process's name (/proc/PID/comm) where it runs, for what take says of the tree."""
    rc, out = place.run(["cat", f"/proc/{pid}/comm"], timeout=30)
    return out.strip() if rc == 0 else "?"
