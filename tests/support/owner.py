"""What the two halves of test_owner.py share: tests/unit/builds/test_owner.py (its tests that need no Docker) and
tests/docker/builds/test_owner.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import os


def unused_pid() -> int:
    """A pid no process has now."""
    pid = int(open("/proc/sys/kernel/pid_max").read()) - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid
