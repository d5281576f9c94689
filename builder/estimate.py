"""Compile-time estimates from earlier builds: every cached wheel's manifest records how long its compile
took, how many objects it compiled and with what parallelism on which host. An estimate takes the most
recent earlier build of the same package version and scales it by the compile threads (more threads,
less time) and by the number of SASS archs (each arch is compiled again).

The object cache (sccache, builder/compile_cache.py) enters twice. An earlier compile that hit part of its
objects took less than a cold one: its time is brought back to cold (each hit costed at that compile's mean
compiler time per miss). And when the earlier compile had the same inputs but for the archs (same sources,
torch, CUDA, flags: its key inputs say so), the steps of the archs both share are expected to hit — nvcc's
cicc/ptxas steps are per arch — so only the new archs' share is counted. That is a prediction: the object cache
must still hold them (a local cache mount can be pruned; a shared backend expires entries).

sccache-dist enters as threads: a compile whose nvcc steps are spread over the build servers ([defaults.cache]
dist, dist_cores: their cores together) runs on the local threads plus those cores, and an earlier compile that
was spread is counted with the cores it had. Also a prediction: preprocessing, linking and the steps a busy
scheduler hands back run locally (measured on loopback: 66 of 96 steps on the servers)."""

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


# key inputs that follow the arch list (knobs spell it; the gencode filter's config holds it) or do not reach a
# compile command (the templates' text)
_ARCH_INPUTS = {"built_archs", "knobs", "gencode_filter", "templates", "format"}


def _cold_seconds(c: dict) -> float:
    """The earlier compile's time as if nothing had hit."""
    s = c.get("sccache") if isinstance(c.get("sccache"), dict) else None
    if not s or not s.get("hits") or not s.get("misses"):
        return float(c["seconds"])
    return float(c["seconds"]) + s["hits"] * float(s.get("compiler_seconds") or 0) / s["misses"]


def estimate(wheelhouse: Wheelhouse, package: str, version: str, n_archs: int, now_threads: int,
             archs: tuple[int, ...] = (), inputs: dict | None = None, dist_cores: int = 0) -> Estimate | None:
    """From the most recent earlier compile of package==version in the wheelhouse, or None. `archs` and
    `inputs` (this compile's built archs and key inputs) let it count the object cache's expected hits;
    `dist_cores`, the sccache-dist build servers' cores this compile spreads over."""
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
            best = (at, c, meta.get("key_inputs") if isinstance(meta.get("key_inputs"), dict) else {})
    if best is None:
        return None
    _, c, then_inputs = best
    then_archs = max(1, int(c.get("archs", n_archs) or n_archs))
    cold = _cold_seconds(c)
    then_dist = int(c.get("dist_cores") or 0) if c.get("compile_dist") else 0
    then_threads, now_all = c["threads"] + then_dist, max(1, now_threads) + max(0, dist_cores)
    scale = (then_threads / now_all) * (n_archs / then_archs)
    why = (f"{package} {version} took {duration(c['seconds'])}"
           + (f" ({duration(cold)} cold: {c['sccache']['hits']} object cache hits)" if cold != c["seconds"] else "")
           + f" with {c['threads']} nvcc threads" + (f" and {then_dist} sccache-dist server cores" if then_dist else "")
           + f" for {then_archs} arch(s) on {c.get('cores', '?')} cores; scaled to {now_threads} threads"
           + (f" and {dist_cores} server cores (sccache-dist; a prediction: preprocessing, links and the steps a busy "
              "scheduler hands back stay local)" if dist_cores else "")
           + f", {n_archs} arch(s)")
    seconds = cold * scale
    shared = sorted(set(archs) & set(then_inputs.get("built_archs") or ())) if archs and inputs else []
    same_commands = bool(inputs) and all(inputs.get(k) == then_inputs.get(k)
                                         for k in set(inputs) | set(then_inputs) if k not in _ARCH_INPUTS)
    if shared and same_commands:
        seconds *= 1 - len(shared) / n_archs
        why += (f"; expects object cache hits for {', '.join(f'sm_{a}' for a in shared)} (compiled before with the "
                f"same inputs), so counts {n_archs - len(shared)} of {n_archs} arch(s)")
    return Estimate(seconds, int(c.get("objects", 0) * n_archs / then_archs), why)
