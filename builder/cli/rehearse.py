"""`builder rehearse`: compile a few real translation units of each package the selected cells compile, exactly
as `builder build` would, and measure them — minutes before the hours. This module parses the options and prints;
`rehearse.run` (builder/rehearse.py) does the work."""

from __future__ import annotations

import dataclasses
import json

import click

from .. import rehearse as rh
from ..errors import Failed
from ..progress import duration
from . import flags
from .app import main


def _say(text: str) -> None:
    click.echo(text, err=True)


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
    c = r.get("compile") or {}
    spread = {}
    for u in r["units"]:
        for server, n in (u["object_cache"].get("distributed") or {}).items():
            spread[server] = spread.get(server, 0) + n
    if c.get("jobs", 1) > 1 or c.get("dist"):
        lines.append(f"  compiled {len(r['units'])} unit(s), {c['jobs']} at once, in {c['wall_seconds']:.1f}s"
                     + (f" through {c['dist']}: " + (", ".join(f"{k} {v} steps" for k, v in sorted(spread.items()))
                                                      or "no step ran on a build server") if c.get("dist") else ""))
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
@flags.git_mirrors
@flags.build(repro=True)
@click.option("--unit", "units", multiple=True, metavar="PATTERN",
              help="Also compile the translation units whose source matches (fnmatch or substring; repeatable). "
                   "Default: the heaviest unit (most SASS targets) of each binary.")
@click.option("--memory", type=flags.Number(6 << 20, 4 << 40, "a memory size", scale=True),
              default=None, metavar="SIZE",
              help="Memory limit of each unit's container (e.g. 4g): rehearse a smaller host.")
@click.option("--parallel", type=flags.Number(1, 256, "a count of units", integer=True), default=1, metavar="N",
              help="Compile N of the chosen units at once, each in its own container (default 1: each alone on "
                   "the host). With [defaults.cache] dist the units compile through that sccache-dist farm, as the "
                   "build's would: give N its slots.")
@click.option("--keep", is_flag=True, help="Keep the rehearsal's images (builder-rehearse*).")
@click.option("--wheelhouse", "wheelhouse_dir", type=flags.FsPath(file_okay=False), default=None,
              help="The wheelhouse whose earlier compiles give today's estimate (default: wheelhouse/ next to the "
                   "matrix); read only.")
def rehearse(m, sel, flags, units, memory, parallel, keep, wheelhouse_dir):
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
      builder rehearse --engine sglang --parallel 3            # 3 units at once ([defaults.cache] dist: a farm)
    """
    flags = dataclasses.replace(flags, wheelhouse=wheelhouse_dir)
    results = rh.run(m, sel, flags, tuple(units), memory, keep, _say, parallel)
    if flags.as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        click.echo("\n".join(format_package(r) if "failed" not in r else
                              f"{r['cell']} {r['package']} {r['version']}: its build stage failed: {r['failed']} "
                              f"(log {r['log']})" for r in results))
    stopped = [r for r in results if "failed" in r]
    bad = [u for r in results for u in r.get("units", ()) if not u["audit_ok"]]
    if stopped or bad:
        raise Failed("; ".join([*(f"{r['package']}: its build stage failed" for r in stopped),
                                *([f"{len(bad)} unit(s) failed the audit: " + "; ".join(
                                    f"{u['source']}: {u['audit']}" for u in bad)] if bad else [])]))

