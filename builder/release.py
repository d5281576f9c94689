"""The verbs after build: `publish` (build's steps, then smoke's gate, then push by digest, aliases,
images.json), `verify-repro` (two builds from nothing, compared) and `serve` (the exact `docker run` of a
published image). builder/cli.py calls register(): the verbs reuse its build command and selectors without
this module importing cli (which `python -m builder.cli` runs as __main__)."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import click

from . import matrix as matrix_mod
from . import publish as pub
from . import resolve
from .engines import STRATEGIES, did_you_mean
from .errors import EXIT_FAILED, UserError


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v.strip() for val in values for v in val.split(",") if v.strip())


_PUBLISH_PARAMS = [
    click.Option(["--registry"], default=None, metavar="HOST[:PORT]/PATH",
                 help="Where to push: images go to REGISTRY/<engine>:<tag> (default: the matrix's defaults.registry). "
                      "Credentials: BUILDER_REGISTRY_USER / BUILDER_REGISTRY_PASSWORD, else your docker login."),
    click.Option(["--images-json"], type=click.Path(dir_okay=False), default=None,
                 help="The record of published images, updated in place (default: images.json next to the matrix)."),
    click.Option(["--retries"], type=int, default=4, show_default=True,
                 help="Retries per registry operation on transient errors (refused/reset connections, timeouts, "
                      "429, 5xx), with exponential backoff from 2 s (at most 60 s)."),
    click.Option(["--no-aliases"], is_flag=True,
                 help="Push the full tags only; leave ENGINE:VERSION and ENGINE:latest-cuXYZ where they are."),
]


def after_publish(m, cells, plans, outcomes, opts):
    """After the runner: aliases (only when every cell was pushed), images.json, the pull lines."""
    try:
        every = resolve.select(m, matrix_mod.Selection(profiles=("all",)))
    except UserError:
        every = None
    claims = pub.alias_claims(list(cells), m, every)

    def say(text: str) -> None:
        click.echo(text, err=True)

    summary = pub.finish(outcomes, plans, opts.publish, claims, say, epoch=opts.source_date_epoch)
    for line in summary.failed:
        click.secho(f"not published: {line}", fg="red", err=True)
    for line in summary.pulls:
        click.echo(line)
    return summary


def _strategy(value: str) -> str:
    match = next((s for s in STRATEGIES if s.lower() == value.strip().lower()), None)
    if match is None:
        raise UserError(f"--strategy: {value!r} is not a strategy{did_you_mean(value, STRATEGIES)}; known: {', '.join(STRATEGIES)}")
    return match


def _bind_address(value: str) -> str:
    """--bind: one IP address of this host to publish the port on ('' would mean every interface); an IPv6
    address comes back in brackets, as docker's -p wants it."""
    import ipaddress

    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        addr = ipaddress.ip_address(bare)
    except ValueError:
        raise UserError(f"--bind: {value!r} is not an IP address (127.0.0.1, the default; 0.0.0.0 for every "
                        "interface, said explicitly)") from None
    return f"[{addr}]" if addr.version == 6 else str(addr)


