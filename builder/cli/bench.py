"""`builder bench IMAGE|CELL`, `builder bench diff OLD.json NEW.json`, `builder bench plot RESULT.json...`: the
verbs of the benchmark stage (builder/deploy/bench/). An image needs no matrix (builder/deploy/subject.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import click

from .. import archs as archs_mod
from .. import files
from ..image import labels as labels_mod
from .. import matrix as matrix_mod
from ..deploy import strategies
from ..deploy.bench import client, data, results
from ..deploy.strategies import NONE
from ..errors import Failed, UserError
from . import flags
from .app import main

EPILOG = """\b
Exit codes:
  0  every strategy was benchmarked (bench), no regression (diff)
  1  a strategy failed to boot or to run (bench), a regression (diff)
  2  bad input (a strategy the image was not built for, a result with too few repeats), refused before anything ran
  3  the environment is missing (no Docker daemon for an image)"""


class BenchGroup(click.Group):
    """`builder bench TARGET ...` runs a benchmark; `diff` and `plot` are verbs of their own."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def _client_python(given: str | None, python: str, cell) -> str:
    """The interpreter of the load generator (vLLM's: --python for a vLLM cell, else python3), found before any
    engine boots."""
    chosen = given if given is not None else python if cell.engine == "vllm" else "python3"
    if not shutil.which(chosen):
        raise UserError(f"--client-python {chosen}: not found (the load generator runs there)")
    return chosen


@main.group("bench", cls=BenchGroup, epilog=EPILOG)
def bench():
    """Which strategy serves fastest from this image on this host: boot per strategy, a real load generator,
    one row per digest x strategy x workload (`builder bench TARGET --help`); `diff` two results; `plot` them.

    \b
    Example:
      builder bench 127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90 --strategy all --repeats 3
      builder bench diff last-week/bench.json today/bench.json
    """


@bench.command("run", epilog=EPILOG)
@click.argument("target")
@click.option("--strategy", "strategy", default="all", show_default=True,
              help="none,MTP2,MTP7,DFlash2 (comma-separated) or all: none + every strategy the image was built for.")
@click.option("--workload", default="article", show_default=True,
              help="A workload of builder/data/bench.toml (article, quick), a TOML file of one, or a JSONL of prompts.")
@click.option("--requests", type=flags.Number(1, 1_000_000, "a number of requests", integer=True), default=None,
              help="Requests per run (default: the workload's).")
@click.option("--concurrency", type=flags.Number(1, 100_000, "a number of clients", integer=True), default=None,
              help="Concurrent clients (default: the workload's).")
@click.option("--seed", type=flags.Number(0, 2**32 - 1, "a seed", integer=True), default=None,
              help="The workload's seed (default: the workload's).")
@click.option("--repeats", type=flags.Number(1, 1000, "a number of runs", integer=True), default=3, show_default=True,
              help="Measured runs per strategy on one boot, after one discarded warm-up pass of the workload; a row "
                   "of fewer than 3 is marked not comparable, and `bench diff` refuses it.")
@click.option("--no-warmup", is_flag=True, help="Skip the discarded warm-up pass of the workload before the repeats.")
@click.option("--slo-ttft-ms", type=flags.Number(0, 3_600_000, "a number of milliseconds", lo_open=True), default=None,
              help="Goodput objective (default: the data's, 300 ms).")
@click.option("--no-lossless", is_flag=True, help="Skip the greedy-output comparison with no speculation.")
@flags.matrix
@flags.profile
@flags.arch
@click.option("--client-python", default=None,
              help="The interpreter with vLLM installed that runs the load generator (default: --python for a vLLM "
                   "cell, else python3).")
@flags.run_flags
@flags.cache_root(". Each row's boot_state is measured there: cold (it held nothing at boot) or warm; in an image's "
                  "container: cold, restored (its warm layer) or prebuilt.")
