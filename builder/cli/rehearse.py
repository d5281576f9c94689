"""`builder rehearse`: compile a few real translation units of each package the selected cells compile, exactly
as `builder build` would, and measure them (builder/rehearse.py) — minutes before the hours."""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
from pathlib import Path

import click

from .. import rehearse as rh
from .. import resolve
from ..errors import UserError
from ..options import build_options, wheelhouse_at
from ..progress import duration
from . import flags
from .app import main


def _say(text: str) -> None:
    click.echo(text, err=True)


def _memory(ctx, param, value):
    if value is None:
        return None
    units = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    text = value.strip().lower().removesuffix("b")
    num, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "")
    try:
        size = int(float(num) * units[unit])
    except ValueError:
        raise UserError(f"--memory {value!r}: expected a size like 512m or 4g") from None
    if size < 6 * 1024**2:  # Docker's own floor
        raise UserError(f"--memory {value!r}: Docker needs at least 6m")
    return size


def rehearse_package(plan, wheel, opts, host, patterns, memory, keep, say) -> dict:
    """One compiled package of one cell: its build stage, the capture, the chosen units compiled and measured,
    the projection. Raises UserError (exit 2) for a failure the user fixes; removes its images either way."""
    from .. import docker
    from ..render import render
    from ..resources import choose
    from ..steps import CellContext, common_build_args

    cell, pkg = plan.cell, wheel.package
    work = opts.work_dir / "rehearse" / cell.id / pkg.name
    if work.exists():
        shutil.rmtree(work)
    (work / "context").mkdir(parents=True)
    stage = rh.build_stage(render(plan, opts.index_url, opts.compile_reaches_out), pkg.name)
    (work / "Dockerfile").write_text(stage.dockerfile)
    par = choose(pkg.recipe, host, opts.max_jobs, opts.nvcc_threads)
    tag = f"builder-rehearse:{secrets.token_hex(6)}"
    images = [tag]
    try:
        with (work / "build.log").open("w") as log:
            ctx = CellContext(plan=plan, opts=opts, cache=None, host=host, say=say, log=log)
            common = {**common_build_args(ctx), "dockerfile": work / "Dockerfile", "context": work / "context",
                      "layer_cache": None}
            common["build_args"] += (("MAX_JOBS", str(par.max_jobs)), ("NVCC_THREADS", str(par.nvcc_threads)))
            call = docker.BuildxCall(target=stage.target, tags=(tag,), load=True, **common)
            say(f"[{cell.id}] {pkg.name}: building its build stage ({stage.target}, up to the compile)")
            docker.stream(call.argv(opts.docker), log, None)
        gcc = rh.measured_gcc(tag, opts.docker)
        too_old = rh.gcc_too_old(pkg.name, pkg.version, gcc, pkg.recipe.min_gcc)
        if too_old:
            raise too_old
        env = {"MAX_JOBS": str(par.max_jobs), "NVCC_THREADS": str(par.nvcc_threads)}
        if opts.source_date_epoch:
            env["SOURCE_DATE_EPOCH"] = opts.source_date_epoch
        say(f"[{cell.id}] {pkg.name}: capturing its compile commands ({stage.command})")
        snapshot, units = rh.capture(tag, stage, work, env, pkg.name, opts.docker)
        images.append(snapshot)
        chosen = rh.pick(units, patterns)
        sccache_dir = opts.work_dir / "rehearse" / "sccache"
        sccache_dir.mkdir(parents=True, exist_ok=True)
        measured = []
        for i, unit in enumerate(chosen):
            say(f"[{cell.id}] {pkg.name}: compiling {unit.source} ({' '.join(unit.sass)})")
            m = rh.compile_unit(snapshot, unit, i, work, env, stage.cuda_home, sccache_dir, memory, opts.docker)
            m.planned_sass, m.asked = tuple(pkg.built_sass), tuple(pkg.archs)
            measured.append(m)
            problem = rh.failure(m, pkg.name, pkg.version, host, memory)
            if problem:
                raise problem
            if not m.ok:
                raise UserError(f"{pkg.name} {pkg.version}: {unit.source} did not compile (exit {m.returncode}):\n"
                                f"{m.log_tail}")
        seeded = ""
        if any(m.object_cache.get("misses") for m in measured):
            import os

            rh.seed_object_cache(sccache_dir, tag, work, os.environ.get("BUILDER_SCCACHE_NAMESPACE", "default"),
                                 opts.docker)
            seeded = "the build's local object cache"
        proj = rh.projection(pkg.name, pkg.version, pkg.recipe, units, measured, host, opts.max_jobs,
                             opts.nvcc_threads)
        return {"cell": cell.id, "package": pkg.name, "version": pkg.version, "gcc": gcc,
                "units": [m.to_json() for m in measured], "projection": proj,
                "estimate": wheel.estimate.to_json() if wheel.estimate else None, "objects_to": seeded}
    finally:
        if not keep:
            for image in images:
                rh.run_docker(["rmi", "-f", image], opts.docker, check=False)


