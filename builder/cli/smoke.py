"""`builder smoke IMAGE|CELL`: the layered proof (builder/deploy/smoke/) as a verb. An image needs no matrix: its
labels and the built-in engine data say what it is (builder/deploy/subject.py); a matrix, where there is one, is
the plan L0 holds the image to."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import archs as archs_mod
from .. import matrix as matrix_mod
from ..deploy import strategies
from ..deploy.smoke.report import LAYERS
from ..errors import Failed, UserError
from . import flags
from .app import main

EPILOG = """\b
Exit codes:
  0  every layer asked for passed or was skipped with a reason
  1  a layer failed
  2  bad input, refused before anything ran
  3  the environment is missing (no Docker daemon for an image)"""


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


def _warm_key(path: str | None, expect_warm: bool) -> dict | None:
    """--warm-key's capture facts (warm.json), read and checked before any work: with --expect-warm only."""
    if path is None:
        return None
    if not expect_warm:
        raise UserError("--warm-key judges a boot from a restored warm layer: give it with --expect-warm")
    from ..deploy.warm import layer

    return layer.read_facts(Path(path))


def _process_options(opts, cell, python: str, cache_root: str | None, image_paths: bool, expect_warm: bool,
                     warm_key: dict | None = None):
    """The process route's options: at the image's paths (--image-paths, its interpreter checked), the cell's caches
    under --cache-root or the image's root; --expect-warm: a warm layer restored there, which the boot may not
    compile beyond; --warm-key: the capture's warm.json, whose key the boot is judged against before it starts."""
    import dataclasses

    from ..deploy.runtime import caches, imagepaths

    paths = imagepaths.of_cell(cell, python, cache_root)[0] if image_paths else None
    setting = caches.of_cell(cell, cache_root)
    if expect_warm:
        if not setting.root or not any(p.is_file() for p in Path(setting.root).rglob("*")):
            raise UserError(f"--expect-warm: the cache root {setting.root or '(none)'} holds no file: restore "
                            "a warm layer there first")
        setting = setting.warm_boot(cell.warm_globs)
    if warm_key is not None:  # read and checked by the verb before any work (_warm_key)
        setting = dataclasses.replace(setting, warm_facts=tuple(sorted(warm_key.items())))
    return dataclasses.replace(opts, paths=paths, caches=setting)


@main.command("smoke", epilog=EPILOG)
@click.argument("target")
@flags.matrix
@flags.profile
@flags.arch
@click.option("--strategy", "strategy", default=None,
              help="Strategies of the engine data, comma-separated (e.g. MTP2,MTP7), or all (default: the cell's "
                   "strategies).")
@click.option("--layers", default=None, help="Layers to run, e.g. L0,L1,JIT,L2 (default: all; L3 needs a GPU).")
@flags.run_flags
@flags.cache_root(", so the caches sit at the paths an image has and a warm layer captured here or there fits "
                  "both.")
@flags.image_paths
@click.option("--expect-warm", "expect_warm", is_flag=True,
              help="With --launcher process: the cache root holds a warm layer's files (restored at the image's paths): "
                   "L3 fails when a boot compiles anything beyond the engine data's warm_allowance, naming the files.")
@click.option("--warm-key", "warm_key", type=flags.FsPath(dir_okay=False), default=None,
              help="With --expect-warm: the capture's warm.json (what the restored layer was made for): the boot is "
                   "judged against its key before it starts, and what it compiled is set against that judgement.")
