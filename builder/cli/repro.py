"""`builder verify-repro CELL`: two builds from nothing, compared. It takes build's own flags (the subset two
builds from nothing can use) and the same BuildOptions (options.build_options)."""

from __future__ import annotations

import json

import click

from .. import files, resolve
from ..errors import Failed, UserError
from ..options import build_options, summary
from . import flags
from .app import main


@main.command("verify-repro")
@click.argument("cell_id", metavar="CELL")
@flags.selection
@flags.git_mirrors
@flags.build(repro=True)
def verify_repro(m, sel, cell_id, flags):
    """Build CELL twice from nothing — an empty wheelhouse and no BuildKit cache each time — and compare every
    wheel's sha256 and the runtime image's digest. Exit 0 when they are identical; exit 1 naming what differs:
    a wheel's zip members, and per image layer the files added, removed or changed (contents, mode, owner, time).

    \b
    Example:
      builder verify-repro cuda-ext-1.0.0-cu130-py311-sm80.90 --matrix tests/fixtures/cuda-ext/matrix.toml
      builder verify-repro vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90 --json
    """
    from .. import docker, epoch, lock, repro, runner

    cells = {c.id: c for c in resolve.select(m, sel)}
    if cell_id not in cells:
        raise UserError(f"{cell_id}: no such cell in {m.path} for this selection; cells: {', '.join(sorted(cells)) or 'none'}")
    stamp = epoch.resolve(m)
    opts = build_options(m, flags, stamp.value, repro=True)
    runner.check_options(opts)
    click.echo(summary(m, sel, flags), err=True)  # what this run does differently, before any work
    files.writable_dir(opts.work_dir, "--work-dir")  # under a file: exit 2 now, not after the first build
    files.writable_dir(opts.log_dir, "--log-dir")
    (cell,) = lock.pin_git_sources([cells[cell_id]], echo=lambda s: click.echo(s, err=True))
    docker.require_buildx()
    click.echo(f"SOURCE_DATE_EPOCH={stamp.value} (from {stamp.origin})", err=True)
    verdict = repro.verify(cell, opts, lambda s: click.echo(s, err=True))
    click.echo(json.dumps(verdict.to_json(), indent=2) if flags.as_json else repro.format_verdict(verdict))
    if not verdict.reproducible:
        raise Failed()
