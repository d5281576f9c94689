"""A restore in a container must not hold an id the restored tree needs back (CRIU restores every process and
thread with its id): the container's pids are used up past the tree's highest id first (place.PAST_PY, since
/proc/sys/kernel/ns_last_pid is read-only in a container), and take records that id while the tree runs
(criu.MAX_TID_PY, threads included). Both run here against real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from builder.deploy.snapshot import criu, place


def test_pids_are_used_up_until_the_next_is_past_the_given_id():
    start = subprocess.run([sys.executable, "-c", "import os;print(os.getpid())"], capture_output=True,
                           text=True).stdout.strip()
    target = int(start) + 200
    done = subprocess.run([sys.executable, "-c", place.PAST_PY, str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = int(subprocess.run([sys.executable, "-c", "import os;print(os.getpid())"], capture_output=True,
                               text=True).stdout.strip())
    assert after > target or after < int(start)  # past it (or the pids wrapped, when everything is free again)


class Here:
    where = "on this host"

    def run(self, argv, timeout=600):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr


def test_the_highest_id_of_a_tree_counts_its_threads():
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{os.getpid()}/task")]
        assert criu.max_tid(Here(), [os.getpid()], python=sys.executable) == max(tids) > os.getpid()
    finally:
        stop.set()
        for w in workers:
            w.join()
