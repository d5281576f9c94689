"""smoke: layered proof that an image (or a Python environment) of a cell serves the model under each strategy.

    L0 metadata  →  L1 inside the image  →  L2 the engine's own parser  →  L3 a GPU boot

The engine knowledge it reads is data (builder/data/engines.toml: launch, health, ready_log, serve_modules,
runtime_checks, the `smoke` table, each strategy's flags / expect / k). `layers.py` holds the layers,
`launch.py` where the engine runs (a container through the docker SDK, or a process on a GPU host without
Docker), `probe.py` the script that runs inside, `tinymodel.py` the generated `--model tiny`, `report.py` the
JSON / JUnit XML / table forms. `builder smoke` and the build step (builder/steps/smoke.py) both call here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from ... import audit as audit_mod
from ...resolve import Cell
from .layers import Model, SmokeOptions, run
from .launch import DockerLauncher, ProcessLauncher
from .report import LAYERS, SmokeReport

__all__ = ["LAYERS", "Model", "SmokeOptions", "SmokeReport", "detect_gpu", "image_labels", "smoke_image",
           "smoke_process"]


def detect_gpu() -> tuple[bool, str, int | None]:
    """(GPUs here, why not, compute capability of GPU 0 as 90/80/...)."""
    if shutil.which("nvidia-smi") is None:
        return False, "this host has no NVIDIA GPU (nvidia-smi not found)", None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"nvidia-smi does not work: {exc}", None
    if out.returncode != 0:
        return False, f"nvidia-smi fails (exit {out.returncode}): {(out.stderr or out.stdout).strip()[:200]}", None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        return False, "this host has no NVIDIA GPU (nvidia-smi lists none)", None
    m = re.fullmatch(r"(\d+)\.(\d+)", lines[0])
    return True, "", int(m.group(1)) * 10 + int(m.group(2)) if m else None


def image_labels(launcher: DockerLauncher, image: str) -> dict:
    return launcher.client.images.get(image).labels or {}


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


def smoke_image(cell: Cell, image: str, opts: SmokeOptions, say=lambda s: None, client=None) -> SmokeReport:
    """L0–L3 on a local image (never pulled), through the docker SDK."""
    launcher = DockerLauncher(image, gpus=opts.gpus, client=client)
    try:
        config = launcher.client.images.get(image).attrs.get("Config") or {}
        return run(cell, launcher, opts, config.get("Labels") or {}, image, _audit_image_files(image), say,
                   entrypoint=config.get("Entrypoint"))
    finally:  # a failure, Ctrl-C or SIGTERM anywhere: no container of this run stays behind
        launcher.close()


def smoke_process(cell: Cell, python: str, opts: SmokeOptions, say=lambda s: None,
                  extra_env: dict[str, str] | None = None) -> SmokeReport:
    """L0–L3 in the Python environment of `python` on this host (a GPU host without Docker)."""
    launcher = ProcessLauncher(python=python, gpus=opts.gpus, extra_env=dict(extra_env or {}))
    return run(cell, launcher, opts, None, f"process:{python}", _audit_local_files, say)


def report_dir(base: Path, cell: Cell) -> Path:
    return base / cell.id
