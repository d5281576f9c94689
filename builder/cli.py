"""The `builder` command line. Errors are caught once here: a message and the error's exit code."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import traceback
from dataclasses import asdict
from functools import wraps
from pathlib import Path

import click

from . import __version__
from . import archs as archs_mod
from . import files, grammar, net
from . import matrix as matrix_mod
from . import plan as plan_mod
from . import render as render_mod
from . import resolve
from .errors import EXIT_ENVIRONMENT, EXIT_FAILED, BuilderError, Interrupted, UserError
from .globs import Glob

EXIT_CODES_HELP = """\b
Exit codes (the same for every verb):
  0  all ok
  1  a cell failed (compile, audit, image) or a check failed
  2  bad input, refused before anything ran
  3  the environment is missing or unreachable (no Docker daemon, no buildx, registry or index down)
  130/143  interrupted by SIGINT/SIGTERM (the running docker child is stopped and waited for)"""


class BuilderCommand(click.Command):
    """Every verb's --help ends with the exit codes."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        super().__init__(*args, **kwargs)


class BuilderGroup(click.Group):
    """Turns BuilderError into a clean message + exit code; --debug keeps the traceback."""

    command_class = BuilderCommand

    def invoke(self, ctx):
        try:
            with _SIGNALS:
                return super().invoke(ctx)
        except BuilderError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                click.echo(net.redact(traceback.format_exc()), err=True)  # the same exit code, with the traceback
            click.secho(f"error: {net.redact(str(exc))}", fg="red", err=True)  # no user:password@ of a URL
            ctx.exit(exc.exit_code)
        except OSError as exc:  # a filesystem fault no check foresaw: the path and the OS's words, not a traceback
            if ctx.obj and ctx.obj.get("debug"):
                click.echo(net.redact(traceback.format_exc()), err=True)
            paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
            click.secho(f"error: {paths + ': ' if paths else ''}{exc.strerror or exc}", fg="red", err=True)
            ctx.exit(EXIT_FAILED)
        except KeyboardInterrupt as exc:  # outside a build step (a step's interrupt is in the closing table)
            signum = getattr(exc, "signum", signal.SIGINT)
            click.secho(f"error: interrupted by {signal.Signals(signum).name}", fg="red", err=True)
            ctx.exit(128 + signum)


