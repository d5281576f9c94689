"""route: settle each `source = "auto"` package of a cell before its Dockerfile is rendered — the published wheel
downloaded (or taken from the wheel cache) and audited for the cell's archs, its torch / CUDA / Python read from the
file (builder/route.py) — and hand the runner the cell on the chosen routes: each package under the cache key of the
route it takes, its labels saying what was chosen and why. One "route" result per auto package: the closing table
and --json show it; a failure here (the index down, a wheel that cannot be read) fails the cell before anything
is compiled."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import archs as archs_mod
from ..cache import CacheCorrupt
from ..plan import CellPlan, cache_key, route_keys, wheel_step
from ..route import BUILD, settle
from . import CellContext, Status, StepResult

NAME = "route"


def _from_cache(ctx: CellContext, cell, work: Path):
    """The published wheel from the wheel cache, verified, when an earlier build took the index route (no download)."""
    def cached(index_pkg) -> Path | None:
        hit = ctx.cache.lookup(index_pkg.name, cache_key(cell, index_pkg), index_pkg.cache_archs)
        if hit is None or not hit.usable:
            return None
        try:
            wheels = ctx.cache.fetch(hit, work)
        except CacheCorrupt:
            return None
        if len(wheels) == 1:
            ctx.note(f"{wheels[0].name}: from {hit.store} (key {hit.key[:16]}; sha256 verified)")
            return wheels[0]
        return None
    return cached


def settle_routes(ctx: CellContext) -> list[StepResult]:
    """Decide every auto package of ctx.plan; ctx.plan becomes the plan on the chosen routes."""
    plan, opts = ctx.plan, ctx.opts
    cell = plan.cell
    results: list[StepResult] = []
    packages, settled = [], {}
    for w in plan.wheels:
        pkg = w.package
        if pkg.route is None:
            packages.append(pkg)
            continue
        work = ctx.dir / f"route-{pkg.name}"
        decided, report, wheel = settle(pkg, cell, _from_cache(ctx, cell, work), ctx.note)
        r = decided.route
        keys = route_keys(cell, decided)
        artifacts = {**r.to_json(), "keys": keys, "key": keys[r.chosen]}
        if report is not None:
            artifacts["audit"] = {"ok": report.ok, "archs": [archs_mod.sm(a) for a in cell.archs],
                                  "binaries_with_device_code": sum(b.has_device_code for b in report.binaries),
                                  "missing": {b.path: [archs_mod.sm(a) for a in b.missing] for b in report.failures}}
        ctx.note(f"route {pkg.name}=={pkg.version}: auto → {r.summary}")
        problem = ""
        if r.chosen == BUILD:
            unpinned = decided.unpinned()
            if unpinned and not opts.allow_unpinned:
                problem = (f"auto chose to compile {pkg.name} {pkg.version}, whose source is not pinned "
                           f"({'; '.join(unpinned)}): run `builder lock` where the git host answers, or pass "
                           "--allow-unpinned")
            elif gcc := decided.gcc_problem():
                problem = f"auto chose to compile {pkg.name} {pkg.version}: {gcc}"
        if r.chosen != BUILD and wheel is not None:
            ctx.prefetched[pkg.name] = wheel
        results.append(StepResult(NAME, pkg.name, Status.FAILED if problem else Status.OK, problem or r.summary,
                                  artifacts=artifacts))
        packages.append(decided)
        settled[pkg.name] = decided
    new_cell = dataclasses.replace(cell, packages=tuple(packages))
    steps = []
    for w in plan.wheels:
        pkg = settled.get(w.package.name)
        if pkg is None:
            steps.append(dataclasses.replace(w, package=next(p for p in packages if p.name == w.package.name)))
        elif pkg.source == w.package.source:  # as predicted: the same key, cache answer and estimate
            steps.append(dataclasses.replace(w, package=pkg))
        else:  # the other route: its own key, asked of plan
            steps.append(wheel_step(new_cell, pkg, ctx.cache))
    ctx.plan = CellPlan(new_cell, tuple(steps))
    return results