def register(main, build_command, selection_options, command_class) -> None:
    """Add publish, verify-repro and serve to `main` (builder/cli.py)."""
    BuilderCommand = command_class
    # -- publish ------------------------------------------------------------------------------------------------
    def _publish(registry, images_json, retries, no_aliases, **build_kwargs):
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
        matrix_path = Path(build_kwargs["matrix_path"])
        m = matrix_mod.load(matrix_path)
        if images_json == "":
            raise UserError("--images-json: an empty path")
        target = pub.make_target(registry if registry is not None else m.defaults["registry"],
                                 Path(images_json).resolve() if images_json else m.path.resolve().parent / "images.json",
                                 attempts=retries + 1, aliases=not no_aliases)
        pub.check_images_json(target.images_json)  # a bad file is found now, not after the push
        # skopeo and the registry are checked by build once every option is (exit 3 before anything is built)
        click.get_current_context().meta[pub.META] = target
        return build_command.callback(**build_kwargs)


    publish = BuilderCommand("publish", callback=_publish, params=[*_PUBLISH_PARAMS, *build_command.params],
                             help=_publish.__doc__, short_help="Build, smoke and push images by digest; move aliases.")


    # -- verify-repro -------------------------------------------------------------------------------------------
    @click.command("verify-repro", cls=BuilderCommand)
    @click.argument("cell_id", metavar="CELL")
    @selection_options
    @click.option("--ca-bundle", type=click.Path(dir_okay=False), default=lambda: __import__("os").environ.get("BUILDER_CA_BUNDLE"),
                  help="CA bundle for HTTPS inside the build (a BuildKit secret). Env: BUILDER_CA_BUNDLE.")
    @click.option("--allow-unpinned", is_flag=True, help="Build git sources known only by tag.")
    @click.option("--max-jobs", type=int, default=None, help="Override MAX_JOBS.")
    @click.option("--nvcc-threads", type=int, default=None, help="Override NVCC_THREADS.")
    @click.option("--work-dir", type=click.Path(file_okay=False), default="build", show_default=True,
                  help="The two builds go to WORK_DIR/verify-repro/<cell>/{first,second}.")
    @click.option("--log-dir", type=click.Path(file_okay=False), default="logs", show_default=True,
                  help="Their logs: LOG_DIR/verify-repro/{first,second}/<cell>.log.")
    @click.option("--pins-dir", type=click.Path(file_okay=False), default=None,
                  help="Where runtime-pins/<cell>.txt is read from (default: runtime-pins/ next to the matrix); never written.")
    @click.option("--builder", "buildx_builder", default=None, metavar="NAME", help="The buildx builder both builds run on.")
    @click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
    def verify_repro(m, sel, cell_id, ca_bundle, allow_unpinned, max_jobs, nvcc_threads, work_dir, log_dir, pins_dir,
                     buildx_builder, as_json):
        """Build CELL twice from nothing — an empty wheelhouse and no BuildKit cache each time — and compare every
        wheel's sha256 and the runtime image's digest. Exit 0 when they are identical; exit 1 naming what differs:
        a wheel's zip members, and per image layer the files added, removed or changed (contents, mode, owner, time).

        \b
        Example:
          builder verify-repro cuda-ext-1.0.0-cu130-py311-sm80.90 --matrix tests/fixtures/cuda-ext/matrix.toml
          builder verify-repro vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90 --json
        """
        from . import docker, epoch, pins, repro, runner
        from .steps import BuildOptions

        cells = {c.id: c for c in resolve.select(m, sel)}
        if cell_id not in cells:
            raise UserError(f"{cell_id}: no such cell in {m.path} for this selection; cells: {', '.join(sorted(cells)) or 'none'}")
        if ca_bundle == "":
            raise UserError("--ca-bundle (or BUILDER_CA_BUNDLE): an empty path; leave it out for no CA bundle")
        stamp = epoch.resolve(m)
        opts = BuildOptions(
            work_dir=Path(work_dir).resolve(), log_dir=Path(log_dir).resolve(), index_url=m.defaults["index"],
            max_jobs=max_jobs, nvcc_threads=nvcc_threads, ca_bundle=Path(ca_bundle).resolve() if ca_bundle else None,
            allow_unpinned=allow_unpinned, source_date_epoch=stamp.value,
            pins_dir=Path(pins_dir).resolve() if pins_dir else m.path.resolve().parent / pins.DIR_NAME,
            no_cache=True, builder=buildx_builder)
        runner.check_options(opts)
        from . import files

        if buildx_builder is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", buildx_builder):
            raise UserError(f"--builder: {buildx_builder!r} is not a builder name (letters, digits, '_', '.', '-')")
        files.writable_dir(opts.work_dir, "--work-dir")  # under a file: exit 2 now, not after the first build
        files.writable_dir(opts.log_dir, "--log-dir")
        (cell,) = resolve.pin_git_sources([cells[cell_id]], echo=lambda s: click.echo(s, err=True))
        docker.require_buildx()
        click.echo(f"SOURCE_DATE_EPOCH={stamp.value} (from {stamp.origin})", err=True)
        verdict = repro.verify(cell, opts, lambda s: click.echo(s, err=True))
        click.echo(json.dumps(verdict.to_json(), indent=2) if as_json else repro.format_verdict(verdict))
        if not verdict.reproducible:
            sys.exit(EXIT_FAILED)


    # -- serve --------------------------------------------------------------------------------------------------
    @click.command("serve", cls=BuilderCommand)
    @click.argument("image")
    @click.option("--strategy", required=True, help=f"One of {', '.join(STRATEGIES)}: its real flags come from the engine data.")
    @click.option("--model", "model_path", required=True, type=click.Path(file_okay=False),
                  help="The checkpoint directory on this host; mounted read-only at /models/<name>.")
    @click.option("--port", type=int, default=8000, show_default=True, help="The port the engine listens on, published as the same.")
    @click.option("--bind", default="127.0.0.1", show_default=True,
                  help="The host address the port is published on (0.0.0.0: every interface).")
    @click.option("--gpus", default="all", show_default=True, help="all, none, or device ids like 0,1.")
    @click.option("--drafter", default=None, help="The strategy's draft model: a directory (mounted) or a hub id "
                                                  "(default: the engine data's, for DFlash2).")
    @click.option("--name", default=None, help="The container's name.")
    @click.option("--engine-args", default="", help="More engine flags, one shell-quoted string (e.g. '--tensor-parallel-size 2').")
    @click.option("--matrix", "matrix_path", default="matrix.toml", show_default=True, type=click.Path(dir_okay=False),
                  help="Read the matrix's extra engine-knowledge files too, when the file exists.")
    @click.option("--run", "do_run", is_flag=True, help="Run it (in the foreground; Ctrl-C stops the container).")
    def serve(image, strategy, model_path, port, bind, gpus, drafter, name, engine_args, matrix_path, do_run):
        """Print the exact `docker run` that serves IMAGE (a tag or REPO@sha256:…) with STRATEGY: the GPUs, the
        model mounted read-only, the port, and the strategy's real flags and environment from the engine data for
        the engine version the image's labels name. With --run, run it.

        \b
        Example:
          builder serve 127.0.0.1:5000/builder/vllm@sha256:… --strategy MTP2 --model /srv/models/Qwen3.8-27B-FP8
          builder serve 127.0.0.1:5000/builder/sglang:0.5.23 --strategy DFlash2 --model /srv/models/q --gpus 0,1 --run
        """
        from . import docker, grammar, serve as serve_mod
        from .engines import load_knowledge

        grammar.check(grammar.image_ref, image, "IMAGE")
        strategy = _strategy(strategy)
        if not 0 < port < 65536:
            raise UserError(f"--port: {port} is not a TCP port")
        bind = _bind_address(bind)
        if not Path(model_path).is_dir():  # before the image is looked up (docker, skopeo)
            raise UserError(f"--model: {model_path} is not a directory (the checkpoint to mount)")
        if gpus not in ("all", "none") and (not _split((gpus,)) or not all(g.isdigit() for g in _split((gpus,)))):
            raise UserError(f"--gpus: {gpus!r}: write all, none or device ids like 0,1")
        if name is not None and not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
            raise UserError(f"--name: {name!r} is not a container name (letters, digits, '_', '.', '-')")
        try:
            extra = tuple(shlex.split(engine_args))
        except ValueError as exc:
            raise UserError(f"--engine-args: {exc}") from None
        kn = matrix_mod.load(Path(matrix_path)).knowledge if Path(matrix_path).is_file() else load_knowledge()
        labels = serve_mod.image_labels(image)
        line = serve_mod.serve_line(image, labels, kn, strategy, Path(model_path), port=port, bind=bind,
                                    gpus=",".join(_split((gpus,))) if gpus not in ("all", "none") else gpus,
                                    drafter=drafter, name=name, extra_args=extra)
        for note in line.notes:
            click.echo(f"# {note}", err=True)
        if line.health:
            click.echo(f"# ready when {line.health} answers 200", err=True)
        click.echo(line.command)
        if not do_run:
            return
        proc = docker.popen(line.argv, process_group=0)
        try:
            rc = proc.wait()
        except BaseException:
            click.echo(f"stopping: {docker.stop_group(proc)}", err=True)
            raise
        if rc:
            sys.exit(rc if rc < 128 else EXIT_FAILED)

    for verb in (publish, verify_repro, serve):
        main.add_command(verb)
