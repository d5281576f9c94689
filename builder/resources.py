"""How many compile jobs this host can run without the kernel OOM-killing nvcc.

The rule (printed by `builder build` for every package):
  threads = min(cores, floor(0.9 × free RAM / GB per nvcc thread of the package))
  NVCC_THREADS = 2 when threads >= 4, else 1
  MAX_JOBS = threads                   for packages whose build divides MAX_JOBS by NVCC_THREADS (vLLM)
  MAX_JOBS = threads // NVCC_THREADS   for packages that run MAX_JOBS nvcc processes of NVCC_THREADS each
A host that cannot give one thread its GB is refused (exit 2) unless --max-jobs/--nvcc-threads force it.
Free RAM is MemAvailable from /proc/meminfo, else the free pages sysconf reports; a host where neither can
be read is never guessed at: it needs --max-jobs/--nvcc-threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .engines import Recipe
from .errors import EnvironmentProblem, UserError

RAM_HEADROOM = 0.9  # leave 10 % for the rest of the build (linker, pip, BuildKit)
MEMINFO = Path("/proc/meminfo")  # MemAvailable: what the kernel can give without swapping
# Fallback where MemAvailable cannot be read: free pages (MemFree; lower than MemAvailable, never higher).
AVPHYS_PAGES = "SC_AVPHYS_PAGES"
PAGE_SIZE = "SC_PAGE_SIZE"


def _free_gb(meminfo: Path) -> float | None:
    """GB the host can give a build: MemAvailable from meminfo, else free pages from sysconf, else None."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024 / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        free_bytes = os.sysconf(AVPHYS_PAGES) * os.sysconf(PAGE_SIZE)
    except (ValueError, OSError, AttributeError):
        return None
    return free_bytes / 1024**3 if free_bytes > 0 else None


@dataclass(frozen=True)
class Host:
    cores: int
    free_gb: float | None  # None: could not be determined; choose() then needs --max-jobs/--nvcc-threads

    @classmethod
    def detect(cls, meminfo: Path | str = MEMINFO) -> "Host":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        free_gb = _free_gb(Path(meminfo))
        return cls(cores=cores, free_gb=None if free_gb is None else round(free_gb, 1))


@dataclass(frozen=True)
class Parallelism:
    max_jobs: int
    nvcc_threads: int
    why: str


def choose(recipe: Recipe, host: Host, max_jobs: int | None = None, nvcc_threads: int | None = None) -> Parallelism:
    per_thread = recipe.mem_gb_per_nvcc_thread
    divides = recipe.parallelism == "total-threads"
    if max_jobs is not None or nvcc_threads is not None:
        threads = nvcc_threads or 1
        jobs = max_jobs or (host.cores if divides else max(1, host.cores // threads))
        total = jobs if divides else jobs * threads
        need = total * per_thread
        if host.free_gb is None:
            warn = f"; ~{need:.0f} GB at peak, free memory unknown" if need > 0 else ""
        else:
            warn = f"; WARNING: ~{need:.0f} GB at peak, {host.free_gb} GB free" if need > host.free_gb * RAM_HEADROOM else ""
        return Parallelism(jobs, threads, f"MAX_JOBS={jobs} NVCC_THREADS={threads} (given){warn}")
    if per_thread <= 0:  # nothing for nvcc to compile
        return Parallelism(host.cores, 1, f"MAX_JOBS={host.cores} NVCC_THREADS=1 ({host.cores} cores; no device code)")
    if host.free_gb is None:
        raise EnvironmentProblem(
            f"could not determine this host's free memory (no MemAvailable in {MEMINFO}, no sysconf "
            f"{AVPHYS_PAGES}) to size the {recipe.name} {recipe.version} compile: pass --max-jobs and --nvcc-threads"
        )
    by_ram = int(host.free_gb * RAM_HEADROOM // per_thread)
    if by_ram < 1:
        raise UserError(
            f"{recipe.name} {recipe.version} needs ~{per_thread:g} GB per nvcc thread and this host has "
            f"{host.free_gb} GB free: free memory, build elsewhere, or force it with --max-jobs 1 --nvcc-threads 1"
        )
    threads_total = max(1, min(host.cores, by_ram))
    threads = 2 if threads_total >= 4 else 1
    jobs = threads_total if divides else max(1, threads_total // threads)
    why = (
        f"MAX_JOBS={jobs} NVCC_THREADS={threads} ({host.cores} cores, {host.free_gb} GB free, "
        f"{per_thread:g} GB per nvcc thread → {by_ram} threads by RAM, {threads_total} used)"
    )
    return Parallelism(jobs, threads, why)
