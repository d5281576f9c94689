"""plan: what each selected cell will build, under which cache key — without calling Docker.

Cache keys are computed here and only here (key_of is called by this module alone: cache_key, route_keys and
wheel_step are how the rest asks, the route step's re-keyed packages included); render writes them into labels,
the runner stores wheels under them. Whether a wheel is already cached is asked of a WheelCache (by default only the local wheelhouse, so
plan needs no network).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from . import archs as archs_mod
from . import deps, gencode_filter, templates
from .cache import CacheHit, WheelCache
from .cache.local import Wheelhouse
from .errors import BuilderError
from .estimate import Estimate, estimate, threads
from .progress import duration
from .resolve import Cell, Package
from .resources import Host, choose

KEY_FORMAT = 1  # bump when the meaning of the key inputs changes


def key_inputs(cell: Cell, pkg: Package) -> dict:
    """Everything that shapes the wheel of `pkg` in `cell`. Parallelism (MAX_JOBS) is not: it changes
    how long the compile takes, not what it produces. A wheel taken from the index is that file, whatever the
    cell: its name and sha256 are the whole key."""
    r = pkg.recipe
    if pkg.from_index:
        return {"format": KEY_FORMAT, "package": pkg.name, "version": pkg.version, "source": pkg.source.ref}
    return {
        "format": KEY_FORMAT,
        "package": pkg.name,
        "version": pkg.version,
        "source": pkg.source.ref,
        # the directory of the source tree it builds (sglang-kernel's moved in 0.4.6); "." leaves older keys as they were
        **({"source_subdir": pkg.source.subdir} if pkg.source.subdir not in ("", ".") else {}),
        "torch": cell.torch,
        "cuda": cell.cuda,
        "python": cell.python,
        "base_devel": cell.base_devel,
        # the archs as the build compiles them: where the engine's CMake filters them itself (engine data cmake_archs;
        # vLLM 0.33.0 with nvcc 13.0 turns 10.3 into 10.0) the knob gets that list, so --arch 100 and 100,103 are one
        # key, and one only when the binaries are the same. The cell's id and tag still name the archs asked for:
        # they say which GPUs the image's audit proved (sm_103 by the sm_100 code), not which SASS it holds
        "knobs": [list(k) for k in pkg.knobs],
        "built_archs": list(pkg.built_archs),
        "build_env": [list(e) for e in r.build_env],
        "nvcc_append_flags": list(pkg.nvcc_flags),
        "build_command": r.build_command,
        "build_requirements": [r.build_requirements, *r.build_requirements_list],
        "build_tools": list(cell.build_tools),
        "templates": templates.digest(templates.package_templates(pkg.source.kind, r.template, r.fetch_plan)),
        "deps": deps.for_package(pkg),
        "patches": r.patches_for(cell.torch),
        "rust_toolchain": r.rust_toolchain,
        # the arch selection of a CMake with hard-coded gencode lists: its configuration and the filter's code
        **({"gencode_filter": [r.gencode_filter(pkg.archs),
                                hashlib.sha256(Path(gencode_filter.__file__).read_bytes()).hexdigest()]}
           if r.arch_select else {}),
    }


def key_of(inputs: dict) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_key(cell: Cell, pkg: Package) -> str:
    return key_of(key_inputs(cell, pkg))


def wheel_step(cell: Cell, pkg: Package, cache: WheelCache | None, estimate: Estimate | None = None) -> WheelStep:
    """The wheel of `pkg` in `cell` under its cache key; with a cache, whether it is already there (no download)."""
    inputs = key_inputs(cell, pkg)
    key = key_of(inputs)
    hit = cache.lookup(pkg.name, key, pkg.cache_archs) if cache is not None else None
    return WheelStep(pkg, key, inputs, hit, looked_up=cache is not None, estimate=estimate)


def route_keys(cell: Cell, pkg: Package) -> dict[str, str]:
    """A `source = "auto"` package's cache key on each route: the published file's, and the compile's."""
    import dataclasses

    r = pkg.route
    out = {"index": cache_key(cell, dataclasses.replace(pkg, source=r.index))} if r.index is not None else {}
    out["build"] = cache_key(cell, dataclasses.replace(pkg, source=r.build))
    return out