@flags.out_dir("smoke_report_dir", "smoke.json, smoke.xml (JUnit) and the engine logs go to DIR/<cell>/")
@flags.as_json
@flags.verification
def smoke(target, matrix_path, profile, arch, strategy, layers, run, cache_root, image_paths, expect_warm, warm_key,
          out_dir, as_json, verification):
    """Prove that TARGET, an image (or, with --launcher process, the cell id of an engine install), serves the
    model under each strategy, in layers:
    L0 labels and versions equal the plan; L1 the engine, its serving modules and every compiled extension
    import and the audit passes inside the image; JIT, without a GPU, compiles inside the image what the engine
    compiles at its first requests: Triton's launcher and a kernel per arch, a C extension against the Python
    headers, nvcc's -lcuda link, and the engine's own JIT modules (e.g. FlashInfer's fp8_blockscale_gemm_sm90)
    through their own generators for each arch, with seconds per module and the compiler's or linker's error (a
    jit = "prebuilt" image must compile none of them); L2 the engine's own argument parser resolves each strategy's
    flags to the intended config; L3 (GPU host) boot, one completion, speculative decoding seen to run, with
    boot time, TTFT, latency and tokens/s. Results per image x strategy x layer: pass / fail / skip with
    the reason; JSON and JUnit XML reports. An image needs no matrix.toml: its labels and the built-in engine
    data say what it is (one only in a registry is read there, then pulled to run it).

    \b
    Example:
      builder smoke vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90 --strategy all
      builder smoke 127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90 --layers L0,L1,L2
      # a GPU host without Docker, vLLM installed for python3:
      builder smoke vllm-0.26.0-cu130-torch2.11.0-py312-sm90 --matrix tests/fixtures/gpu-host/matrix.toml \\
          --launcher process --strategy MTP2,MTP7 --model tiny
    """
    from ..deploy import subject
    from ..deploy.runtime import gpus
    from ..image import launchline
    from ..deploy.smoke import Model, SmokeOptions, report, smoke_image, smoke_process
    from ..deploy.runtime import warmkey

    flags.process_only(run, cache_root=cache_root is not None, image_paths=image_paths, expect_warm=expect_warm,
                       warm_key=warm_key is not None)
    warm_facts = _warm_key(warm_key, expect_warm)
    sel = matrix_mod.Selection(archs=archs_mod.parse(arch) if arch is not None else None,
                               profiles=flags.split(profile))
    m = flags.given_matrix(matrix_path)
    names = m.knowledge.strategy_names() if m is not None else strategies.known()
    layer_list = parse_layers(layers)
    if strategy is not None:
        strategies.for_smoke(strategy, (), names)  # the names now; the cell's own list later
    cell, image = subject.target(target, m, sel, run.launcher, matrix_path)  # refused before the model is read
    if image is not None:  # a published image: whether it verifies, said (or refused) before anything runs
        from .verify import say_verified

        say_verified(image, verification, matrix_path, lambda line: click.echo(line, err=True))
    if cell is not None:  # a cell's engine without a tensor-parallel flag: refused before docker is asked
        launchline.tp_args(cell.engine_recipe, run.tp)
    model = Model.resolve(run.model, run.drafter)
    say = (lambda s: click.echo(s, err=True))
    cell, image, found, client = subject.open_for(cell, image, run.launcher, m, sel)
    chosen = strategies.for_smoke(strategy, cell.strategies, names)
    launchline.tp_args(cell.engine_recipe, run.tp)  # an engine without a tensor-parallel flag: refused now
    host = gpus.read() if run.gpus.mode != "none" else None
    chosen_gpus = run.gpus.for_tp(run.tp, host)
    have_gpu, why_no_gpu = chosen_gpus.choose(host)
    opts = SmokeOptions(
        strategies=chosen,
        model=model,
        layers=layer_list,
        gpus=have_gpu,
        gpu_ids=chosen_gpus.ids,
        tp=run.tp,
        l3_without_gpu=run.gpus.mode == "none",
        no_gpu_reason=why_no_gpu,
        gpu_arch=host.arch if host is not None else None,
        boot_timeout=run.boot_timeout,
        port=run.port,
        extra_args=run.engine_args,
        extra_env=run.env,
        log_dir=out_dir.resolve() / cell.id,
        gpu=host.chosen(chosen_gpus.ids) if have_gpu and host is not None else None,
        warm_keys=warmkey.of_knowledge(m.knowledge if m is not None else None),
    )
    if run.launcher == "docker":
        rep = smoke_image(cell, image, opts, say, client=client, subject=found,
                          run_ref=subject.pinned(found, client, say))  # the image read, by digest: never a moved tag
    else:
        rep = smoke_process(cell, run.python, _process_options(opts, cell, run.python, cache_root, image_paths,
                                                               expect_warm, warm_facts), say, extra_env=run.env)
    js, xml = report.write([rep], opts.log_dir)
    if as_json:
        click.echo(json.dumps(rep.to_json(), indent=2))
    else:
        click.echo(report.table([rep]))
        click.echo(f"reports: {js} {xml}")
    if not rep.ok:
        raise Failed()