@flags.out_dir("bench_out_dir", "bench.json, bench.csv, bench.txt, bench.png and the engine logs go to DIR/<cell>/")
@flags.as_json
def run_cmd(target, strategy, workload, requests, concurrency, seed, repeats, no_warmup, slo_ttft_ms, no_lossless,
            matrix_path, profile, arch, client_python, run, cache_root, out_dir, as_json):
    """Benchmark TARGET (an image, or a cell id with --launcher process) under each strategy. An image needs no
    matrix.toml: its labels and the built-in engine data say what it is.

    \b
    Example:
      builder bench 127.0.0.1:5000/builder/vllm:0.33.0-cu130-torch2.14.0-py312-sm80.90 --strategy all
      builder bench vllm-0.26.0-cu130-torch2.11.0-py312-sm90 --matrix tests/fixtures/gpu-host/matrix.toml \\
          --launcher process --strategy none,MTP2 --repeats 3
      builder bench diff old/bench.json new/bench.json
    """
    from ..deploy import subject
    from ..deploy.runtime import caches, gpus
    from ..deploy.bench import run as run_mod
    from ..image import launchline
    from ..deploy.bench import workload as workload_mod
    from ..deploy.smoke import Model

    flags.process_only(run, cache_root=cache_root is not None)
    w = workload_mod.load(workload, requests, concurrency, seed)
    sel = matrix_mod.Selection(archs=archs_mod.parse(arch) if arch is not None else None,
                               profiles=flags.split(profile))
    m = flags.given_matrix(matrix_path)
    names = m.knowledge.strategy_names() if m is not None else strategies.known()
    strategies.bench_names(strategy, names)  # the names now; what the image was built for later
    cell, image = subject.target(target, m, sel, run.launcher, matrix_path)
    if cell is not None:
        _client_python(client_python, run.python, cell)
        launchline.tp_args(cell.engine_recipe, run.tp)  # before docker is asked
    model_obj = Model.resolve(run.model, run.drafter)
    say = (lambda s: click.echo(s, err=True))
    cell, image, found, dock = subject.open_for(cell, image, run.launcher, m, sel)
    client_python = _client_python(client_python, run.python, cell)  # before any engine boots
    env_info: dict = {"subject": target}
    recipe = cell.engine_recipe
    if found is not None:
        env_info["digest"] = found.digest
        built_for, subject_name = found.strategies, image
    else:
        env_info["digest"] = f"process:{run.python}"
        built_for, subject_name = tuple(cell.strategies), f"cell {cell.id}"
    chosen = strategies.for_bench(strategy, built_for, recipe, subject_name, names)
    launchline.tp_args(recipe, run.tp)  # an engine without a tensor-parallel flag: refused now
    host = gpus.read() if run.gpus.mode != "none" else None
    chosen_gpus = run.gpus.for_tp(run.tp, host)
    have_gpu, why_no_gpu = chosen_gpus.choose(host)
    if run.gpus.mode == "auto" and not have_gpu:
        raise UserError(f"bench needs a GPU: {why_no_gpu} (--gpus none only for CPU engines and test doubles)")
    base_dir = out_dir.resolve() / cell.id
    bench_data = data()
    slo = slo_ttft_ms if slo_ttft_ms is not None else bench_data["slo"]["ttft_ms"]
    lch, engine_facts = _launcher(run, cell, found, dock, have_gpu, chosen_gpus.ids, say)
    env_info.update(engine_facts)
    env_info.update(host.describe() if have_gpu and host is not None else {"gpu": "none", "driver": None})
    dataset_info = workload_mod.write_dataset(w, model_obj.target, base_dir / f"workload-{w.name}.jsonl")
    # the image's own root and variables (its ENV sets the same), as smoke runs it; a process: the cell's
    setting = caches.of_image(found.labels) if run.launcher == "docker" else caches.of_cell(cell, cache_root)
    opts = run_mod.BenchOptions(strategies=chosen, workload=w, model=model_obj, repeats=repeats, warmup=not no_warmup,
                                boot_timeout=run.boot_timeout,
                                client_python=client_python,
                                extra_args=run.engine_args, extra_env=run.env, out_dir=base_dir, slo_ttft_ms=slo,
                                lossless=not no_lossless, gpus=have_gpu, tp=run.tp, caches=setting)
    head = {"environment": env_info, "client": client.NAME, "workload": {**w.to_json(), "dataset": dataset_info},
            "slo": {"ttft_ms": slo}, "lossless_threshold": bench_data["lossless"]["threshold"]}
    doc = _bench_strategies(cell, lch, opts, Path(dataset_info["path"]), head, base_dir, say)
    paths = results.write(doc, base_dir)
    click.echo(json.dumps(doc, indent=1) if as_json else results.table(doc))
    if not as_json:
        click.echo("results: " + " ".join(str(p) for k, p in paths.items() if k != "png_missing"))
        if "png_missing" in paths:
            click.echo(f"no PNG: {paths['png_missing']}")
    if doc["failures"]:
        raise Failed()


