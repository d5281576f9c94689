"""cache: keep a package's audited wheels in the wheel cache under their key, with a manifest saying what
shaped them and what the audit found. (The runner calls this step only after the audit passed.)"""

from __future__ import annotations

from ..plan import WheelStep
from . import CellContext, Status, StepResult


class CacheStep:
    name = "cache"
    scope = "package"

    def run(self, ctx: CellContext, wheel: WheelStep) -> StepResult:
        pkg = wheel.package
        if pkg.name in ctx.reused:
            hit = ctx.reused[pkg.name]
            return StepResult(self.name, pkg.name, Status.SKIPPED, f"already in {hit.store}",
                              artifacts={"entry": hit.location})
        entry = ctx.cache.store(pkg.name, wheel.key, ctx.wheels[pkg.name], {
            "cell": ctx.cell.id,
            "package": pkg.name,
            "version": pkg.version,
            "key": wheel.key,
            "key_inputs": wheel.inputs,
            "audit": ctx.audits[pkg.name].to_json(),
        })
        ctx.note(f"cached {pkg.name}=={pkg.version} in {entry.store} (key {wheel.short_key})")
        return StepResult(self.name, pkg.name, Status.OK, f"stored in {entry.store}", artifacts={"entry": entry.location})

    def dry_run(self, ctx: CellContext, wheel: WheelStep) -> list[str]:
        return [] if wheel.hit is not None else [f"# cache {wheel.package.name} under key {wheel.short_key} once audited"]
