"""smoke: the layered proof (builder/deploy/smoke/) on the image the image step just tagged — L0 labels and versions,
L1 imports and audit inside, L2 the engine's own parser per strategy, L3 a GPU boot where this host has GPUs.
Nothing is published unless it passed (runner.GATES: "publish": ("smoke",)); `build --no-smoke` skips it, and
the closing table and --json say so, with the reason."""

from __future__ import annotations

from . import CellContext, Status, StepResult


class SmokeStep:
    name = "smoke"
    scope = "cell"

    def run(self, ctx: CellContext, wheel: None = None) -> StepResult:
        from ..deploy import smoke
        from ..deploy.runtime import gpus

        cell, opts = ctx.cell, ctx.opts
        if not opts.smoke:
            return StepResult(self.name, cell.id, Status.SKIPPED, "skipped: --no-smoke (nothing of this cell may be published)")
        if ctx.in_registry:  # publish of an unchanged cell that its registry already serves (builder/image/reuse.py)
            ref = f"{ctx.in_registry['ref']}@{ctx.in_registry['digest']}"
            ctx.note(f"smoke {ref}: not run again; it is the image builder published for this content key, and "
                     "publish pushes only an image whose smoke passed")
            return StepResult(self.name, cell.id, Status.OK, "passed when it was published (the ledger record "
                              "vouches for its digest; not pulled)", artifacts={"image": ref, "layers": []})
        host = gpus.read()
        have_gpu, why_not, arch = host.present, host.why_none, host.arch
        out = ctx.dir / "smoke"
        sopts = smoke.SmokeOptions(
            strategies=cell.strategies,
            model=smoke.Model.resolve(opts.smoke_model),
            gpus=have_gpu,
            no_gpu_reason=why_not,
            gpu_arch=arch,
            log_dir=out,
        )
        ctx.note(f"smoke {cell.ref}: {', '.join(cell.strategies) or 'no strategies'}; "
                 f"{'L0-L3' if have_gpu else 'L0-L2 (' + why_not + ')'}")
        rep = smoke.smoke_image(cell, ctx.image_ref or cell.ref, sopts, ctx.note)  # the image step's own name for it
        js, xml = smoke.report.write([rep], out)
        ctx.log.write(smoke.report.table([rep]) + "\n")
        status = Status.OK if rep.ok else Status.FAILED
        return StepResult(self.name, cell.id, status, rep.summary(),
                          artifacts={"report": str(js), "junit": str(xml),
                                     "layers": [r.to_json() for r in rep.results]})

    def dry_run(self, ctx: CellContext, wheel: None = None) -> list[str]:
        if not ctx.opts.smoke:
            return [f"# smoke {ctx.cell.id}: skipped (--no-smoke)"]
        return [f"# smoke: builder smoke {ctx.cell.ref} --matrix <the matrix> "
                f"(L0-L2 here, L3 where nvidia-smi finds a GPU; reports in {ctx.dir / 'smoke'})"]
