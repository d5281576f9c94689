"""The CUDA processes of a tree and their GPU state: checkpointed (locked, GPU memory copied to host) before CRIU
dumps the tree, restored and unlocked after CRIU restores it. CRIU cannot dump a process's GPU memory; the CUDA
driver's checkpoint API (cuCheckpointProcess*, libcuda of driver >= 550) moves it to host memory first, where the
dump takes it. The tool: NVIDIA's cuda-checkpoint where it is on PATH, else builder's cuda_checkpoint.c built with
the toolkit's cuda.h (libcuda opened at run time), which takes NVIDIA's command line. A process with an NVIDIA device
mapping that runs no CUDA context (vLLM's API server) is one the driver API does not know; CRIU's CUDA plugin
(cuda_plugin.so, CRIU >= 4) handles its mapping, and drives `cuda-checkpoint` from PATH: builder's tool serves it
too (its directory first on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ...errors import Failed, UserError

SOURCE = Path(__file__).with_name("cuda_checkpoint.c")
MAPS_PY = ("import sys\n"
           "for p in sys.argv[1:]:\n"
           " try: m=open(f'/proc/{p}/maps').read()\n"
           " except OSError: continue\n"
           " if '/dev/nvidia' in m: print(p)\n")


def cuda_pids(place, pids: list[int], python: str = "python3") -> list[int]:
    """The pids of the tree that map an NVIDIA device (/dev/nvidia*): those the GPU checkpoint is for."""
    rc, out = place.run([python, "-c", MAPS_PY, *map(str, pids)], timeout=30)
    if rc != 0:
        raise UserError(f"cannot read the memory maps of {pids} {place.where}: {out.strip()[-200:]}")
    return [int(p) for p in out.split()]


def tool(place, build_dir: Path | None = None) -> list[str]:
    """The checkpoint tool's argv prefix in `place`: ["cuda-checkpoint"] (NVIDIA's), or builder's tool built here
    (process route) with CUDA_HOME's cuda.h; refused in one line when neither can be had."""
    rc, _ = place.run(["sh", "-c", "command -v cuda-checkpoint"], timeout=30)
    if rc == 0:
        return ["cuda-checkpoint"]
    if build_dir is None or not place.local:
        raise UserError(f"the tree has CUDA processes, and no cuda-checkpoint is on PATH {place.where}: put NVIDIA's "
                        "cuda-checkpoint there (the image or the host)")
    return [str(build(build_dir))]


def build(build_dir: Path) -> Path:
    """builder's cuda-checkpoint, compiled with the toolkit's cuda.h (the types; libcuda is opened at run time)."""
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    header = Path(home) / "include" / "cuda.h"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not header.is_file() or cc is None:
        raise UserError(f"cannot build the CUDA checkpoint tool: {'no C compiler' if cc is None else f'no {header}'} "
                        "(set CUDA_HOME to a toolkit, or put NVIDIA's cuda-checkpoint on PATH)")
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / "cuda-checkpoint"  # the name CRIU's CUDA plugin runs from PATH
    if out.is_file() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out  # built by the take (a restore's seconds are not spent compiling it again)
    argv = [cc, "-O2", "-o", str(out), str(SOURCE), f"-I{header.parent}", "-ldl"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"building {SOURCE.name} failed: {(proc.stdout + proc.stderr).strip()[-300:]}")
    return out


# the driver state each action starts from, and the one it leaves (NVIDIA's --toggle: running -> checkpointed, and
# back)
STATES = {"checkpoint": ("running", "checkpointed"), "restore": ("checkpointed", "running")}


def state(place, argv0: list[str], pid: int) -> str | None:
    """The driver's word for pid (running, locked, checkpointed, failed); None when the driver knows no CUDA
    context there (a process that maps an NVIDIA device for NVML, or a fork that never initialised CUDA)."""
    rc, out = place.run([*argv0, "--get-state", "--pid", str(pid)], timeout=60)
    words = out.strip().split()
    return words[-1] if rc == 0 and words else None


def act(place, argv0: list[str], action: str, pids: list[int]) -> dict[str, list[int]]:
    """checkpoint (lock + copy out) or restore (copy back + unlock) each pid whose driver state calls for it:
    `--toggle`, which both tools take. A pid already in the action's end state is left alone (CRIU's CUDA plugin,
    where it is loaded, restores and unlocks each process itself), one the driver does not know is skipped (its
    device mapping is CRIU's), and one in any other state (locked, failed) fails the step, named."""
    start, end = STATES[action]
    done: dict[str, list[int]] = {"toggled": [], "already": [], "no_context": []}
    for pid in pids:
        now = state(place, argv0, pid)
        if now is None or now == end:
            done["no_context" if now is None else "already"].append(pid)
            continue
        if now != start:
            raise Failed(f"GPU {action} of pid {pid}: the driver says it is {now}, not {start}")
        rc, out = place.run([*argv0, "--toggle", "--pid", str(pid)], timeout=600)
        if rc != 0:
            raise Failed(f"GPU {action} of pid {pid} failed: {out.strip()[-300:]}")
        done["toggled"].append(pid)
    return done