@dataclass(frozen=True)
class WheelStep:
    package: Package
    key: str
    inputs: dict = field(compare=False, hash=False)  # what the key hashes (recorded with the cached wheel)
    hit: CacheHit | None = None  # the cache entry that already holds this wheel
    looked_up: bool = True  # False when no cache was asked (render needs keys only)
    estimate: Estimate | None = None  # how long its compile should take, from earlier builds

    @property
    def reuse(self) -> bool:
        return self.hit is not None and self.hit.usable

    @property
    def action(self) -> str:
        if self.reuse:  # a local hit is reused; a remote one is pulled into the wheelhouse first
            return "pull" if self.hit.remote else "reuse"
        if not self.looked_up:
            return "unknown"
        return "fetch" if self.package.from_index else "build"

    @property
    def short_key(self) -> str:
        return self.key[:16]

    def keys_in_use(self, cell: Cell) -> set[str]:
        """Its key, and for a `source = "auto"` package the key of each route (what build may choose)."""
        return {self.key, *(route_keys(cell, self.package).values() if self.package.route is not None else ())}


@dataclass(frozen=True)
class CellPlan:
    cell: Cell
    wheels: tuple[WheelStep, ...]

    @property
    def keys(self) -> dict[str, str]:
        return {w.package.name: w.key for w in self.wheels}

    def to_json(self) -> dict:
        c = self.cell
        return {
            "id": c.id,
            **c.summary(),
            "base_devel": c.base_devel,
            "base_runtime": c.base_runtime,
            "strategies": list(c.strategies),
            "packages": [self._package_json(c, w) for w in self.wheels],
        }

    @staticmethod
    def _package_json(cell: Cell, w: WheelStep) -> dict:
        unpinned = w.package.unpinned()
        return {
            "name": w.package.name,
            "version": w.package.version,
            "source": w.package.source.ref,
            "pinned": not unpinned,
            "unpinned": unpinned,
            "knobs": dict(w.package.knobs),
            "sass": list(w.package.built_sass),
            "cache_key": w.key,
            "action": w.action,
            "estimate": w.estimate.to_json() if w.estimate else None,
            "cached_in": w.hit.store if w.reuse else None,
            "cache_problem": w.hit.problem if w.hit and not w.reuse else None,
            "route": {**w.package.route.to_json(), "keys": route_keys(cell, w.package)} if w.package.route else None,
        }


def compile_estimate(history: Wheelhouse, pkg: Package, host: Host, max_jobs: int | None = None,
                     nvcc_threads: int | None = None, cell: Cell | None = None, dist_cores: int = 0) -> Estimate | None:
    """From earlier compiles of this package version in the wheelhouse, scaled to this host's parallelism (and
    the sccache-dist build servers' cores, when the compile spreads over them)."""
    if not pkg.compiled_here:
        return None
    try:
        par = choose(pkg.recipe, host, max_jobs, nvcc_threads)
    except BuilderError:  # a host that cannot run the compile has no estimate either
        return None
    now = threads(par.max_jobs, par.nvcc_threads, pkg.recipe.parallelism == "total-threads")
    return estimate(history, pkg.name, pkg.version, max(1, len(pkg.built_archs)), now, tuple(pkg.built_archs),
                    key_inputs(cell, pkg) if cell is not None else None, dist_cores)


def plan_cells(cells: list[Cell], cache: WheelCache | None, history: Wheelhouse | None = None,
               host: Host | None = None, max_jobs: int | None = None, nvcc_threads: int | None = None,
               dist_cores: int = 0) -> list[CellPlan]:
    """Each cell's wheels with their keys; with a cache, whether each is already there (no download); with
    a history (the local wheelhouse), how long each compile should take at the parallelism the build will use
    (--max-jobs / --nvcc-threads when given, else the host's rule; plus `dist_cores` of sccache-dist servers)."""
    out = []
    if history is not None and host is None:
        host = Host.detect()
    for cell in cells:
        steps = []
        for pkg in cell.packages:
            guess = (compile_estimate(history, pkg, host, max_jobs, nvcc_threads, cell, dist_cores)
                     if history is not None and host is not None else None)
            steps.append(wheel_step(cell, pkg, cache, guess))
        out.append(CellPlan(cell, tuple(steps)))
    return out


