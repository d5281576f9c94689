"""audit: the wheels of one package really carry device code for every requested arch (SASS, or PTX the
driver can JIT), read from the ELF fatbins in Python. A compiled package with no device code at all fails
too: a knob that switched CUDA off must not be cached or tagged. Packages the engine data marks as pure
Python are exempt. Wheels fetched from the cache are audited again: what is installed is what was proven."""

from __future__ import annotations

from .. import archs as archs_mod
from ..image import labels
from ..audit import audit, format_report
from ..plan import WheelStep
from . import CellContext, Status, StepResult


class AuditStep:
    name = "audit"
    scope = "package"

    def run(self, ctx: CellContext, wheel: WheelStep) -> StepResult:
        pkg = wheel.package
        label = f"{pkg.name}=={pkg.version}"
        report = audit(ctx.out_dir(pkg.name), list(ctx.cell.archs), pkg.arch_scoped)
        ctx.audits[pkg.name] = report
        ctx.note(f"audit {label}:\n{format_report(report)}")
        summary = {"ok": report.ok, "binaries_with_device_code": sum(b.has_device_code for b in report.binaries),
                   "missing": {b.path: [archs_mod.sm(a) for a in b.missing] for b in report.failures}}
        if report.errors:
            return StepResult(self.name, pkg.name, Status.FAILED,
                              f"audit failed for {label}: {report.errors[0].error}; not cached, not tagged",
                              artifacts=summary)
        if not report.ok:
            return StepResult(self.name, pkg.name, Status.FAILED,
                              f"audit failed for {label}: the wheel misses requested archs (see above); not cached, not tagged",
                              artifacts=summary)
        if pkg.recipe.compiled and not report.has_device_code:
            return StepResult(self.name, pkg.name, Status.FAILED,
                              f"audit failed for {label}: no binary in the wheel carries device code, but {pkg.name} "
                              "compiles CUDA kernels (did a build knob switch CUDA off?); not cached, not tagged",
                              artifacts=summary)
        why = f"no device code expected ({pkg.recipe.describe_binaries(ctx.cell.torch, ctx.cell.cuda, ctx.cell.python)})" \
            if not pkg.recipe.compiled else \
            f"device code covers {', '.join(map(archs_mod.sm, ctx.cell.archs))}"
        # the engine data's prediction of what the build emits, against what the binaries carry: the image's
        # labels say what was found (builder/image/labels.py); a predicted arch nobody carries is reported here
        unfound = sorted(set(pkg.built_sass) - labels.found_sass(report)) if pkg.recipe.compiled and not pkg.from_index else []
        if unfound:
            why += f"; the engine data predicts {', '.join(unfound)}, which no binary carries (the labels say what was found)"
            summary["predicted_not_found"] = unfound
        return StepResult(self.name, pkg.name, Status.OK, why, artifacts=summary)

    def dry_run(self, ctx: CellContext, wheel: WheelStep) -> list[str]:
        return [f"# audit {wheel.package.name} for {','.join(map(archs_mod.sm, ctx.cell.archs))}"]
