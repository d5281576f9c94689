"""`builder doctor`: this host's docker, buildx, BuildKit, registry, GPUs and driver; with --host, whether
images run on its GPUs."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import click

from .. import grammar, resolve
from .. import matrix as matrix_mod
from ..errors import EXIT_ENVIRONMENT, Failed, UserError
from . import flags
from .app import main


@main.command()
@click.argument("images", nargs=-1)
@click.option("--registry", default=None, help="Registry host[:port] to check (default: the matrix's).")
@flags.matrix
@click.option("--host", "host_mode", is_flag=True,
              help="Will IMAGE... run on this host's GPUs (driver, CUDA, device code)? Nothing is pulled.")
@click.option("--gpus-file", default=None, help="With --host: judge the GPUs of a JSON file instead of nvidia-smi's.")
@flags.as_json
@flags.verification
def doctor(images, registry, matrix_path, host_mode, gpus_file, as_json, verification):
    """Check this host: docker, buildx, BuildKit, registry, GPUs and driver — and how to fix what is missing.
    With --host: per GPU and each of IMAGES (image references, or image configs saved as JSON), runs / runs
    with the forward-compatibility package / refused, with the rule.

    \b
    Example:
      builder doctor
      builder doctor --registry 127.0.0.1:5000 --json
      builder doctor --host registry.example.com/ml/vllm@sha256:... image.json
    """
    if host_mode:
        from ..deploy.host import command as host_command
        from .verify import say_verified

        for image in images:  # an image reference (not a saved config): whether it verifies, said first
            if not Path(image).exists():
                say_verified(image, verification, matrix_path, lambda line: click.echo(line, err=True))

        code = host_command(images, gpus_file, as_json, click.echo)
        if code:
            raise Failed(exit_code=code)
        return
    if images or gpus_file or verification.required or verification.keys or verification.policy:
        raise UserError("IMAGE..., --gpus-file and the --verify/--require-verified flags go with --host")
    from ..doctor import run_checks

    if registry is not None:
        host = re.sub(r"^https?://", "", registry).rstrip("/")
        grammar.check(grammar.registry_host, host, "--registry")
        registry = host
    elif Path(matrix_path).is_file():
        registry = matrix_mod.load(Path(matrix_path)).defaults["registry"].split("/")[0]
    checks = run_checks(registry)
    if Path(matrix_path).is_file():  # the compilers of the devel bases the matrix's cells build with
        from ..doctor import check_devel_gcc

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
        raise Failed(exit_code=EXIT_ENVIRONMENT)