def format_plan(plans: list[CellPlan]) -> str:
    lines = []
    for p in plans:
        c = p.cell
        lines.append(f"{c.id}")
        lines.append(f"  image     {c.ref}")
        lines.append(f"  base      {c.base_devel} → {c.base_runtime}")
        lines.append(f"  torch     {c.torch or '(none)'}   python {c.python}   CUDA {c.cuda}   archs {','.join(map(str, c.archs))}")
        lines.append(f"  strategies {', '.join(c.strategies) or '(none: this stack cannot run MTP2 / MTP7 / DFlash2)'}")
        if c.jit_modules:  # what the engine JIT-builds at its first requests (engine data jit_modules)
            built = [f"{m['name']} {','.join(archs_mod.sm(a) for a in m['archs'])}" for m in c.jit_builds]
            lines.append(f"  jit       {'; '.join(built) or 'none for these archs'}"
                         f" ({'prebuilt into the image' if c.jit_prebuilt else 'at the first request'}); links "
                         + " ".join(f"-l{lib}" for lib in c.jit_links))
            # selected on these archs but built by neither smoke nor a prebuild (a shape-keyed variant, a download)
            for m in c.jit_modules:
                archs = [a for a in c.archs if a in m["archs"]]
                if archs and m["not_built"]:
                    lines.append(f"  jit       {m['name']} {','.join(archs_mod.sm(a) for a in archs)} at the first "
                                 f"request (not built by smoke or a prebuild): {m['not_built']}")
                if archs and m["downloads"]:
                    lines.append(f"  network   {m['name']}: {m['downloads']}")
        for w in p.wheels:
            pkg = w.package
            if pkg.from_index:
                knobs, sass = f"from the index as published ({pkg.source.filename}); the audit decides", "?"
            elif not pkg.recipe.compiled:
                knobs, sass = pkg.recipe.describe_binaries(c.torch, c.cuda, c.python), "-"
            else:
                knobs = " ".join(f"{k}={v!r}" for k, v in pkg.knobs) or "archs fixed by the package"
                sass = ",".join(pkg.built_sass)
            unpinned = pkg.unpinned()
            flag = f"  UNPINNED: {'; '.join(unpinned)}" if unpinned else ""
            if w.hit is not None and not w.reuse:
                flag += f"  (cached entry unusable: {w.hit.problem})"
            if w.reuse and w.hit.remote:
                flag += f"  from {w.hit.location}"
            if not w.reuse and pkg.compiled_here:
                flag += f"  est {duration(w.estimate.seconds)}" if w.estimate else "  est: no earlier build"
            if not w.reuse and (gcc := pkg.gcc_problem()):
                flag += f"  REFUSED: {gcc}"
            lines.append(
                f"  {w.action:<5}  {pkg.name + '==' + pkg.version:<24} key {w.short_key}  "
                f"SASS {sass:<18} {knobs}{flag}"
            )
            if pkg.route is not None:
                keys = route_keys(c, pkg)
                lines.append(f"         source auto → {pkg.route.summary}")
                lines.append("         keys   " + "  ".join(f"{k} {v[:16]}" for k, v in keys.items()))
            if pkg.recipe.compiled and not pkg.from_index:
                lines.append(f"         holds {pkg.recipe.describe_binaries(c.torch, c.cuda, c.python)}")
                lines += [f"         {line}" for line in binary_lines(pkg)]
        lines.append("")
    return "\n".join(lines)


def binary_lines(pkg: Package) -> list[str]:
    """Per binary the SASS this build makes and its kernel×arch units against upstream's build (where the engine
    data knows the release's binaries)."""
    plans = pkg.recipe.binary_plans(pkg.archs, pkg.cuda)
    if not plans:
        return []
    out = []
    for bp in plans:
        name = bp.binary.files.rstrip('*')
        if bp.switched_off:  # its CMake option is passed OFF: not built, not expected by the audit
            scope = pkg.recipe.scope_of(bp.binary)
            out.append(f"{name:<28} not built: {bp.switched_off}=OFF, no requested GPU loads it (only "
                       f"{scope.spelled if scope else '?'})   0 of {bp.default_units:>5} kernel×arch units")
            continue
        sass = ",".join(bp.sass) + (f" + PTX {','.join(bp.ptx)}" if bp.ptx else "")
        if bp.binary.units:
            out.append(f"{name:<28} SASS {sass:<22} {bp.units:>5} of {bp.default_units:>5} kernel×arch units")
        else:  # an engine whose CMake picks each target's archs (cmake_archs): the lists, not the kernels, are known
            out.append(f"{name:<28} SASS {sass}")
    done, upstream = sum(bp.units for bp in plans), sum(bp.default_units for bp in plans)
    if upstream and all(bp.binary.units for bp in plans):
        out.append(f"{'all binaries':<28} {'':<27} {done:>5} of {upstream:>5} ({100 * done / upstream:.0f} % of upstream's build)")
    return out + pkg.recipe.binary_notes(pkg.archs, pkg.cuda)


def default_wheelhouse(matrix_path: Path) -> Wheelhouse:
    return Wheelhouse(Path(matrix_path).resolve().parent / "wheelhouse")
