"""image: the slim runtime image of a cell, built from exactly the cell's audited wheels (a BuildKit named
context), exported as an OCI archive with every timestamp rewritten to SOURCE_DATE_EPOCH (the same sources give
the same digest), then loaded into the daemon and tagged — the loaded image keeps the archive's digest, so what
smoke runs and what publish pushes is one image, byte for byte. Also records the runtime's resolved pure-Python
dependencies on the first build of a cell (runtime-pins/<cell>.txt) and installs exactly those on later builds."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
from pathlib import Path

from .. import docker, labels, oci, pins
from . import CellContext, Status, StepResult, common_build_args

WHEEL_SUMS = "wheels.sha256"  # sha256sum format; its name is also in dockerfiles/stages/runtime.j2
ARCHIVE = "image.oci.tar"  # in the cell's work dir: what the publish step pushes


def archive_path(ctx: CellContext) -> Path:
    return ctx.dir / ARCHIVE


def runtime_call(ctx: CellContext, wheels: Path, metadata: Path, name: str | None = None) -> docker.BuildxCall:
    """The runtime build; `name` is what `docker load` calls the archive's image (default: the cell's tag)."""
    common = common_build_args(ctx)
    common["contexts"] = (("wheels", str(wheels)),) + common["contexts"]
    # the audited labels (builder/labels.py): what the audit of these very wheels found, never the data's guess
    found = {}
    for p in ctx.cell.packages:
        if p.recipe.compiled:
            report = ctx.audits.get(p.name)
            found.update(labels.audit_values(p.name, report) if report is not None else
                         {labels.audit_arg(p.name, w): "<from the audit>" for w in labels.AUDITED})
    common["build_args"] = tuple(common["build_args"]) + tuple(sorted(found.items()))
    # rewrite-timestamp works with the OCI exporter on every driver (with type=image the docker driver refuses it)
    output = docker.csv_options(type="oci", dest=archive_path(ctx), name=name or ctx.cell.ref,
                                **{"rewrite-timestamp": "true"})
    return docker.BuildxCall(target="runtime", output=output, metadata_file=metadata, attest=ctx.opts.attest, **common)


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
            text = pins_file.read_text()
            if pins.hashed(text):  # every release and every wheel by its sha256: pip --require-hashes
                own = [(w.name, ctx.records[s.package.name][w.name]["sha256"]) for s in ctx.plan.wheels
                       for w in ctx.wheels[s.package.name]]
                (stage / pins.HASHED_IN_CONTEXT).write_text(pins.requirements(text, own))
                ctx.note(f"runtime dependencies hash-locked by {pins_file}")
            else:
                (stage / pins.FILE_IN_CONTEXT).write_text(pins.constraints(text))
                ctx.note(f"runtime dependencies pinned by {pins_file} (versions only: no hashes in it)")
        metadata = ctx.dir / "metadata.json"
        ctx.note(f"runtime image {cell.ref}")
        # loaded under a name of this run only: another build of the cell loading or tagging its image at the same
        # moment cannot take this one's place (the name is not part of the image or its digest). Smoke runs and
        # publish checks the image under this name; the runner removes it when the cell is done.
        run_name = f"{cell.image}:{cell.tag}-run-{secrets.token_hex(4)}"
        docker.stream(runtime_call(ctx, stage, metadata, run_name).argv(opts.docker), ctx.log, ctx.echo())
        meta = json.loads(metadata.read_text()) if metadata.exists() else {}
        archive = archive_path(ctx)
        with oci.Archive(archive) as a:
            image = a.image()
        digest = image.digest
        if meta.get("containerimage.digest", digest) != digest:
            return StepResult(self.name, cell.id, Status.FAILED, f"the build reported {meta['containerimage.digest']}, "
                                                                 f"its OCI archive holds {digest}")
        ctx.note(f"load {archive} ({digest})")
        docker.load_archive(archive, opts.docker)
        ctx.image_ref = run_name  # from here on the runner drops the name, whatever happens
        loaded = docker.image_id(run_name, opts.docker)
        if loaded != digest:
            return StepResult(self.name, cell.id, Status.FAILED,
                              f"{archive} was loaded as {loaded or 'nothing'}, not as the built {digest} (the daemon "
                              "needs the containerd image store: scripts/setup-docker.sh turns it on)")
        # cell.ref, the name users know, may be moved by another build of the cell at any moment
        docker.tag_image(run_name, cell.ref, opts.docker)
        if pins_file and (opts.refresh_pins or not pins_file.is_file()):
            _, why = pins.record(run_name, cell, pins_file, opts.index_url)
            ctx.note(f"recorded the resolved runtime dependencies in {pins_file}"
                     + (f" (versions only: {why})" if why else ", each with its sha256"))
        return StepResult(self.name, cell.id, Status.OK, f"tagged {cell.ref}",
                          artifacts={"image": cell.ref, "digest": digest, "manifest": image.manifest_digest,
                                     "archive": str(archive), "attestations": list(image.attestations)})

    def dry_run(self, ctx: CellContext, wheel: None = None) -> list[str]:
        call = runtime_call(ctx, ctx.dir / "wheels", ctx.dir / "metadata.json")
        return [shlex.join(call.argv(ctx.opts.docker)),
                shlex.join([ctx.opts.docker, "load", "--input", str(archive_path(ctx))])]
