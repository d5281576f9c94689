"""smoke: layered proof that an image (or a Python environment) of a cell serves the model under each strategy.

    L0 metadata  →  L1 inside the image  →  L2 the engine's own parser  →  L3 a GPU boot

The engine knowledge it reads is data (builder/data/engines.toml: launch, health, ready_log, serve_modules,
runtime_checks, the `smoke` table, each strategy's flags / expect / k). `layers.py` holds the layers,
`probe.py` the script that runs inside, `tinymodel.py` the generated `--model tiny`, `shapemodel.py` the generated
`--model shape:27b` (a published shape, dummy weights), `report.py` the JSON /
JUnit XML / table forms; where the engine runs, and the running engine L3 talks to, is builder/deploy/runtime/engine.py. `builder smoke` and the build step (builder/steps/smoke.py) both call here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ... import audit as audit_mod
from ...resolve import Cell
from .layers import Model, SmokeOptions, run
from ..runtime import caches
from ..runtime.engine import DockerLauncher, ProcessLauncher
from ..subject import Subject, read_local
from .report import LAYERS, SmokeReport

__all__ = ["LAYERS", "Model", "SmokeOptions", "SmokeReport", "smoke_image", "smoke_process"]


def _audit_image_files(image: str):
    def audit_files(paths: list[str], archs: list[int], scopes=()) -> audit_mod.AuditReport:
        report = audit_mod.audit_image(image, archs, scopes)
        wanted = set(paths)
        report.binaries = [b for b in report.binaries if b.path in wanted]
        return report

    return audit_files


def _audit_local_files(paths: list[str], archs: list[int], scopes=()) -> audit_mod.AuditReport:
    report = audit_mod.AuditReport("installed files", audit_mod.archs_mod.requested(archs))
    for p in sorted(set(paths)):
        report.binaries += audit_mod.audit(p, archs, scopes).binaries
    return report


def smoke_image(cell: Cell, image: str, opts: SmokeOptions, say=lambda s: None, client=None,
                subject: Subject | None = None, run_ref: str | None = None) -> SmokeReport:
    """L0–L3 on a local image (never pulled here), through the docker SDK; `subject` is the image as read
    already (its config and labels), else it is read from the daemon. `run_ref`: what runs and is audited (the
    read image's ID: subject.pinned), else `image`; the report records the digest read. L3 boots with the image's
    compile caches and watches its cache root (runtime/caches.py of_image; what opts.caches holds wins); an image
    with a warm layer must boot without compiling beyond its allowance."""
    launcher = DockerLauncher(run_ref or image, gpus=opts.gpus, client=client, gpu_ids=opts.gpu_ids)
    try:
        found = subject if subject is not None else read_local(image, launcher.client)
        config = found.config if found is not None else {}
        opts = dataclasses.replace(opts, caches=caches.of_image(config.get("Labels") or {}, opts.caches))
        rep = run(cell, launcher, opts, config.get("Labels") or {}, image, _audit_image_files(run_ref or image), say,
                  entrypoint=config.get("Entrypoint"))
        rep.digest = found.digest if found is not None else ""
        rep.image_id = run_ref or (found.image_id if found is not None else "")
        return rep
    finally:  # a failure, Ctrl-C or SIGTERM anywhere: no container of this run stays behind
        launcher.close()


def smoke_process(cell: Cell, python: str, opts: SmokeOptions, say=lambda s: None,
                  extra_env: dict[str, str] | None = None) -> SmokeReport:
    """L0–L3 in the Python environment of `python` on this host (a GPU host without Docker)."""
    launcher = ProcessLauncher(python=python, gpus=opts.gpus, extra_env=dict(extra_env or {}), gpu_ids=opts.gpu_ids,
                               paths=opts.paths)
    return run(cell, launcher, opts, None, f"process:{python}", _audit_local_files, say)


def report_dir(base: Path, cell: Cell) -> Path:
    return base / cell.id
