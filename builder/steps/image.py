"""image: the slim runtime image of a cell, built from exactly the cell's audited wheels (a BuildKit named
context), loaded and tagged. Also records the runtime's resolved pure-Python dependencies on the first
build of a cell (runtime-pins/<cell>.txt) and installs exactly those on later builds."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from .. import docker, pins
from . import CellContext, Status, StepResult, common_build_args

WHEEL_SUMS = "wheels.sha256"  # sha256sum format; its name is also in dockerfiles/stages/runtime.j2


def runtime_call(ctx: CellContext, wheels: Path, metadata: Path) -> docker.BuildxCall:
    common = common_build_args(ctx)
    common["contexts"] = (("wheels", str(wheels)),) + common["contexts"]
    return docker.BuildxCall(target="runtime", tags=(ctx.cell.ref,), load=True, metadata_file=metadata, **common)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class ImageStep:
    name = "image"
    scope = "cell"

    def _pins_file(self, ctx: CellContext) -> Path | None:
        return ctx.opts.pins_dir / f"{ctx.cell.id}.txt" if ctx.opts.pins_dir else None

    def run(self, ctx: CellContext, wheel: None = None) -> StepResult:
        cell, opts = ctx.cell, ctx.opts
        stage = ctx.dir / "wheels"
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
        sums = []
        for step in ctx.plan.wheels:
            for w in ctx.wheels[step.package.name]:
                _link_or_copy(w, stage / w.name)
                sums.append(f"{ctx.records[step.package.name][w.name]['sha256']}  /wheels/{w.name}\n")
        # The runtime stage checks these before pip sees a wheel: what was audited is what is installed.
        (stage / WHEEL_SUMS).write_text("".join(sums))
        pins_file = self._pins_file(ctx)
        if pins_file and pins_file.is_file() and not opts.refresh_pins:
            shutil.copy2(pins_file, stage / pins.FILE_IN_CONTEXT)
            ctx.note(f"runtime dependencies pinned by {pins_file}")
        metadata = ctx.dir / "metadata.json"
        ctx.note(f"runtime image {cell.ref}")
        docker.stream(runtime_call(ctx, stage, metadata).argv(opts.docker), ctx.log, ctx.echo())
        meta = json.loads(metadata.read_text()) if metadata.exists() else {}
        digest = meta.get("containerimage.digest", "")
        if pins_file and (opts.refresh_pins or not pins_file.is_file()):
            pins.record(cell.ref, cell, pins_file)
            ctx.note(f"recorded the resolved runtime dependencies in {pins_file}")
        return StepResult(self.name, cell.id, Status.OK, f"tagged {cell.ref}",
                          artifacts={"image": cell.ref, "digest": digest})

    def dry_run(self, ctx: CellContext, wheel: None = None) -> list[str]:
        return [shlex.join(runtime_call(ctx, ctx.dir / "wheels", ctx.dir / "metadata.json").argv(ctx.opts.docker))]
