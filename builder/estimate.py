"""Compile-time estimates from earlier builds: every cached wheel's manifest records how long its compile
took, how many objects it compiled and with what parallelism on which host. An estimate takes the most
recent earlier build of the same package version and scales it by the compile threads (more threads,
less time) and by the number of SASS archs (each arch is compiled again)."""

from __future__ import annotations

from dataclasses import dataclass

from .cache.local import Wheelhouse
from .progress import duration


@dataclass(frozen=True)
class Estimate:
    seconds: float
    objects: int
    why: str

    def to_json(self) -> dict:
        return {"seconds": round(self.seconds, 1), "objects": self.objects, "from": self.why}


def threads(max_jobs: int, nvcc_threads: int, divides: bool) -> int:
    """nvcc threads at work: MAX_JOBS counts threads for packages that divide it themselves (vLLM)."""
    return max(1, max_jobs if divides else max_jobs * nvcc_threads)


def estimate(wheelhouse: Wheelhouse, package: str, version: str, n_archs: int, now_threads: int) -> Estimate | None:
    """From the most recent earlier compile of package==version in the wheelhouse, or None."""
    best = None
    for pkg, key in wheelhouse.entries():
        if pkg != package:
            continue
        meta = wheelhouse.read_manifest(pkg, key)
        if not isinstance(meta, dict) or meta.get("version") != version:
            continue
        c = meta.get("compile")
        if not isinstance(c, dict) or not isinstance(c.get("seconds"), (int, float)) or not c.get("threads"):
            continue
        at = (meta.get("built_by") or {}).get("at", "") if isinstance(meta.get("built_by"), dict) else ""
        if best is None or at > best[0]:
            best = (at, c)
    if best is None:
        return None
    c = best[1]
    then_archs = max(1, int(c.get("archs", n_archs) or n_archs))
    scale = (c["threads"] / max(1, now_threads)) * (n_archs / then_archs)
    why = (f"{package} {version} took {duration(c['seconds'])} with {c['threads']} nvcc threads for {then_archs} "
           f"arch(s) on {c.get('cores', '?')} cores; scaled to {now_threads} threads, {n_archs} arch(s)")
    return Estimate(c["seconds"] * scale, int(c.get("objects", 0) * n_archs / then_archs), why)
