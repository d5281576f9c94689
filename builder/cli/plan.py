"""`builder plan`, `builder render`, `builder matrix`: what the selected cells are, asking no Docker."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import files, resolve
from .. import plan as plan_mod
from .. import render as render_mod
from ..options import wheel_cache, wheelhouse_at
from . import flags
from .app import main


@main.command()
@flags.selection
@flags.wheelhouse
@flags.cache(plan_flag=True)
@flags.as_json
def plan(m, sel, wheelhouse_dir, cache_flags, as_json):
    """Print every selected cell: image tag, packages it compiles, their cache keys, build or reuse.

    Calls no Docker.

    \b
    Example:
      builder plan --profile all
      builder plan --engine sglang --arch 80,90 --json
    """
    from .. import epoch

    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    wheelhouse = wheelhouse_at(m.path, wheelhouse_dir)
    cache = wheel_cache(m, wheelhouse_dir, cache_flags, lambda s: click.echo(s, err=True))
    plans = plan_mod.plan_cells(cells, cache, history=wheelhouse,  # remote look-ups only with --remote
                                dist_cores=m.defaults["cache"].get("dist_cores", 0))
    if as_json:
        click.echo(json.dumps({"cells": [p.to_json() for p in plans], "source_date_epoch": stamp.to_json()}, indent=2))
    else:
        click.echo(plan_mod.format_plan(plans), nl=False)
        click.echo(f"SOURCE_DATE_EPOCH={stamp.value} for every build (reproducible wheels), from {stamp.origin}")


@main.command()
@flags.selection
@click.option("--out", "out_dir", type=flags.FsPath(file_okay=False), default=None,
              help="Write <cell-id>.Dockerfile files here instead of stdout.")
def render(m, sel, out_dir):
    """Render the Dockerfile of each selected cell.

    \b
    Example:
      builder render --only 'vllm-0.33.0-*'
      builder render --profile all --out build/dockerfiles
    """
    plans = plan_mod.plan_cells(resolve.select(m, sel), None)  # keys only: render asks no cache
    texts = [(p.cell, render_mod.render(p, m.defaults["index"])) for p in plans]
    if out_dir is None:
        for i, (cell, text) in enumerate(texts):
            if len(texts) > 1:
                click.echo(f"{'' if i == 0 else chr(10)}# ===== {cell.id} =====")
            click.echo(text, nl=False)
        return
    out = Path(out_dir)
    files.writable_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    for cell, text in texts:
        (out / f"{cell.id}.Dockerfile").write_text(text)
        click.echo(out / f"{cell.id}.Dockerfile")


@main.command("matrix")
@flags.selection
def matrix_cmd(m, sel):
    """The selected cells as JSON for CI (GitHub Actions `strategy.matrix` include shape).

    \b
    Example:
      builder matrix --profile all   # → {"include": [{"cell": ..., "engine": ..., ...}]}
    """
    cells = resolve.select(m, sel)
    runners = m.defaults["runners"]  # cells that compile CUDA code need large runners; smoke needs a GPU
    include = [{"cell": c.id, **c.summary(), "archs": ",".join(map(str, c.archs)),
                "runner": runners["compile" if any(p.may_compile for p in c.packages) else "light"],
                "gpu_runner": runners["gpu"]} for c in cells]
    click.echo(json.dumps({"include": include}))
