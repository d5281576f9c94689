"""`builder smoke IMAGE|CELL`: the layered proof (builder/deploy/smoke/) as a verb, and the strategy, environment and
cell look-ups smoke, serve and bench share."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click

from .. import archs as archs_mod
from .. import files, grammar
from .. import labels as labels_mod
from .. import matrix as matrix_mod
from .. import resolve
from ..schema import did_you_mean
from ..errors import Failed, UserError
from ..options import flag_default
from ..deploy.smoke.report import LAYERS
from . import flags
from .app import main

EPILOG = """\b
Exit codes:
  0  every layer asked for passed or was skipped with a reason
  1  a layer failed
  2  bad input, refused before anything ran
  3  the environment is missing (no Docker daemon for an image)"""


def known_strategies(kn=None) -> tuple[str, ...]:
    """The strategy names of the engine data (the matrix's knowledge, else the built-in data)."""
    from ..engines import load_knowledge

    return (kn or load_knowledge()).strategy_names()


def parse_strategies(value: str | None, default: tuple[str, ...], known: tuple[str, ...] | None = None) -> tuple[str, ...]:
    known = known or known_strategies()
    if value is None:
        return default
    if not flags.split(value):  # `--strategy ,` would drop every strategy: L2 and L3 would prove nothing
        raise UserError(f"--strategy {value!r}: no strategy named; give {','.join(known)} or all")
    if value.strip().lower() == "all":
        return known
    return tuple(dict.fromkeys(parse_strategy(v, known, or_all=True) for v in flags.split(value)))


def parse_strategy(value: str, known: tuple[str, ...] | None = None, or_all: bool = False) -> str:
    """One strategy name of the engine data, matched without regard to case."""
    known = known or known_strategies()
    match = next((s for s in known if s.lower() == value.strip().lower()), None)
    if match is None:
        raise UserError(f"--strategy: {value!r} is not a strategy{did_you_mean(value, known)}; "
                        f"known: {', '.join(known)}" + (", or all" if or_all else ""))
    return match


def parse_layers(value: str | None) -> tuple[str, ...]:
    if value is None:
        return LAYERS
    layers = tuple(v.upper() for v in flags.split(value))
    if not layers:  # `--layers ,` would skip every layer and pass
        raise UserError(f"--layers {value!r}: no layer named; give some of {', '.join(LAYERS)}")
    bad = [v for v in layers if v not in LAYERS]
    if bad:
        raise UserError(f"--layers: {', '.join(bad)} unknown; layers are {', '.join(LAYERS)}")
    return tuple(x for x in LAYERS if x in layers)


def parse_env(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise UserError(f"--env {v!r}: write NAME=VALUE")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"--env {v!r}: {key!r} is not a variable name (letters, digits, '_')")
        if "\0" in val:
            raise UserError(f"--env {key}: the value contains a NUL byte")
        out[key] = val
    return out


def find_cell(m, sel, target: str):
    """A cell by id (any profile of the matrix), or the cell an image's io.builder.cell label names."""
    cells = resolve.select(m, sel)
    by_id = {c.id: c for c in cells}
    if target in by_id:
        return by_id[target], None
    if not sel.profiles:  # the target may be a cell of another profile
        try:
            every = resolve.select(m, matrix_mod.Selection(**{**sel.__dict__, "profiles": ("all",)}))
            by_id.update({c.id: c for c in every})
        except UserError:
            pass
        if target in by_id:
            return by_id[target], None
    if ":" in target or "/" in target:  # an image reference (checked before docker is asked about it)
        grammar.check(grammar.image_ref, target, "smoke TARGET")
        return None, target
    raise UserError(f"{target}: neither a cell of {m.path} nor an image reference; cells: {', '.join(sorted(by_id)) or 'none'}")


@main.command("smoke", epilog=EPILOG)
@click.argument("target")
@flags.matrix
@flags.profile
@flags.arch
@click.option("--strategy", "strategy", default=None,
              help="Strategies of the engine data, comma-separated (e.g. MTP2,MTP7), or all (default: the cell's "
                   "strategies).")
@flags.model
@flags.drafter
@click.option("--layers", default=None, help="Layers to run, e.g. L0,L1,JIT,L2 (default: all; L3 needs a GPU).")
@flags.launcher
@flags.python
@flags.gpus
@flags.boot_timeout
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 for the engine (default: a free one).")
@flags.engine_args
@flags.env
@click.option("--report-dir", type=click.Path(file_okay=False), default=flag_default("smoke_report_dir"), show_default=True,
              help="smoke.json, smoke.xml (JUnit) and the engine logs go to DIR/<cell>/.")
@flags.as_json
def smoke(target, matrix_path, profile, arch, strategy, model, drafter, layers, launcher, python, gpus, boot_timeout,
          port, engine_args, env, report_dir, as_json):
    """Prove that an image (or an engine install) of a cell serves the model under each strategy, in layers:
    L0 labels and versions equal the plan; L1 the engine, its serving modules and every compiled extension
    import and the audit passes inside the image; JIT, without a GPU, compiles inside the image what the engine
    compiles at its first requests: Triton's launcher and a kernel per arch, a C extension against the Python
    headers, nvcc's -lcuda link, and the engine's own JIT modules (e.g. FlashInfer's fp8_blockscale_gemm_sm90)
    through their own generators for each arch, with seconds per module and the compiler's or linker's error (a
    jit = "prebuilt" image must compile none of them); L2 the engine's own argument parser resolves each strategy's
    flags to the intended config; L3 (GPU host) boot, one completion, speculative decoding seen to run, with
    boot time, TTFT, latency and tokens/s. Results per image x strategy x layer: pass / fail / skip with
    the reason; JSON and JUnit XML reports.

    \b
    Example:
      builder smoke vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90 --strategy all
      builder smoke 127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90 --layers L0,L1,L2
      # a GPU host without Docker, vLLM installed for python3:
      builder smoke vllm-0.26.0-cu130-torch2.11.0-py312-sm90 --matrix tests/fixtures/gpu-host/matrix.toml \\
          --launcher process --strategy MTP2,MTP7 --model tiny
    """
    from ..deploy.smoke import Model, SmokeOptions, detect_gpu, report, smoke_image, smoke_process
    from ..deploy.smoke.launch import docker_client

    sel = matrix_mod.Selection(archs=archs_mod.parse(arch) if arch is not None else None,
                               profiles=flags.split(profile))
    m = matrix_mod.load(Path(matrix_path))
    cell, image = find_cell(m, sel, target)
    layer_list = parse_layers(layers)
    if strategy is not None:
        parse_strategies(strategy, (), m.knowledge.strategy_names())  # the names now; the cell's own list later
    extra_env = parse_env(env)
    try:
        extra_args = tuple(shlex.split(engine_args))
    except ValueError as exc:
        raise UserError(f"--engine-args: {exc}") from None
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port: {port} is not a TCP port")
    files.writable_dir(Path(report_dir), "--report-dir")  # before any container: not after a 900 s L3
    if launcher == "auto":
        launcher = "docker"
    if launcher == "process" and image is not None:
        raise UserError(f"--launcher process runs a cell's engine installed on this host; {target} is an image: "
                        "name the cell id instead")
    client = None
    if launcher == "docker":
        client = docker_client()  # exit 3 when the daemon does not answer
        if image is None:
            image = cell.ref
        try:
            labels = client.images.get(image).labels or {}
        except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound
            raise UserError(f"{image}: no such local image (build it with `builder build`, or pull it first)") from None
        if cell is None:
            label = labels_mod.cell(labels)
            if not label:
                raise UserError(f"{image} carries no io.builder.cell label: it was not built by builder")
            cell, _ = find_cell(m, sel, label)
            if cell is None:
                raise UserError(f"{image} is labelled cell {label}, which {m.path} does not have")
    strategies = parse_strategies(strategy, cell.strategies, m.knowledge.strategy_names())
    have_gpu, why_no_gpu, gpu_arch = detect_gpu() if gpus != "none" else (False, "--gpus none", None)
    if gpus == "all" and not have_gpu:
        raise UserError(f"--gpus all: {why_no_gpu}")
    out_dir = Path(report_dir).resolve() / cell.id
    opts = SmokeOptions(
        strategies=strategies,
        model=Model.resolve(model, drafter),
        layers=layer_list,
        gpus=have_gpu,
        l3_without_gpu=gpus == "none",
        no_gpu_reason=why_no_gpu,
        gpu_arch=gpu_arch,
        boot_timeout=boot_timeout,
        port=port,
        extra_args=extra_args,
        extra_env=extra_env,
        log_dir=out_dir,
    )
    say = (lambda s: click.echo(s, err=True))
    if launcher == "docker":
        rep = smoke_image(cell, image, opts, say, client=client)
    else:
        rep = smoke_process(cell, python, opts, say, extra_env=extra_env)
    js, xml = report.write([rep], out_dir)
    if as_json:
        click.echo(json.dumps(rep.to_json(), indent=2))
    else:
        click.echo(report.table([rep]))
        click.echo(f"reports: {js} {xml}")
    if not rep.ok:
        raise Failed()

