"""build: execute a plan with BuildKit — each missing wheel compiled and exported, audited, cached;
then the slim runtime image built from those wheels and tagged only if every step passed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import pins, render
from .audit import audit, format_report
from .buildx import BuildxCall, run_streaming
from .errors import BuilderError, UserError
from .matrix import Cell
from .plan import CellPlan, WheelStep, key_inputs
from .resources import Host, choose
from .wheelhouse import Wheelhouse


@dataclass(frozen=True)
class BuildOptions:
    work_dir: Path
    log_dir: Path
    index_url: str
    dry_run: bool = False
    keep_going: bool = False
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    ca_bundle: Path | None = None
    allow_unpinned: bool = False
    source_date_epoch: str | None = None
    pins_dir: Path | None = None  # runtime-pins/ next to the matrix (see builder/pins.py)
    refresh_pins: bool = False
    no_cache: bool = False  # ignore BuildKit's layer cache (the wheelhouse still decides what is compiled)
    echo_build_output: bool = True
    docker: str = "docker"


@dataclass
class CellResult:
    cell: Cell
    ok: bool = False
    seconds: float = 0.0
    digest: str = ""
    built: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    error: str = ""
    log: Path | None = None

    def to_json(self) -> dict:
        return {
            "cell": self.cell.id,
            "result": "ok" if self.ok else "failed",
            "seconds": round(self.seconds, 1),
            "image": self.cell.ref if self.ok else None,
            "digest": self.digest or None,
            "built": self.built,
            "reused": self.reused,
            "error": self.error or None,
            "log": str(self.log) if self.log else None,
        }


def check_options(plans: list[CellPlan], opts: BuildOptions) -> None:
    """Refuse bad input before any build starts."""
    if opts.ca_bundle is not None and not opts.ca_bundle.is_file():
        raise UserError(f"--ca-bundle: {opts.ca_bundle} is not a file")
    for name, value in (("--max-jobs", opts.max_jobs), ("--nvcc-threads", opts.nvcc_threads)):
        if value is not None and value < 1:
            raise UserError(f"{name}: must be at least 1, got {value}")
    if opts.source_date_epoch is not None and not opts.source_date_epoch.isdigit():
        raise UserError(f"SOURCE_DATE_EPOCH: {opts.source_date_epoch!r} is not a Unix timestamp")
    if not opts.allow_unpinned:
        unpinned = [
            f"{p.cell.id}: {w.package.name} {w.package.version}: {what}"
            for p in plans
            for w in p.wheels
            if not w.reuse
            for what in w.package.unpinned()
        ]
        if unpinned:
            raise UserError(
                "sources not pinned to a commit (run `builder lock` where the git host is reachable, "
                "or pass --allow-unpinned to build from the tag):\n  " + "\n  ".join(unpinned)
            )


def _common(cell: Cell, opts: BuildOptions, dockerfile: Path, context: Path) -> dict:
    args = []
    if opts.source_date_epoch:
        args.append(("SOURCE_DATE_EPOCH", opts.source_date_epoch))
    secrets = (("ca", str(opts.ca_bundle)),) if opts.ca_bundle else ()
    contexts = tuple((f"local-{p.name}", p.source.path) for p in cell.packages if p.source.kind == "local")
    extra = ("--no-cache",) if opts.no_cache else ()
    return {"dockerfile": dockerfile, "context": context, "build_args": tuple(args), "secrets": secrets,
            "contexts": contexts, "extra": extra}


def wheel_call(cell: Cell, step: WheelStep, opts: BuildOptions, host: Host, dockerfile: Path, context: Path, out: Path):
    par = choose(step.package.recipe, host, opts.max_jobs, opts.nvcc_threads)
    common = _common(cell, opts, dockerfile, context)
    common["build_args"] += (("MAX_JOBS", str(par.max_jobs)), ("NVCC_THREADS", str(par.nvcc_threads)))
    return par, BuildxCall(target=f"wheels-{step.package.name}", output=f"type=local,dest={out}", **common)


def runtime_call(cell: Cell, opts: BuildOptions, dockerfile: Path, context: Path, wheels: Path, metadata: Path):
    common = _common(cell, opts, dockerfile, context)
    common["contexts"] = (("wheels", str(wheels)),) + common["contexts"]
    return BuildxCall(target="runtime", tags=(cell.ref,), load=True, metadata_file=metadata, **common)


def build_cells(plans: list[CellPlan], wheelhouse: Wheelhouse, opts: BuildOptions,
                say: Callable[[str], None], host: Host | None = None) -> list[CellResult]:
    check_options(plans, opts)
    host = host or Host.detect()
    results: list[CellResult] = []
    for p in plans:
        r = _build_one(p, wheelhouse, opts, say, host)
        results.append(r)
        if not r.ok and not opts.keep_going and not opts.dry_run:
            break
    return results


def _build_one(p: CellPlan, wheelhouse: Wheelhouse, opts: BuildOptions, say, host: Host) -> CellResult:
    cell = p.cell
    res = CellResult(cell)
    t0 = time.monotonic()
    cell_dir = opts.work_dir / cell.id
    dockerfile = cell_dir / "Dockerfile"
    context = cell_dir / "context"
    stage = cell_dir / "wheels"
    if opts.dry_run:
        say(f"# {cell.id}: `builder render --only {cell.id}` writes {dockerfile}")
        for step in p.wheels:
            if step.reuse:
                say(f"# reuse {step.package.name}=={step.package.version} from {wheelhouse.entry_dir(step.package.name, step.key)}")
                continue
            par, call = wheel_call(cell, step, opts, host, dockerfile, context, cell_dir / f"out-{step.package.name}")
            say(f"# {step.package.name}: {par.why}")
            say(shlex.join(call.argv(opts.docker)))
        say(shlex.join(runtime_call(cell, opts, dockerfile, context, stage, cell_dir / "metadata.json").argv(opts.docker)))
        res.ok = True
        return res

    if cell_dir.exists():
        shutil.rmtree(cell_dir)
    context.mkdir(parents=True)
    dockerfile.write_text(render.render(cell, opts.index_url, p.keys))
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    res.log = opts.log_dir / f"{cell.id}.log"
    echo = (lambda line: say(f"[{cell.id}] {line}")) if opts.echo_build_output else None
    with res.log.open("w") as log:
        try:
            for step in p.wheels:
                name = f"{step.package.name}=={step.package.version}"
                if step.reuse:
                    say(f"[{cell.id}] reuse {name} (key {step.short_key})")
                    res.reused.append(name)
                    continue
                out = cell_dir / f"out-{step.package.name}"
                par, call = wheel_call(cell, step, opts, host, dockerfile, context, out)
                say(f"[{cell.id}] build {name} (key {step.short_key}): {par.why}")
                log.write(f"# {name}: {par.why}\n")
                run_streaming(call.argv(opts.docker), log, echo)
                report = audit(out, list(cell.archs))
                log.write(format_report(report) + "\n")
                say(f"[{cell.id}] audit {name}:\n{format_report(report)}")
                if not report.ok:
                    raise BuilderError(f"audit failed for {name}: the wheel misses requested archs (see above); not cached, not tagged")
                wheelhouse.store(step.package.name, step.key, out, {
                    "cell": cell.id,
                    "package": step.package.name,
                    "version": step.package.version,
                    "key": step.key,
                    "key_inputs": key_inputs(cell, step.package),
                    "audit": report.to_json(),
                })
                res.built.append(name)
            if stage.exists():
                shutil.rmtree(stage)
            stage.mkdir()
            for step in p.wheels:
                for w in wheelhouse.lookup(step.package.name, step.key) or []:
                    _link_or_copy(w, stage / w.name)
            pins_file = opts.pins_dir / f"{cell.id}.txt" if opts.pins_dir else None
            if pins_file and pins_file.is_file() and not opts.refresh_pins:
                shutil.copy2(pins_file, stage / pins.FILE_IN_CONTEXT)
                say(f"[{cell.id}] runtime dependencies pinned by {pins_file}")
            metadata = cell_dir / "metadata.json"
            say(f"[{cell.id}] runtime image {cell.ref}")
            run_streaming(runtime_call(cell, opts, dockerfile, context, stage, metadata).argv(opts.docker), log, echo)
            meta = json.loads(metadata.read_text()) if metadata.exists() else {}
            res.digest = meta.get("containerimage.digest", "")
            if pins_file and (opts.refresh_pins or not pins_file.is_file()):
                pins.record(cell.ref, cell, pins_file, opts.docker)
                say(f"[{cell.id}] recorded the resolved runtime dependencies in {pins_file}")
            res.ok = True
        except BuilderError as exc:
            res.error = str(exc).splitlines()[0]
            log.write(f"FAILED: {exc}\n")
            say(f"[{cell.id}] FAILED: {exc}")
    res.seconds = time.monotonic() - t0
    return res


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def format_results(results: list[CellResult]) -> str:
    rows = [("cell", "result", "time", "image", "digest", "wheels built", "wheels reused")]
    for r in results:
        rows.append((
            r.cell.id,
            "ok" if r.ok else "FAILED",
            f"{r.seconds:.0f}s",
            r.cell.ref if r.ok else "(not tagged)",
            (r.digest[:19] + "…") if r.digest else "-",
            ", ".join(r.built) or "-",
            ", ".join(r.reused) or "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip() for row in rows]
    for r in results:
        if r.error:
            lines.append(f"{r.cell.id}: {r.error} (log: {r.log})")
    return "\n".join(lines)
