"""compile: one package's wheel — fetched from the wheel cache when its key is there, else compiled by
BuildKit (`--target wheels-<package>`) and exported to the cell's work dir."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from .. import docker
from ..plan import WheelStep
from ..resources import Parallelism, choose
from . import CellContext, Status, StepResult, common_build_args


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_call(ctx: CellContext, wheel: WheelStep) -> tuple[Parallelism, docker.BuildxCall]:
    opts = ctx.opts
    par = choose(wheel.package.recipe, ctx.host, opts.max_jobs, opts.nvcc_threads)
    common = common_build_args(ctx)
    common["build_args"] += (("MAX_JOBS", str(par.max_jobs)), ("NVCC_THREADS", str(par.nvcc_threads)))
    out = ctx.out_dir(wheel.package.name)
    return par, docker.BuildxCall(target=f"wheels-{wheel.package.name}", output=f"type=local,dest={out}", **common)


def _wheel_artifacts(wheels: list[Path]) -> dict:
    return {"wheels": [{"file": w.name, "sha256": sha256_file(w), "bytes": w.stat().st_size} for w in wheels]}


class CompileStep:
    name = "compile"
    scope = "package"

    def run(self, ctx: CellContext, wheel: WheelStep) -> StepResult:
        pkg = wheel.package
        label = f"{pkg.name}=={pkg.version}"
        out = ctx.out_dir(pkg.name)
        # asked again: an earlier cell of this run may have stored the same key since plan looked
        hit = wheel.hit or ctx.cache.lookup(pkg.name, wheel.key)
        if hit is not None:
            ctx.note(f"reuse {label} (key {wheel.short_key}, {hit.store})")
            wheels = ctx.cache.fetch(hit, out)
            ctx.wheels[pkg.name] = wheels
            ctx.reused[pkg.name] = hit
            return StepResult(self.name, pkg.name, Status.OK, f"cache hit in {hit.store}",
                              artifacts={"reused": True, "cached_in": hit.store, **_wheel_artifacts(wheels)})
        par, call = wheel_call(ctx, wheel)
        ctx.note(f"build {label} (key {wheel.short_key}): {par.why}")
        docker.stream(call.argv(ctx.opts.docker), ctx.log, ctx.echo())
        wheels = sorted(out.glob("*.whl"))
        if not wheels:
            return StepResult(self.name, pkg.name, Status.FAILED,
                              f"the wheels-{pkg.name} stage exported no .whl into {out}")
        ctx.wheels[pkg.name] = wheels
        return StepResult(self.name, pkg.name, Status.OK, par.why, artifacts={"reused": False, **_wheel_artifacts(wheels)})

    def dry_run(self, ctx: CellContext, wheel: WheelStep) -> list[str]:
        pkg = wheel.package
        if wheel.hit is not None:
            return [f"# reuse {pkg.name}=={pkg.version} from {wheel.hit.store}: {wheel.hit.location}"]
        par, call = wheel_call(ctx, wheel)
        return [f"# {pkg.name}: {par.why}", shlex.join(call.argv(ctx.opts.docker))]
