"""Runs one command, sampling the resident memory of every other process of its container (its PID namespace).

    python3 measure.py COMMAND CWD LOG

COMMAND runs under `sh -c` in CWD, its output to LOG; one JSON line on stdout: returncode, seconds, the peak of the
sampled memory, the cgroup's own peak and OOM kills where the kernel gives them, the children's max RSS."""

import json
import os
import resource
import subprocess
import sys
import time

cmd, cwd, log = sys.argv[1], sys.argv[2], sys.argv[3]
page = os.sysconf("SC_PAGE_SIZE")
me = os.getpid()


def resident():
    # anonymous resident memory (statm resident - shared): what cicc and ptxas allocate, without the libraries and
    # toolkit files every process maps (counted once per process by RSS); cheap enough for 20 samples a second
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in (me, 1):
            continue
        try:
            with open(f"/proc/{pid}/statm") as f:
                fields = f.read().split()
            total += (int(fields[1]) - int(fields[2])) * page
        except (OSError, ValueError, IndexError):
            pass
    return total


def cgroup(names):
    for name in names:
        try:
            with open(name) as f:
                return f.read()
        except OSError:
            pass
    return ""


base = resident()
start = time.monotonic()
with open(log, "wb") as out:
    p = subprocess.Popen(["sh", "-c", cmd], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    peak = 0
    while p.poll() is None:
        peak = max(peak, resident() - base)
        time.sleep(0.05)
seconds = time.monotonic() - start
events = cgroup(["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"])
oom = sum(int(l.split()[1]) for l in events.splitlines() if l.startswith("oom_kill "))
cg_peak = cgroup(["/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"]).strip()
print(json.dumps({"returncode": p.returncode, "seconds": round(seconds, 2), "peak_bytes": peak,
                  "cgroup_peak_bytes": int(cg_peak) if cg_peak.isdigit() else None, "oom_kills": oom,
                  "children_maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
