"""`builder serve IMAGE`: the exact `docker run` of a published image under a strategy (and, with --run, run it)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from .. import matrix as matrix_mod
from ..deploy import runflags, strategies
from ..errors import EXIT_FAILED, Failed, UserError
from ..options import flag_default
from . import flags
from .app import main


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


@main.command("serve")
@click.argument("image")
@click.option("--strategy", required=True,
              help="A strategy of the engine data (e.g. MTP2): its real flags come from the engine data.")
@click.option("--model", "model_path", required=True, type=click.Path(file_okay=False),
              help="The checkpoint directory on this host; mounted read-only at /models/<name>.")
@click.option("--port", type=int, default=flag_default("serve_port"), show_default=True, help="The port the engine listens on, published as the same.")
@click.option("--bind", default=flag_default("serve_bind"), show_default=True,
              help="The host address the port is published on (0.0.0.0: every interface).")
@click.option("--gpus", default=flag_default("serve_gpus"), show_default=True, help=flags.GPUS_HELP)
@click.option("--drafter", default=None, help="The strategy's draft model: a directory (mounted) or a hub id "
                                              "(default: the engine data's, for DFlash2).")
@click.option("--name", default=None, help="The container's name.")
@flags.engine_args
@flags.matrix
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
    from .. import docker, grammar
    from ..deploy import serve as serve_mod
    from ..deploy import subject
    from ..engines import load_knowledge

    grammar.check(grammar.image_ref, image, "IMAGE")
    runflags.port(port)
    bind = _bind_address(bind)
    if not Path(model_path).is_dir():  # before the image is looked up (docker, the registry)
        raise UserError(f"--model: {model_path} is not a directory (the checkpoint to mount)")
    chosen_gpus = runflags.Gpus.parse(gpus)
    if name is not None and not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise UserError(f"--name: {name!r} is not a container name (letters, digits, '_', '.', '-')")
    extra = runflags.engine_args(engine_args)
    kn = matrix_mod.load(Path(matrix_path)).knowledge if Path(matrix_path).is_file() else load_knowledge()
    strategy = strategies.one(strategy, strategies.known(kn))  # the engine data's names, extra files included
    found = subject.read(image, files=False)  # the daemon's, else the registry's: nothing pulled
    # the digest read, never the tag: what runs is what was read (local: its repo digest, else its ID)
    line = serve_mod.serve_line(found.digest or image, found.labels, kn, strategy, Path(model_path),
                                port=port, bind=bind, gpus="all" if chosen_gpus.mode == "auto" else str(chosen_gpus),
                                drafter=drafter, name=name, extra_args=extra)
    if found.digest and found.digest != image:
        click.echo(f"# {image} read as {found.digest}: the command runs that image, wherever the tag moves", err=True)
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
        raise Failed(exit_code=rc if rc < 128 else EXIT_FAILED)
