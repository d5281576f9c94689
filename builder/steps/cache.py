"""cache: keep a package's audited wheels in the wheel cache under their key, with a manifest saying what
shaped them and what the audit found. (The runner calls this step only after the audit passed.)"""

from __future__ import annotations

import getpass
import os
import socket
import time

from .. import __version__
from ..cache import MANIFEST_FORMAT
from ..plan import WheelStep
from . import CellContext, Status, StepResult


def built_by(ctx: CellContext) -> dict:
    """Who built a wheel, where, when, and with what."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {
        "user": user,
        "host": socket.gethostname(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "builder": __version__,
        "cores": ctx.host.cores,
        "free_gb": ctx.host.free_gb,
    }


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
            "format": MANIFEST_FORMAT,
            "cell": ctx.cell.id,
            "package": pkg.name,
            "version": pkg.version,
            "key": wheel.key,
            "key_inputs": wheel.inputs,
            "files": ctx.records[pkg.name],
            "compiled": pkg.recipe.compiled,  # `builder wheels verify` re-checks the device-code rule
            "audit": ctx.audits[pkg.name].to_json(),
            # what `builder wheels verify` audits again with: binaries the engine data scopes to some archs
            "arch_scoped": [scope.to_json() for scope in pkg.arch_scoped],
            "built_by": built_by(ctx),
            "compile": ctx.compiles.get(pkg.name),  # what builder plan's estimates are made from
        })
        ctx.note(f"cached {pkg.name}=={pkg.version} in {entry.store} (key {wheel.short_key})")
        for line in entry.notes:  # what remote stores answered; a failed push is a warning, the wheel is cached locally
            ctx.note(line)
        remotes = {"remotes": entry.manifest["remotes"]} if entry.manifest.get("remotes") else {}
        warnings = [n for n in entry.notes if n.startswith("WARNING")]
        return StepResult(self.name, pkg.name, Status.OK, f"stored in {entry.store}" + (f"; {warnings[0]}" if warnings else ""),
                          artifacts={"entry": entry.location, **remotes, **({"warnings": warnings} if warnings else {})})

    def dry_run(self, ctx: CellContext, wheel: WheelStep) -> list[str]:
        return [] if wheel.hit is not None else [f"# cache {wheel.package.name} under key {wheel.short_key} once audited"]
