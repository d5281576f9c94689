"""Who owns what builder leaves in the daemon while it runs, so that a run killed outright (SIGKILL, an OOM kill, a
lost session: no handler runs) is cleaned up by the next run.

Every child builder starts dies with it: `die_with_parent` is the children's preexec hook (Linux's
PR_SET_PDEATHSIG), so the kernel sends SIGTERM to the docker / buildx / skopeo CLI, or to an engine started as a
process, when builder's process ends, however it ends. A docker CLI that dies ends its BuildKit session, and the
daemon cancels the solve.

What lives in the daemon (an image's per-run name `<tag>-run-…`, a smoke container) carries its owner: builder's
pid on this boot (`<pid>@<boot id>`; a container's label is image/labels.py OWNER). A later run removes what an
owner that is no longer alive left; what a live run owns (another build of the same cell, right now) is never
touched.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal

PR_SET_PDEATHSIG = 1


try:  # resolved once here: the hook runs between fork and exec, where loading a library is not safe
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the process group and the stop handlers still apply
    _prctl = None


def die_with_parent() -> None:
    """preexec_fn of every child: SIGTERM when the process that started it ends (PR_SET_PDEATHSIG)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")[:12]
    except OSError:
        return "noboot"


def owner() -> str:
    """This process as an owner: its pid on this boot."""
    return f"{os.getpid()}@{boot_id()}"


def alive(spec: str) -> bool:
    """Whether the owner `spec` (`pid@boot`) may still be running: True for anything that cannot be read as a dead
    owner (another boot's pid is dead; a malformed spec is kept, never removed on a guess)."""
    m = re.fullmatch(r"([0-9]+)@([0-9a-z]+)", spec or "")
    if m is None:
        return True
    if m.group(2) != boot_id():
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def run_suffix(random_hex: str) -> str:
    """The per-run part of an image's run name: `run-<random>-p<pid>b<boot>`, a tag's characters only."""
    return f"run-{random_hex}-p{os.getpid()}b{boot_id()}"


def run_suffix_owner(tag: str) -> str | None:
    """The owner a run name's tag records (`…-run-<hex>-p<pid>b<boot>`), None for a tag that is no run name of
    this form (an older run name records none: it is left alone)."""
    m = re.search(r"-run-[0-9a-f]+-p([0-9]+)b([0-9a-z]+)$", tag)
    return f"{m.group(1)}@{m.group(2)}" if m else None
