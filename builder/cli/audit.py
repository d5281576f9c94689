"""`builder audit WHEEL|IMAGE|DIR`: the SASS and PTX of every binary against the archs asked for."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import archs as archs_mod
from .. import grammar
from ..image import labels as labels_mod
from ..errors import Failed, UserError
from . import flags
from .app import main


@main.command("audit")
@click.argument("target")
@click.option("--arch", "arch", required=True, help="SM archs every binary must run on, e.g. 80,90.")
@flags.as_json
@click.option("--verbose", "-v", is_flag=True, help="List binaries without device code too.")
@click.option("--allow-no-device-code", is_flag=True,
              help="Pass a target in which no binary carries device code (a pure-Python wheel); by default that "
                   "proves nothing and fails.")
@click.option("--package", "packages", multiple=True, metavar="NAME==VERSION",
              help="Apply the engine data's arch scopes of this package (libraries built for some arch families "
                   "only, e.g. vLLM's FA3); an image built by builder gets its packages' scopes from its labels.")
def audit_cmd(target, arch, as_json, verbose, allow_no_device_code, packages):
    """List SASS archs and PTX of every .so in TARGET: a wheel file, an image or a directory; exit 1 naming the file and the
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
    from .. import docker
    from ..audit import audit, audit_image, format_report
    from ..engines import load_knowledge

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
            found = [(n, v) for n in labels_mod.packages(labels) if (v := labels.get(labels_mod.package(n, "version")))]
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
        raise Failed()
    if not report.has_device_code and not allow_no_device_code:
        raise Failed(f"audit: nothing proven: no binary in {target} carries device code "
                     "(--allow-no-device-code for a pure-Python target)")
