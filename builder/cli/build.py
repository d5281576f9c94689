"""`builder build` and `builder publish`: publish is build with a typed target (publish.Target), handed to
run_build as an argument (never through the click context) and on to the steps' publish step in BuildOptions,
which it pushes to; one BuildOptions is assembled for both (options.build_options)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from .. import matrix as matrix_mod
from .. import plan as plan_mod
from ..image import publish as pub
from .. import resolve
from ..errors import Failed, UserError
from ..options import BuildFlags, build_options, flag_default, summary, wheel_cache, wheelhouse_at
from . import flags
from .app import SIGNALS, main


def _say(text: str) -> None:
    click.echo(text, err=True)


def run_build(m, sel, flags_: BuildFlags, target: pub.Target | None = None) -> None:
    """Plan, run and report the selected cells; with `target`, push what passed and move the aliases. Raises
    Failed (exit 1, or 128 + the signal when interrupted) once the closing table is printed."""
    from .. import docker, epoch, fanout, lock, report, runner

    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    opts = build_options(m, flags_, stamp.value, publish=target)
    runner.check_options(opts)  # bad input is exit 2 before git hosts or Docker are asked anything
    fanout.check_known(opts.builders, opts.docker)  # an unknown builder or context: exit 2 before anything runs
    _say(summary(m, sel, flags_, target))  # what this run does differently, before any work
    if target is not None and not flags_.dry_run:  # the registry answers, or exit 3 before any work
        pub.check_tools()
        pub.check_registry(target, _say)
    cells = lock.pin_git_sources(cells, echo=_say)
    wheelhouse = wheelhouse_at(m.path, flags_.wheelhouse)
    cache = wheel_cache(m, flags_.wheelhouse, flags_.cache, _say)  # a remote that is down: exit 3 here
    plans = plan_mod.plan_cells(cells, cache, history=wheelhouse, max_jobs=flags_.max_jobs,
                                nvcc_threads=flags_.nvcc_threads, dist_cores=m.defaults["cache"].get("dist_cores", 0))
    if flags_.dry_run:
        if flags_.as_json:  # the same commands, as JSON
            lines: list[str] = []
            runner.dry_run(plans, cache, opts, lines.append)
            click.echo(json.dumps({"dry_run": True, "cells": [p.cell.id for p in plans], "commands": lines}, indent=2))
        else:
            runner.dry_run(plans, cache, opts, click.echo)
        return
    runner.check_pins(plans, opts)
    runner.check_writable(plans, opts, wheelhouse)  # read-only wheelhouse, log dir under a file: exit 2
    docker.require_buildx()
    _say(f"SOURCE_DATE_EPOCH={stamp.value} (from {stamp.origin})")
    outcomes = runner.run_cells(plans, cache, opts, opts.display.say)
    if flags_.as_json:
        click.echo(json.dumps([report.outcome_json(o) for o in outcomes], indent=2))
    else:
        click.echo(report.format_table(outcomes, len(plans)))
    published = _after_publish(m, cells, plans, outcomes, opts, flags_.as_json) if target is not None else None
    if any(o.interrupted for o in outcomes):
        for reason in [r.reason for o in outcomes for r in o.results if r.reason.startswith("interrupted by")]:
            click.secho(f"error: {reason}", fg="red", err=True)
        raise Failed(exit_code=128 + (SIGNALS.received or signal.SIGINT))
    if not all(o.ok for o in outcomes) or len(outcomes) < len(plans) or (published is not None and not published.ok):
        raise Failed()


def _after_publish(m, cells, plans, outcomes, opts, as_json: bool = False):
    """After the runner: aliases (only when every cell was pushed), images.json, the pull lines (on stderr under
    --json, whose stdout is one JSON document)."""
    try:
        every = resolve.select(m, matrix_mod.Selection(profiles=("all",)))
    except UserError:
        every = None
    claims = pub.alias_claims(list(cells), m, every)
    summary = pub.finish(outcomes, plans, opts.publish, claims, _say, epoch=opts.source_date_epoch)
    for line in summary.failed:
        click.secho(f"not published: {line}", fg="red", err=True)
    for line in summary.pulls:
        click.echo(line, err=as_json)
    return summary


@main.command()
@flags.selection
@flags.git_mirrors
@flags.build()
def build(m, sel, flags):
    """Compile every missing wheel of the selected cells with BuildKit, audit it, cache it, then build and
    tag the runtime image.

    Steps per cell: compile (per package; a wheel already in the cache is fetched instead), audit, cache,
    image. A wheel is cached only when its audit passed; the image is tagged only when every wheel passed.
    The closing table is always printed; --json gives every step's result.

    \b
    Example:
      builder build --arch 80,90 --engine sglang
      builder build --only 'vllm-0.33.0-*' --dry-run
      builder build --profile all --keep-going --ca-bundle /etc/ssl/certs/ca-certificates.crt
    """
    run_build(m, sel, flags)


@main.command(short_help="Build, smoke and push images by digest; move aliases.")
@click.option("--registry", default=None, metavar="HOST[:PORT]/PATH",
              help="Where to push: images go to REGISTRY/<engine>:<tag> (default: the matrix's defaults.registry). "
                   "Credentials: BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD (bound to this host, or to "
                   "BUILDER_REGISTRY_HOST when set), else your docker login; sent only when the registry asks.")
@click.option("--images-json", type=flags.FsPath(dir_okay=False), default=None,
              help="The record of published images, updated in place (default: images.json next to the matrix).")
@click.option("--retries", type=flags.Number(0, 99, "a number of retries", integer=True), default=flag_default("retries"), show_default=True,
              help="Retries per registry operation on transient errors (refused/reset connections, timeouts, "
                   "429, 5xx), with exponential backoff from 2 s (at most 60 s).")
@click.option("--no-aliases", is_flag=True,
              help="Push the full tags only; leave ENGINE:VERSION and ENGINE:latest-cuXYZ where they are.")
@click.option("--no-attestations", is_flag=True,
              help="Attach no SBOM and no SLSA provenance (by default both are attached to each pushed digest, "
                   "signed with BUILDER_LEDGER_SIGNING_KEY when it is set; `builder verify` checks them).")
@click.option("--sbom-format", "sbom_formats", multiple=True, type=click.Choice(["spdx", "cyclonedx"]),
              default=("spdx",), show_default=True,
              help="The SBOM's formats (repeatable): SPDX 2.3 always (what builder verify checks); cyclonedx adds "
                   "its CycloneDX 1.5 form (needs the sbom extra: pip install 'builder[sbom]').")
@flags.selection
@flags.git_mirrors
@flags.build()
def publish(m, sel, flags, registry, images_json, retries, no_aliases, no_attestations, sbom_formats):
    """Build every selected cell (wheels from the cache where their keys are there), smoke it, and push the
    images whose smoke passed — by digest: the OCI archive the build exported, the very image smoke ran, is
    copied with its digest preserved to REGISTRY/ENGINE:VERSION-cuXYZ-torchX.Y.Z-py3XX-smA.B. When every cell
    is pushed and the registry serves each digest, the aliases move (ENGINE:VERSION, ENGINE:latest-cuXYZ: the
    cell built with its profile's own archs); a failure anywhere leaves every alias where it was. images.json
    records cell → tag → digest → wheel keys → smoke results; `docker pull REPO@sha256:…` lines are printed.

    \b
    Example:
      builder publish --engine sglang --arch 80,90
      builder publish --only 'vllm-0.33.0-*' --registry registry.example.com/ml --retries 8
      BUILDER_REGISTRY_USER=ci BUILDER_REGISTRY_PASSWORD=... builder publish --profile all --keep-going
    """
    if images_json == "":
        raise UserError("--images-json: an empty path")
    target = pub.make_target(registry if registry is not None else m.defaults["registry"],
                             Path(images_json).resolve() if images_json else m.path.resolve().parent / "images.json",
                             attempts=retries + 1, aliases=not no_aliases, attestations=not no_attestations,
                             cyclonedx="cyclonedx" in sbom_formats)
    if target.cyclonedx:
        if no_attestations:
            raise UserError("--sbom-format cyclonedx attaches an SBOM; --no-attestations attaches none: give one")
        import importlib.util

        if importlib.util.find_spec("cyclonedx") is None:  # refused now, not after the build
            raise UserError("--sbom-format cyclonedx: cyclonedx-python-lib is not installed (pip install "
                            "'builder[sbom]')")
    pub.check_images_json(target.images_json)  # a bad file is found now, not after the push
    # skopeo and the registry are checked once every option is (exit 3 before anything is built)
    run_build(m, sel, flags, target)