def format_package(r: dict) -> str:
    p = r["projection"]
    lines = [f"{r['cell']} {r['package']} {r['version']}: {p['tus']} CUDA TUs, {p['kernel_arch_units']} kernel×arch "
             f"units; gcc {r['gcc']}",
             f"  {'unit':<48} {'binary':<20} {'SASS':<14} {'seconds':>8} {'peak MiB':>9} {'cache':>6}  audit"]
    for u in r["units"]:
        c = u["object_cache"]
        cache = "hit" if c.get("hits") and not c.get("misses") else ("miss" if c else "-")
        lines.append(f"  {u['source'][-48:]:<48} {u['binary'][:20]:<20} {' '.join(u['sass']):<14} {u['seconds']:>8.1f} "
                     f"{u['peak_mib']:>9} {cache:>6}  {u['audit']}")
    if p.get("projected_seconds") is not None:
        lines.append(f"  measured: {p['thread_seconds_per_unit']} nvcc thread-seconds per kernel×arch unit, "
                     f"{p['gb_per_nvcc_thread']} GB per nvcc thread → {p['chosen']['why']}")
        lines.append(f"  projected compile on this host: {duration(p['projected_seconds'])} "
                     f"({p['kernel_arch_units']} units on {p['threads']} nvcc threads)")
    t = p["today"]
    lines.append(f"  today's rule: {t['gb_per_nvcc_thread']:g} GB per nvcc thread (engine data) → {t['why'] or '-'}")
    est = r["estimate"]
    if est:
        rel = (p["projected_seconds"] - est["seconds"]) / est["seconds"] * 100 if p.get("projected_seconds") else None
        lines.append(f"  today's estimate: {duration(est['seconds'])} (from {est['from']})"
                     + (f"; the projection is {rel:+.0f} %" if rel is not None else ""))
    else:
        lines.append("  today's estimate: none (no earlier compile of this version in the wheelhouse)")
    if r["objects_to"]:
        lines.append(f"  objects stored in {r['objects_to']}: the build compiles these units from the cache")
    return "\n".join(lines)


@main.command()
@flags.selection
@flags.build(repro=True)
@click.option("--unit", "units", multiple=True, metavar="PATTERN",
              help="Also compile the translation units whose source matches (fnmatch or substring; repeatable). "
                   "Default: the heaviest unit (most SASS targets) of each binary.")
@click.option("--memory", callback=_memory, default=None, metavar="SIZE",
              help="Memory limit of each unit's container (e.g. 4g): rehearse a smaller host.")
@click.option("--keep", is_flag=True, help="Keep the rehearsal's images (builder-rehearse*).")
@click.option("--wheelhouse", "wheelhouse_dir", type=click.Path(file_okay=False), default=None,
              help="The wheelhouse whose earlier compiles give today's estimate (default: wheelhouse/ next to the "
                   "matrix); read only.")
def rehearse(m, sel, flags, units, memory, keep, wheelhouse_dir):
    """Compile real translation units of each package the selected cells compile, with the exact commands,
    flags and archs of the build, in its build stage: seconds, peak memory of nvcc's process tree, kernel×arch
    units and the audit of each object; then the projected compile time of the whole package on this host and
    the MAX_JOBS / NVCC_THREADS the measured memory per nvcc thread gives, beside today's rule and estimate.
    The objects go into the build's object cache.

    \b
    Example:
      builder rehearse --only 'vllm-0.33.0-*' --arch 80,90
      builder rehearse --engine sglang --unit '*flash_fwd_hdim128*' --json
      builder rehearse --only 'vllm-0.33.0-*' --memory 8g      # would 8 GB hosts OOM?
    """
    from .. import docker, epoch, runner
    from ..plan import plan_cells
    from ..resources import Host

    flags = dataclasses.replace(flags, wheelhouse=wheelhouse_dir)
    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    opts = build_options(m, flags, stamp.value)
    runner.check_options(opts)  # --max-jobs 0, a CA bundle that is no file, ...: exit 2 before Docker
    cells = resolve.pin_git_sources(cells, echo=_say)
    host = Host.detect()
    plans = plan_cells(cells, None, history=wheelhouse_at(m.path, flags.wheelhouse), host=host,
                       max_jobs=flags.max_jobs, nvcc_threads=flags.nvcc_threads)
    # what nvcc compiles: a package with no device code (engine data: 0 GB per nvcc thread, e.g. sglang's Rust) is
    # compiled by the build but has no CUDA unit to rehearse
    todo = [(p, w) for p in plans for w in p.wheels
            if w.package.compiled_here and w.package.recipe.mem_gb_per_nvcc_thread > 0]
    if not todo:
        raise UserError("the selected cells compile no CUDA code here (every such package comes from an index): "
                        "nothing to rehearse")
    docker.require_buildx()
    results = [rehearse_package(p, w, opts, host, tuple(units), memory, keep, _say) for p, w in todo]
    if flags.as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        click.echo("\n".join(format_package(r) for r in results))
    bad = [u for r in results for u in r["units"] if not u["audit_ok"]]
    if bad:
        from ..errors import Failed

        raise Failed(f"{len(bad)} unit(s) failed the audit: " + "; ".join(f"{u['source']}: {u['audit']}" for u in bad))


__all__ = ["rehearse", "Path"]
