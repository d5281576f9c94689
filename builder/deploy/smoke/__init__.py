"""smoke: layered proof that an image (or a Python environment) of a cell serves the model under each strategy.

    L0 metadata  →  L1 inside the image  →  L2 the engine's own parser  →  L3 a GPU boot

The engine knowledge it reads is data (builder/data/engines.toml: launch, health, ready_log, serve_modules,
runtime_checks, the `smoke` table, each strategy's flags / expect / k). `layers.py` holds the layers,
`probe.py` the script that runs inside, `tinymodel.py` the generated `--model tiny`, `report.py` the JSON /
JUnit XML / table forms; where the engine runs, and the running engine L3 talks to, is builder/deploy/runtime/engine.py. `builder smoke` and the build step (builder/steps/smoke.py) both call here.
"""

from __future__ import annotations

from pathlib import Path

from ... import audit as audit_mod
from ...errors import UserError
from ...image import labels as labels_mod
from ...resolve import Cell
from .layers import Model, SmokeOptions, run
from ..runtime.engine import DockerLauncher, ProcessLauncher
from ..subject import Subject, read_local
from .report import LAYERS, SmokeReport

__all__ = ["LAYERS", "Model", "SmokeOptions", "SmokeReport", "image_caches", "process_caches", "smoke_image",
           "smoke_process"]


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


def image_caches(opts: SmokeOptions, labels: dict[str, str]) -> None:
    """L3 of an image boots with its compile caches (labels io.builder.cache-env) and watches its cache root; an
    image with a warm layer must boot without compiling beyond its allowance."""
    if not opts.cache_root and labels_mod.cache_root(labels):
        opts.cache_root, opts.cache_env = labels_mod.cache_root(labels), labels_mod.cache_env(labels)
    if opts.warm_allowance is None and labels_mod.warm(labels):
        opts.warm_allowance = tuple(labels_mod.warm_allowance(labels))


def process_cache_env(cell: Cell, cache_root: str | None) -> tuple[str, dict[str, str]]:
    """The process route runs the engine with the image's compile caches at the same paths: the cell's cache
    variables (engine data compile_caches) under `cache_root` (default: the image's own root, jit_cache_root). The
    root and the variables; ("", {}) for a cell without a cache root."""
    if not cell.cache_root:
        return "", {}
    root = (cache_root or cell.cache_root).rstrip("/") or "/"
    return root, {k: root + v[len(cell.cache_root):] for k, v in cell.compile_caches}


def process_caches(opts: SmokeOptions, cell: Cell, cache_root: str | None) -> None:
    """process_cache_env into smoke's options (a cell without a cache root leaves them as they are)."""
    if cell.cache_root:
        opts.cache_root, opts.cache_env = process_cache_env(cell, cache_root)


def image_paths(opts: SmokeOptions, cell: Cell, python: str, cache_root: str | None) -> dict:
    """--image-paths: the process route at the image's paths, `python` checked to be the image's interpreter (its
    prefix and site-packages), CUDA_HOME and the model root as the image has them, the caches at the image's root
    (a --cache-root elsewhere is refused). What the interpreter reported."""
    from ...image.launchline import image_paths as paths_of
    from ..runtime.imagepaths import check

    paths = paths_of(cell)
    if cache_root is not None and cache_root.rstrip("/") != paths.cache_root:
        raise UserError(f"--image-paths with --cache-root {cache_root}: the image's cache root is {paths.cache_root}")
    got = check(python, paths, cell)
    opts.paths = paths
    return {**paths.to_json(), "python": got["python"]}


def smoke_image(cell: Cell, image: str, opts: SmokeOptions, say=lambda s: None, client=None,
                subject: Subject | None = None, run_ref: str | None = None) -> SmokeReport:
    """L0–L3 on a local image (never pulled here), through the docker SDK; `subject` is the image as read
    already (its config and labels), else it is read from the daemon. `run_ref`: what runs and is audited (the
    read image's ID: subject.pinned), else `image`; the report records the digest read."""
    launcher = DockerLauncher(run_ref or image, gpus=opts.gpus, client=client, gpu_ids=opts.gpu_ids)
    try:
        found = subject if subject is not None else read_local(image, launcher.client)
        config = found.config if found is not None else {}
        image_caches(opts, config.get("Labels") or {})
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