class _SignalHandlers:
    """While a verb runs, SIGINT and SIGTERM (what CI runners and `timeout` send) raise Interrupted: the
    running docker child is stopped (builder/docker.py), the closing table printed, and the exit code is
    128 + the signal (130, 143). The previous handlers come back afterwards."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        self.received = signum
        raise Interrupted(signum)

    def __enter__(self):
        self.received = None
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False


_SIGNALS = _SignalHandlers()


def wheelhouse_option(f):
    return click.option("--wheelhouse", "wheelhouse_dir", type=click.Path(file_okay=False), default=None,
                        help="Local wheel cache (default: wheelhouse/ next to the matrix file).")(f)


def _checked(wh):
    """A wheelhouse whose path is a directory or can become one (not a file, nor under one)."""
    for p in (wh.root, *wh.root.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise UserError(f"--wheelhouse: {wh.root}" + (" is a file" if p == wh.root else f": {p} is a file")
                                + ", not a directory")
            break
    return wh


def _wheelhouse(m, wheelhouse_dir):
    from .cache.local import Wheelhouse

    return _checked(Wheelhouse(Path(wheelhouse_dir)) if wheelhouse_dir else plan_mod.default_wheelhouse(m.path))


def _wheelhouse_at(matrix_path, wheelhouse_dir):
    """The wheelhouse for verbs that need no cells: --wheelhouse, else wheelhouse/ next to the matrix file."""
    from .cache.local import Wheelhouse

    return _checked(Wheelhouse(Path(wheelhouse_dir)) if wheelhouse_dir else plan_mod.default_wheelhouse(Path(matrix_path)))


_CACHE_FLAGS = "builder.cache_flags"


def cache_options(plan_flag: bool = False):
    """--cache-remote / --no-remote (and for plan --remote): which remote wheel stores a verb uses. The flags
    are kept in the click context, so `_cache` finds them without every verb passing them along."""

    def decorate(f):
        @click.option("--cache-remote", "cache_remotes", multiple=True, metavar="SPEC",
                      help="A remote wheel store, replacing [defaults.cache] remotes (repeatable): registry (the "
                           "matrix's registry + /wheels), registry:HOST[:PORT]/REPO or index:URL.")
        @click.option("--no-remote", is_flag=True, help="The local wheelhouse only: no registry or index look-ups or pushes.")
        @wraps(f)
        def wrapper(*args, cache_remotes, no_remote, look_remote=False, **kwargs):
            click.get_current_context().meta[_CACHE_FLAGS] = (tuple(cache_remotes), no_remote,
                                                              look_remote or bool(cache_remotes) or not plan_flag)
            return f(*args, **kwargs)

        if plan_flag:
            wrapper = click.option("--remote", "look_remote", is_flag=True,
                                   help="Also look each wheel up in the remote stores (network): local hit / remote "
                                        "hit (pull) / build. Without it plan asks only the local wheelhouse.")(wrapper)
        return wrapper

    return decorate


def _cache(m, wheelhouse_dir):
    """The wheel cache of a verb: the wheelhouse, in front of the remote stores its flags or the matrix select."""
    from .cache.config import selected_remotes
    from .cache.tiered import cache_for

    ctx = click.get_current_context(silent=True)
    flags, no_remote, use = ctx.meta.get(_CACHE_FLAGS, ((), False, True)) if ctx else ((), False, True)
    specs = selected_remotes(m.defaults["cache"]["remotes"], flags, no_remote, m.defaults["registry"])
    return cache_for(_wheelhouse(m, wheelhouse_dir), specs if use else (), lambda s: click.echo(s, err=True))


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v.strip() for val in values for v in val.split(",") if v.strip())


def selection_options(f):
    """Selectors shared by every verb that works on cells."""

    @click.option("--matrix", "matrix_path", default="matrix.toml", show_default=True, type=click.Path(dir_okay=False),
                  help="The matrix file.")
    @click.option("--engine", multiple=True, help="Only cells of this engine (repeat or comma-separate).")
    @click.option("--arch", "arch", default=None, help="SM archs for every selected cell, e.g. 80,90.")
    @click.option("--cuda", multiple=True, help="Only profiles of this CUDA version (13.0, 13.0.3 or cu130).")
    @click.option("--profile", multiple=True, help="Profiles to use (default: the matrix's default; 'all' for every one).")
    @click.option("--only", multiple=True, help="Glob(s) on cell ids to keep, e.g. 'vllm-*' or '*-{cu121,cu130}-*'.")
    @click.option("--skip", multiple=True, help="Glob(s) on cell ids to drop.")
    @click.option("--base-devel", default=None, help="Devel base image for every selected cell (a mirror or a local base).")
    @click.option("--base-runtime", default=None, help="Runtime base image for every selected cell.")
    @wraps(f)
    def wrapper(*args, matrix_path, engine, arch, cuda, profile, only, skip, base_devel, base_runtime, **kwargs):
        for flag, value in (("--base-devel", base_devel), ("--base-runtime", base_runtime)):
            if value is not None:
                grammar.check(grammar.image_ref, value, flag)
        for flag, globs in (("--only", only), ("--skip", skip)):
            for pattern in globs:
                Glob(pattern, flag)  # a malformed glob is refused here, before the matrix is read
        sel = matrix_mod.Selection(
            engines=_split(engine),
            archs=archs_mod.parse(arch) if arch is not None else None,
            cuda=_split(cuda),
            profiles=_split(profile),
            only=tuple(only),
            skip=tuple(skip),
            base_devel=base_devel,
            base_runtime=base_runtime,
        )
        m = matrix_mod.load(Path(matrix_path))
        return f(*args, m=m, sel=sel, **kwargs)

    return wrapper


@click.group(cls=BuilderGroup, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="builder")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def main(ctx, debug):
    """Build vLLM / SGLang images whose GPU code is compiled from source for the archs you ask for,
    prove it, and publish them.

    \b
    Example:
      builder plan                          # every cell of the default profile
      builder render --profile all --out build/dockerfiles
      builder build --arch 80,90 --engine sglang

    With --debug every docker / skopeo / git command line is printed before it runs, and errors keep
    their traceback.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    net.check_environment()  # BUILDER_REMOTE_TIMEOUT=nan and the like: exit 2 before any verb works
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s", stream=sys.stderr)
        for handler in logging.getLogger().handlers:  # no user:password@ of a URL in a debug line either
            handler.addFilter(net.RedactingFilter())