def _launcher(run, cell, found, dock, have_gpu: bool, gpu_ids: tuple[int, ...], say):
    """The launcher of the benchmark's boots, and what the result's environment says of the engine it runs: the
    image read (by digest: never a tag moved since) in a container, or the engine of --python's environment."""
    from ..deploy import subject
    from ..deploy.runtime import engine

    recipe = cell.engine_recipe
    if run.launcher == "docker":
        run_ref = subject.pinned(found, dock, say)
        lch = engine.DockerLauncher(run_ref, gpus=have_gpu, client=dock, gpu_ids=gpu_ids)
        engine_name, engine_version = found.engine()
        return lch, {"image_id": run_ref, "engine": engine_name, "engine_version": engine_version,
                     "cuda": found.labels.get(labels_mod.CUDA)}
    lch = engine.ProcessLauncher(python=run.python, gpus=have_gpu, extra_env=dict(run.env), gpu_ids=gpu_ids)
    probe = lch.probe("env", {"dists": [recipe.pypi], "torch": bool(cell.torch)}, {}, 300).result() or {}
    return lch, {"engine": cell.engine, "engine_version": (probe.get("dists") or {}).get(recipe.pypi),
                 "cuda": probe.get("torch_cuda") or cell.cuda, "torch": probe.get("torch"),
                 "python": probe.get("python")}


def _bench_strategies(cell, lch, opts, dataset: Path, head: dict, base_dir: Path, say) -> dict:
    """Each strategy of opts booted and measured in turn (a failure recorded, the next one run); the result so far
    written after each, so what is done survives an interrupted run. The result: `head`, the rows and failures."""
    from ..deploy.bench import run as run_mod

    rows, failures = [], []
    t_all = time.monotonic()

    def document() -> dict:
        return {**head, "rows": rows, "failures": failures, "seconds": round(time.monotonic() - t_all, 1)}

    for name in opts.strategies:
        strat = run_mod.NO_SPECULATION if name == NONE else cell.engine_recipe.strategy(name)
        say(f"[{name}] starting {cell.engine} ({lch.name})")
        t0 = time.monotonic()
        try:
            row = run_mod.bench_strategy(cell, lch, strat, opts, dataset, say)
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
        except run_mod.BenchFailed as exc:
            failures.append({"strategy": name, "why": exc.why, "log_tail": exc.tail})
            say(f"[{name}] FAILED: {exc.why}\n{exc.tail}")
        run_mod.lossless(rows, float(head["lossless_threshold"]))
        results.write(document(), base_dir, png=False)  # what is done so far survives an interrupted run
    return document()


@bench.command("diff", epilog=EPILOG)
@click.argument("old")
@click.argument("new")
@click.option("--min-change", type=flags.Number(0, 10, "a relative change"), default=None,
              help="Smallest relative change that counts, e.g. 0.05 (default: the data's).")
@flags.as_json
def diff_cmd(old, new, min_change, as_json):
    """Compare two bench results, OLD and NEW (bench.json files bench run wrote); exit 1 on a regression beyond the noise of their repeats.

    \b
    Example:
      builder bench diff last-week/bench.json today/bench.json --min-change 0.05
    """
    entries, problems = results.diff(results.load(old), results.load(new), min_change)
    if problems:
        raise UserError("; ".join(problems))
    if as_json:
        click.echo(json.dumps(entries, indent=1))
    else:
        click.echo(results.diff_table(entries))
    bad = [e for e in entries if e["regression"]]
    if bad:
        click.echo(f"{len(bad)} regression(s): " + ", ".join(f"{e['strategy']} {e['figure']} {e['change']:+.1%}"
                                                             for e in bad), err=True)
        raise Failed()


@bench.command("plot", epilog=EPILOG)
@click.argument("results_json", nargs=-1, required=True)
@click.option("-o", "--output", default="bench.png", show_default=True, help="The PNG file to write.")
def plot_cmd(results_json, output):
    """Draw the PNG of one or more results, RESULTS_JSON... (bench.json files; several engines in one chart).

    \b
    Example:
      builder bench plot logs/bench/*/bench.json -o bench.png
    """
    dest = Path(output)
    if dest.suffix.lower() != ".png":
        raise UserError(f"-o {output}: the chart is a PNG; name a file ending in .png")
    files.writable_dir(dest.parent, "-o")
    click.echo(results.plot([results.load(p) for p in results_json], dest))