@main.command()
@selection_options
@wheelhouse_option
@cache_options(plan_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(m, sel, wheelhouse_dir, as_json):
    """Print every selected cell: image tag, packages it compiles, their cache keys, build or reuse.

    Calls no Docker.

    \b
    Example:
      builder plan --profile all
      builder plan --engine sglang --arch 80,90 --json
    """
    from . import epoch

    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    wheelhouse = _wheelhouse(m, wheelhouse_dir)
    plans = plan_mod.plan_cells(cells, _cache(m, wheelhouse_dir), history=wheelhouse,  # remote look-ups only with --remote
                                dist_cores=m.defaults["cache"].get("dist_cores", 0))
    if as_json:
        click.echo(json.dumps({"cells": [p.to_json() for p in plans], "source_date_epoch": stamp.to_json()}, indent=2))
    else:
        click.echo(plan_mod.format_plan(plans), nl=False)
        click.echo(f"SOURCE_DATE_EPOCH={stamp.value} for every build (reproducible wheels), from {stamp.origin}")


@main.command()
@selection_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
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
@selection_options
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


_BUILD_HOST = "builder.build_host"


def build_host_options(f):
    """--builder / --layer-cache / --provenance: where BuildKit builds and what it shares. Kept in the click
    context (like cache_options), so `_build_host` finds them without every verb passing them along."""

    @click.option("--builder", "buildx_builder", default=None, metavar="NAME",
                  help="The buildx builder to build on (`docker buildx ls`; a docker context name is one): another "
                       "machine, a remote BuildKit. Default: the current one.")
    @click.option("--layer-cache", default=lambda: os.environ.get("BUILDER_LAYER_CACHE"), metavar="REPO",
                  help="Share BuildKit's layer cache through a registry repository (--cache-from/--cache-to "
                       "type=registry, mode=max): 'registry' is the matrix's registry + /buildcache. Env: BUILDER_LAYER_CACHE.")
    @click.option("--provenance", is_flag=True,
                  help="Attach BuildKit's SLSA provenance attestation (mode=max) to the runtime image. It holds build "
                       "times, so an attested image's digest differs per build; the image manifest itself does not.")
    @wraps(f)
    def wrapper(*args, buildx_builder, layer_cache, provenance, **kwargs):
        click.get_current_context().meta[_BUILD_HOST] = (buildx_builder, layer_cache, provenance)
        return f(*args, **kwargs)

    return wrapper


def _build_host(m) -> dict:
    """BuildOptions fields from build_host_options (and, under `builder publish`, its target)."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx else {}
    builder, layer_cache, provenance = meta.get(_BUILD_HOST, (None, None, False))
    if builder is not None:
        grammar.check(grammar.path_argument, builder, "--builder")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", builder):
            raise UserError(f"--builder: {builder!r} is not a builder name (letters, digits, '_', '.', '-')")
    if layer_cache == "registry":
        layer_cache = f"{m.defaults['registry']}/buildcache"
    if layer_cache:
        grammar.check(grammar.image_name, layer_cache, "--layer-cache")
        port = re.match(r"[^/:]+:([0-9]+)/", layer_cache)
        if "/" not in layer_cache or (port and not 0 < int(port.group(1)) < 65536):
            raise UserError(f"--layer-cache: {layer_cache!r} is not a registry repository HOST[:PORT]/PATH "
                            "(port 1-65535)")
    from .publish import META

    return {"builder": builder, "layer_cache": layer_cache or None,
            "attest": ("type=provenance,mode=max",) if provenance else (), "publish": meta.get(META)}


@main.command()
@selection_options
@wheelhouse_option
@click.option("--dry-run", is_flag=True, help="Print the exact buildx commands; run nothing.")
@click.option("--keep-going", is_flag=True,
              help="After a failure go on: the failed cell's other wheels are still compiled and cached, then the next cells.")
@click.option("--max-jobs", type=int, default=None, help="Override MAX_JOBS (default: from cores and free RAM).")
@click.option("--nvcc-threads", type=int, default=None, help="Override NVCC_THREADS.")
@click.option("--ca-bundle", type=click.Path(dir_okay=False), default=lambda: os.environ.get("BUILDER_CA_BUNDLE"),
              help="CA bundle for HTTPS inside the build, passed as a BuildKit secret (never a layer). Env: BUILDER_CA_BUNDLE.")
@click.option("--allow-unpinned", is_flag=True, help="Build git sources known only by tag (the lock could not resolve a commit).")
@click.option("--log-dir", type=click.Path(file_okay=False), default="logs", show_default=True, help="One log file per cell.")
@click.option("--work-dir", type=click.Path(file_okay=False), default="build", show_default=True,
              help="Rendered Dockerfiles, exported wheels before they enter the wheelhouse, BuildKit metadata.")
@click.option("--pins-dir", type=click.Path(file_okay=False), default=None,
              help="Where runtime-pins/<cell>.txt files live (default: runtime-pins/ next to the matrix).")
@click.option("--refresh-pins", is_flag=True,
              help="Resolve the runtime's pure-Python dependencies again instead of using runtime-pins/<cell>.txt.")
@click.option("--no-cache", is_flag=True, help="Ignore BuildKit's layer cache (wheels already in the wheelhouse are still reused).")
@click.option("--no-smoke", is_flag=True,
              help="Skip the smoke step (shown skipped in the table and --json; nothing of the cell can then be published).")
@click.option("--smoke-model", default="tiny", show_default=True,
              help="What the smoke step serves: a local checkpoint directory, or 'tiny' (generated, dummy weights).")
@click.option("--progress", "progress_mode", type=click.Choice(["auto", "tty", "plain", "quiet", "raw"]), default="auto",
              show_default=True,
              help="Compile progress: tty = one updating line per compile (objects done/total, elapsed, ETA); plain = "
                   "a status line at most every 60 s (CI; GitHub Actions log groups); quiet = step lines only; raw = "
                   "the build output itself. auto: tty on a terminal, else plain. The full output is always in the log.")
@click.option("--quiet", is_flag=True, help="Same as --progress quiet: only step lines and the closing table.")
@cache_options()
@build_host_options
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON: per cell, every step's result.")
def build(m, sel, wheelhouse_dir, dry_run, keep_going, max_jobs, nvcc_threads, ca_bundle, allow_unpinned, log_dir, work_dir,
          pins_dir, refresh_pins, no_cache, progress_mode, quiet, as_json, no_smoke=False, smoke_model="tiny"):
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
    from . import docker, epoch, pins, report, runner
    from .progress import Display
    from .steps import BuildOptions

    if ca_bundle == "":
        raise UserError("--ca-bundle (or BUILDER_CA_BUNDLE): an empty path; leave it out for no CA bundle")
    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    opts = BuildOptions(
        work_dir=Path(work_dir).resolve(),
        log_dir=Path(log_dir).resolve(),
        index_url=m.defaults["index"],
        dry_run=dry_run,
        keep_going=keep_going,
        max_jobs=max_jobs,
        nvcc_threads=nvcc_threads,
        ca_bundle=Path(ca_bundle).resolve() if ca_bundle else None,
        allow_unpinned=allow_unpinned,
        source_date_epoch=stamp.value,
        pins_dir=Path(pins_dir).resolve() if pins_dir else m.path.resolve().parent / pins.DIR_NAME,
        refresh_pins=refresh_pins,
        no_cache=no_cache,
        smoke=not no_smoke,
        smoke_model=smoke_model,
        display=Display("quiet" if quiet else progress_mode),
        compile_cache=m.defaults["cache"].get("compile"),
        compile_dist=m.defaults["cache"].get("dist"),
        compile_dist_cores=m.defaults["cache"].get("dist_cores", 0),
        **_build_host(m),
    )
    runner.check_options(opts)  # bad input is exit 2 before git hosts or Docker are asked anything
    if opts.publish is not None and not dry_run:  # `builder publish`: the registry answers, or exit 3 before any work
        from . import publish as publish_mod

        publish_mod.check_tools()
        publish_mod.check_registry(opts.publish, lambda s: click.echo(s, err=True))
    cells = resolve.pin_git_sources(cells, echo=lambda s: click.echo(s, err=True))
    wheelhouse = _wheelhouse(m, wheelhouse_dir)
    cache = _cache(m, wheelhouse_dir)  # the wheelhouse in front of the remote stores; a remote that is down: exit 3 here
    plans = plan_mod.plan_cells(cells, cache, history=wheelhouse, max_jobs=max_jobs, nvcc_threads=nvcc_threads,
                                dist_cores=m.defaults["cache"].get("dist_cores", 0))
    if dry_run:
        if as_json:  # the same commands, as JSON
            lines: list[str] = []
            runner.dry_run(plans, cache, opts, lines.append)
            click.echo(json.dumps({"dry_run": True, "cells": [p.cell.id for p in plans], "commands": lines}, indent=2))
        else:
            runner.dry_run(plans, cache, opts, click.echo)
        return
    runner.check_pins(plans, opts)
    runner.check_writable(plans, opts, _wheelhouse(m, wheelhouse_dir))  # read-only wheelhouse, log dir under a file: exit 2
    docker.require_buildx()
    click.echo(f"SOURCE_DATE_EPOCH={stamp.value} (from {stamp.origin})", err=True)
    outcomes = runner.run_cells(plans, cache, opts, opts.display.say)
    if as_json:
        click.echo(json.dumps([report.outcome_json(o) for o in outcomes], indent=2))
    else:
        click.echo(report.format_table(outcomes, len(plans)))
    published = None
    if opts.publish is not None:  # `builder publish`: the aliases, images.json, the pull lines (builder/release.py)
        from .release import after_publish

        published = after_publish(m, cells, plans, outcomes, opts)
    if any(o.interrupted for o in outcomes):
        signum = _SIGNALS.received or signal.SIGINT
        for reason in [r.reason for o in outcomes for r in o.results if r.reason.startswith("interrupted by")]:
            click.secho(f"error: {reason}", fg="red", err=True)
        sys.exit(128 + signum)
    if not all(o.ok for o in outcomes) or len(outcomes) < len(plans) or (published is not None and not published.ok):
        sys.exit(EXIT_FAILED)


@main.group(cls=BuilderGroup, epilog=EXIT_CODES_HELP)
def wheels():
    """The wheel cache: list, verify and prune the entries of the local wheelhouse; push them to and pull them
    from the remote stores (an OCI registry, a PEP 503 index: [defaults.cache] or --cache-remote).

    \b
    Example:
      builder wheels ls
      builder wheels verify --quarantine
      builder wheels prune --unused --profile all --dry-run
      builder wheels push --engine vllm --cache-remote registry
      builder wheels pull --profile all
    """


@wheels.command("ls")
@click.option("--matrix", "matrix_path", default="matrix.toml", show_default=True, type=click.Path(dir_okay=False))
@wheelhouse_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def wheels_ls(matrix_path, wheelhouse_dir, as_json):
    """Every entry: package, version, key, audited archs, size, where, when built.

    \b
    Example:
      builder wheels ls --json
    """
    from .cache import inventory

    wh = _wheelhouse_at(matrix_path, wheelhouse_dir)
    found = inventory.entries(wh)
    if as_json:
        click.echo(json.dumps([e.to_json() for e in found], indent=2))
        return
    for e in found:
        archs = ",".join(map(str, e.archs)) or "?"
        click.echo(f"{e.package + '==' + e.version:<28} key {e.key[:16]}  sm {archs:<10} {e.bytes / 1e6:9.1f} MB  "
                   f"{e.built_at:<20}  {e.path}")
    click.echo(f"{len(found)} entries in {wh.root}")


@wheels.command("verify")
@click.option("--matrix", "matrix_path", default="matrix.toml", show_default=True, type=click.Path(dir_okay=False))
@wheelhouse_option
@click.option("--quarantine", "move_aside", is_flag=True, help="Move bad entries to wheelhouse/.quarantine/.")
def wheels_verify(matrix_path, wheelhouse_dir, move_aside):
    """Check every entry: each file's sha256 and size against its manifest, then the audit again for the
    archs it was built for. Exit 1 naming the bad ones.

    \b
    Example:
      builder wheels verify
      builder wheels verify --quarantine
    """
    from .cache import inventory

    wh = _wheelhouse_at(matrix_path, wheelhouse_dir)
    bad = 0
    found = inventory.entries(wh)
    for e in found:
        why = inventory.verify(wh, e)
        if not why:
            click.echo(f"ok   {e.package}=={e.version} {e.key[:16]}")
            continue
        bad += 1
        where = inventory.quarantine(wh, e, why) if move_aside else ""
        kept = " (left where it is: builder moves only its own entries)" if move_aside and not where else ""
        click.echo(f"BAD  {e.package}=={e.version} {e.key[:16]}: {why}" + (f" (moved to {where})" if where else kept))
    click.echo(f"{len(found) - bad} of {len(found)} entries verified")
    if bad:
        sys.exit(EXIT_FAILED)


@wheels.command("prune")
@selection_options
@wheelhouse_option
@click.option("--unused", is_flag=True, help="Remove entries whose key no selected cell uses (select with --profile all).")
@click.option("--older-than", type=float, default=None, help="Remove entries built more than this many days ago.")
@click.option("--leftovers", is_flag=True, help="Remove quarantined entries and temporary directories of dead builds.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def wheels_prune(m, sel, wheelhouse_dir, unused, older_than, leftovers, dry_run):
    """Remove entries no cell needs any more.

    \b
    Example:
      builder wheels prune --unused --profile all --dry-run
      builder wheels prune --older-than 30 --leftovers
    """
    from .cache import inventory

    if not (unused or older_than is not None or leftovers):
        raise UserError("wheels prune: say what to remove: --unused, --older-than DAYS and/or --leftovers")
    if older_than is not None and not 0 <= older_than <= 100_000:  # NaN fails both comparisons
        raise UserError(f"--older-than: {older_than:g} is not a number of days from 0 to 100000")
    wh = _wheelhouse(m, wheelhouse_dir)
    used = ({k for p in plan_mod.plan_cells(resolve.select(m, sel), None) for w in p.wheels
             for k in w.keys_in_use(p.cell)} if unused else None)
    doomed = [(e.path, why) for e, why in inventory.prunable(wh, used, older_than)]
    if leftovers:
        doomed += [(p, "quarantined or left by an interrupted store") for p in inventory.leftovers(wh)]
    for path, why in doomed:
        click.echo(f"{'would remove' if dry_run else 'remove'} {path}: {why}")
        if not dry_run:
            inventory.remove(path)
    click.echo(f"{len(doomed)} {'would be ' if dry_run else ''}removed")


def _sync_targets(m, sel, cache, keys):
    """What `wheels push` / `wheels pull` move: --key entries, else the selected cells' wheels."""
    from .cache import sync
    from .cache.tiered import TieredCache

    if not isinstance(cache, TieredCache):
        raise UserError("no remote wheel store: add remotes to [defaults.cache] in the matrix or pass --cache-remote "
                        "(e.g. --cache-remote registry or --cache-remote index:http://127.0.0.1:8080/simple)")
    if keys:
        known = sync.from_plans(plan_mod.plan_cells(resolve.select(m, matrix_mod.Selection(profiles=("all",))), None))
        return sync.from_keys(keys, cache, known)
    return sync.from_plans(plan_mod.plan_cells(resolve.select(m, sel), None))


@wheels.command("push")
@selection_options
@wheelhouse_option
@cache_options()
@click.option("--key", "keys", multiple=True, help="Push this entry (its key, 8+ leading hex characters, or PACKAGE:KEY) "
                                                   "instead of the selected cells' wheels; repeatable.")
@click.option("--force", is_flag=True, help="Push even where a remote already holds a good copy.")
def wheels_push(m, sel, wheelhouse_dir, keys, force):
    """Push wheelhouse entries to every remote store that takes pushes: each file is verified against its
    manifest first, an entry a remote already holds is skipped, and where it went (e.g. the registry
    artifact's digest) is recorded in the local manifest. Exit 1 when a local entry is bad.

    \b
    Example:
      builder wheels push --cache-remote registry                # the default profile's wheels
      builder wheels push --key 3f1c2a9b --cache-remote index:http://127.0.0.1:8080/simple
    """
    from .cache import sync

    cache = _cache(m, wheelhouse_dir)
    targets = _sync_targets(m, sel, cache, keys)
    if not any(r.push_enabled for r in cache.remotes):
        raise UserError("wheels push: every selected remote store is pull-only (push = false)")
    pushed, failed = sync.push(cache, targets, force, click.echo)
    click.echo(f"{pushed} pushed, {failed} bad, of {len(targets)} entries")
    if failed:
        sys.exit(EXIT_FAILED)


@wheels.command("pull")
@selection_options
@wheelhouse_option
@cache_options()
@click.option("--key", "keys", multiple=True, help="Pull this entry (its key, 8+ leading hex characters, or "
                                                   "PACKAGE:KEY) instead of the selected cells' wheels; repeatable.")
def wheels_pull(m, sel, wheelhouse_dir, keys):
    """Pull the selected cells' wheels (or --key entries) from the remote stores into the wheelhouse: every
    hash is verified against the manifest before an entry is written. A bad remote copy is reported and left
    where it is. Exit 1 when a remote copy was bad or a --key entry is in no remote.

    \b
    Example:
      builder wheels pull --engine vllm --cache-remote registry
      builder wheels pull --key cuda-ext:3f1c2a9b
    """
    from .cache import sync

    cache = _cache(m, wheelhouse_dir)
    targets = _sync_targets(m, sel, cache, keys)
    pulled, missing, bad = sync.pull(cache, targets, click.echo)
    click.echo(f"{pulled} pulled, {missing} in no remote, {bad} bad, of {len(targets)} entries")
    if bad or (keys and missing):
        sys.exit(EXIT_FAILED)


@main.command("audit")
@click.argument("target")
@click.option("--arch", "arch", required=True, help="SM archs every binary must run on, e.g. 80,90.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--verbose", "-v", is_flag=True, help="List binaries without device code too.")
@click.option("--allow-no-device-code", is_flag=True,
              help="Pass a target in which no binary carries device code (a pure-Python wheel); by default that "
                   "proves nothing and fails.")
@click.option("--package", "packages", multiple=True, metavar="NAME==VERSION",
              help="Apply the engine data's arch scopes of this package (libraries built for some arch families "
                   "only, e.g. vLLM's FA3); an image built by builder gets its packages' scopes from its labels.")
def audit_cmd(target, arch, as_json, verbose, allow_no_device_code, packages):
    """List SASS archs and PTX of every .so in a WHEEL, IMAGE or DIR; exit 1 naming the file and the
    missing arch when a requested arch is covered neither by SASS nor by JIT-able PTX, and exit 1 when no
    binary carries device code at all (nothing proven; --allow-no-device-code for a pure-Python target).
    A corrupt or unreadable input (a bad CRC, a file that cannot be read) is exit 2, naming the file.

    Reads the ELF .nv_fatbin section in Python: no CUDA toolkit needed.

    \b
    Example:
      builder audit wheelhouse/ --arch 80,90
      builder audit flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl --arch 90
      builder audit 127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90 --arch 80,90
      builder audit vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl --arch 80,90 --package vllm==0.33.0
    """
    from . import docker
    from .audit import audit, audit_image, format_report
    from .engines import load_knowledge

    archs = list(archs_mod.parse(arch))
    if not target.strip():  # Path("") is the current directory: never audit that by accident
        raise UserError("audit: an empty target; give a wheel, a .so, a directory or an image")
    grammar.check(grammar.path_argument, target, "audit")
    wanted = []
    for spec in packages:
        name, sep, version = spec.partition("==")
        if not sep or not name or not version:
            raise UserError(f"--package: {spec!r} is not NAME==VERSION, e.g. vllm==0.33.0")
        grammar.check(grammar.version, version, f"--package {name}")
        wanted.append((name, version))

    def scopes_of(pairs) -> list:
        kn = load_knowledge()
        try:
            return [s for name, version in pairs for s in kn.recipe(name, version).arch_scoped]
        except UserError as exc:
            raise UserError(f"--package: {exc}") from None

    if Path(target).exists() or Path(target).is_symlink():
        report = audit(target, archs, scopes_of(wanted))
    else:
        try:
            grammar.image_ref(target)
        except ValueError:  # neither a path nor an image: refused without asking Docker
            raise UserError(f"{target}: no such file, directory or local image (and not an image reference)") from None
        if not docker.image_exists(target):  # exit 3 when the daemon does not answer
            raise UserError(f"{target}: no such file, directory or local image (pull the image first)")
        if not wanted:  # an image builder made names its packages in its labels
            labels = docker.image_labels(target) or {}
            found = sorted((k.split(".")[3], v) for k, v in labels.items()
                           if k.startswith("io.builder.package.") and k.endswith(".version") and k.count(".") == 4)
            kn = load_knowledge()
            known = set(kn.data["packages"])
            wanted = [(n, v) for n, v in found if n in known]
            if wanted and not as_json:
                click.echo(f"arch scopes from the engine data of {', '.join(f'{n} {v}' for n, v in wanted)} "
                           "(the image's io.builder labels)")
        report = audit_image(target, archs, scopes_of(wanted))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(format_report(report, verbose=verbose))
    if report.errors:
        raise UserError(f"audit: {len(report.errors)} of {len(report.binaries)} binaries could not be read: "
                        + "; ".join(b.error for b in report.errors[:3]) + (" ..." if len(report.errors) > 3 else ""))
    if not report.ok:
        sys.exit(EXIT_FAILED)
    if not report.has_device_code and not allow_no_device_code:
        click.secho(f"error: audit: nothing proven: no binary in {target} carries device code "
                    "(--allow-no-device-code for a pure-Python target)", fg="red", err=True)
        sys.exit(EXIT_FAILED)


@main.command()
@selection_options
@click.option("--index", "index_url", default=None, help="PEP 691 index to read (default: the matrix's defaults.index).")
@click.option("--check", is_flag=True, help="Do not write: exit 1 if matrix.lock is out of date.")
def lock(m, sel, index_url, check):
    """Read each engine's own published metadata (torch pin, companion pins, sdist sha256) into matrix.lock.

    Without selectors every profile is locked; --profile / --engine / --cuda refresh only those packages and
    keep the other entries. Locking is per package: --arch, --only and --skip do not apply.

    \b
    Example:
      builder lock                 # rewrite matrix.lock
      builder lock --engine vllm   # refresh the vLLM entries only
      builder lock --check         # CI: fail when matrix.toml changed without a new lock
    """
    from .lock import LOCK_NAME, Lock, comparable, run_lock

    if sel.archs or sel.only or sel.skip or sel.base_devel or sel.base_runtime:
        raise UserError("lock: --arch, --only, --skip and --base-* select cells; lock works per package "
                        "(use --profile, --engine or --cuda)")
    if index_url is not None:
        grammar.check(grammar.index_url, index_url, "--index")
    profiles = matrix_mod.selected_profiles(m, sel, default_all=True)
    old = Lock.load(resolve.lock_path(m))
    lock_path = old.path
    partial = bool(sel.profiles or sel.engines or sel.cuda)
    start = {**old.data, "packages": dict(old.data.get("packages", {}))} if partial else {"format": old.data.get("format", 1), "packages": {}}
    fresh = run_lock(m.raw, Lock(lock_path, start), index_url or m.defaults["index"],
                     echo=lambda s: click.echo(s, err=True), kn=m.knowledge,
                     profiles=tuple(p.name for p in profiles), engines=sel.engines)
    from .lock import lock_base_images

    lock_base_images(fresh, [ref for p in profiles for ref in resolve.base_refs(m, p).values()],
                     echo=lambda s: click.echo(s, err=True))  # FROM name@sha256:... in every rendered Dockerfile
    if check:
        if comparable(fresh.data) != comparable(old.data):
            raise BuilderError(f"{LOCK_NAME} is out of date: run `builder lock`")
        click.echo(f"{LOCK_NAME} is up to date")
        return
    fresh.write()
    click.echo(f"wrote {lock_path}")


@main.command()
@click.argument("images", nargs=-1)
@click.option("--registry", default=None, help="Registry host[:port] to check (default: the matrix's).")
@click.option("--matrix", "matrix_path", default="matrix.toml", show_default=True, type=click.Path(dir_okay=False))
@click.option("--host", "host_mode", is_flag=True,
              help="Will IMAGE... run on this host's GPUs (driver, CUDA, device code)? Nothing is pulled.")
@click.option("--gpus-file", default=None, help="With --host: judge the GPUs of a JSON file instead of nvidia-smi's.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(images, registry, matrix_path, host_mode, gpus_file, as_json):
    """Check this host: docker, buildx, BuildKit, registry, GPUs and driver — and how to fix what is missing.
    With --host: per GPU and image, runs / runs with the forward-compatibility package / refused, with the rule.

    \b
    Example:
      builder doctor
      builder doctor --registry 127.0.0.1:5000 --json
      builder doctor --host registry.example.com/ml/vllm@sha256:... image.json
    """
    if host_mode:
        from .host import command as host_command

        sys.exit(host_command(images, gpus_file, as_json, click.echo))
    if images or gpus_file:
        raise UserError("IMAGE... and --gpus-file go with --host")
    from .doctor import run_checks

    if registry is not None:
        host = re.sub(r"^https?://", "", registry).rstrip("/")
        grammar.check(grammar.registry_host, host, "--registry")
        registry = host
    elif Path(matrix_path).is_file():
        registry = matrix_mod.load(Path(matrix_path)).defaults["registry"].split("/")[0]
    checks = run_checks(registry)
    if Path(matrix_path).is_file():  # the compilers of the devel bases the matrix's cells build with
        from .doctor import check_devel_gcc

        checks += check_devel_gcc(resolve.select(matrix_mod.load(Path(matrix_path)), matrix_mod.Selection(profiles=("all",))))
    if as_json:
        click.echo(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            mark = click.style("ok  ", fg="green") if c.ok else click.style("FAIL", fg="red")
            click.echo(f"{mark} {c.name:<22} {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"     {'':<22} fix: {c.fix}")
    if not all(c.ok for c in checks):
        sys.exit(EXIT_ENVIRONMENT)


from .smoke.command import smoke as smoke_command  # noqa: E402 - the verb lives with its stage (builder/smoke/)

main.add_command(smoke_command)

from .bench.command import bench as bench_command  # noqa: E402 - builder bench lives with its stage (builder/bench/)

main.add_command(bench_command)

from .release import register as register_release_verbs  # noqa: E402 - publish, verify-repro, serve (builder/release.py)

register_release_verbs(main, build, selection_options, BuilderCommand)


if __name__ == "__main__":  # pragma: no cover
    main()
