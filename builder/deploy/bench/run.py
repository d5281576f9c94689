"""One engine boot per strategy (builder/deploy/runtime/engine.py: the launchers, the running engine and its boot loop,
shared with smoke L3; the smoke launch line): readiness, the first request's TTFT, one discarded warm-up pass of
the workload itself (the first pass after a boot runs slower: graphs captured, kernels compiled and cached for
its shapes), then the load generator `repeats` times, the engine's own speculative-decoding figures (/metrics
deltas around each run; SGLang's server info), peak GPU memory (nvidia-smi, sampled through the boot and the
runs) and the greedy outputs of the losslessness prompts. The engine is always stopped."""

from __future__ import annotations

import os
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet

from ...engines import Strategy
from ...errors import UserError
from ...resolve import Cell
from ..runtime import gpus as gpus_mod
from ..runtime.caches import NONE as NO_CACHES
from ..runtime.caches import CacheSetting
from ..runtime.engine import (HUB_OFF, BootFailed, DockerLauncher, Launcher, RunningEngine, StartFailed, find_key,
                              free_port, kv_cache_tokens)
from ...image.launchline import LaunchLine
from ..smoke import layers
from ..strategies import NONE
from . import client, data
from .workload import Workload

NO_SPECULATION = Strategy(name=NONE, versions=SpecifierSet(), why_not="", flags=())


def launch_line(cell: Cell, launcher: Launcher, opts: layers.SmokeOptions, strategy: Strategy, port: int) -> LaunchLine:
    """The engine's launch line for one strategy: builder/image/launchline.py, the one derivation of the image's
    ENTRYPOINT, `builder serve` and smoke L3 (bench calls it here only)."""
    return layers.engine_line(cell, launcher, opts, strategy, port)


@dataclass
class BenchOptions:
    strategies: tuple[str, ...]
    workload: Workload
    model: layers.Model
    repeats: int = 3
    warmup: bool = True  # one discarded pass of the workload before the measured repeats
    boot_timeout: float = 900.0
    client_python: str = "python3"
    client_env: dict[str, str] = field(default_factory=dict)
    client_timeout: float = 1800.0
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    out_dir: Path = Path("logs/bench")
    slo_ttft_ms: float | None = None
    lossless: bool = True
    gpus: bool = True
    tp: int = 1  # tensor parallel: the engine's own flag for this many GPUs (--tp)
    # the engine's compile caches (runtime/caches.py): the root watched (a path in the image, or this host's
    # directory for a process), the variables that put them there (an image sets its own too), whether the image
    # has a warm layer (an allowance)
    caches: CacheSetting = NO_CACHES


class GpuMemory:
    """Peak memory used on every GPU nvidia-smi lists, sampled every half second while running."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.baseline: list[int] | None = None
        self.peak: list[int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        if self.enabled:
            self.baseline = gpus_mod.memory_used()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(0.5):
            s = gpus_mod.memory_used()
            if s is not None:
                self.peak = s if self.peak is None else [max(a, b) for a, b in zip(self.peak, s)]

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=15)

    def figures(self) -> dict:
        if self.peak is None:
            return {"peak_gpu_memory_mib": None}
        return {"peak_gpu_memory_mib": max(self.peak), "gpu_memory_before_mib": max(self.baseline or [0]),
                "peak_gpu_memory_per_gpu_mib": self.peak}


def boot_state(written, container: bool, warm_layer: bool) -> str:
    """How the engine's compile caches stood at boot, as measured under the cache root (`written`: what the run found
    there and wrote, caches.Written; None: no root watched): "cold" (the root held nothing), "restored" (a container
    whose image brought a warm layer's files: every container starts from the image's root), "warm" (a process's
    root held files an earlier boot or a restored layer left: the process route does not tell those apart), "prebuilt"
    (an image without a warm layer whose root held files: jit = "prebuilt"), "unknown" (no root watched)."""
    if written is None or written.held_before is None:
        return "unknown"
    if written.held_before == 0:
        return "cold"
    if container:
        return "restored" if warm_layer else "prebuilt"
    return "warm"


def greedy_outputs(engine: RunningEngine, model_name: str, prompts: list[str], max_tokens: int,
                   timeout: float) -> list[str]:
    out = []
    for p in prompts:
        r = engine.post(engine.completions, {"model": model_name, "prompt": p, "max_tokens": max_tokens,
                                             "temperature": 0.0, "seed": 0}, timeout)
        out.append((r.get("choices") or [{}])[0].get("text", ""))
    return out


def spec_figures(smoke: dict, before: dict, after: dict, server_info: dict | None) -> dict:
    """The engine's own view of speculative decoding over one run: counter deltas (vLLM: drafts, draft tokens,
    accepted; acceptance length = 1 + accepted / drafts as vLLM reports it), SGLang's accept-length gauge and
    server info."""
    names = smoke.get("spec_metrics", {})
    out: dict = {}
    for key in ("drafts", "draft_tokens", "accepted"):
        name = names.get(key)
        if name and name in after:
            out[f"spec_{key}"] = int(after[name] - before.get(name, 0.0))
    drafts, tokens, accepted = out.get("spec_drafts"), out.get("spec_draft_tokens"), out.get("spec_accepted")
    if tokens:
        out["spec_acceptance_rate"] = round((accepted or 0) / tokens, 4)
    if drafts and accepted is not None:
        out["spec_acceptance_length"] = round(1 + accepted / drafts, 4)
    # SGLang's gauge reads 0 on a server that never speculated (the H200 run without speculation): an acceptance
    # length is at least 1 (the verified token), so 0 is no figure
    if names.get("accept_length") and after.get(names["accept_length"], 0.0) >= 1.0:
        out["spec_acceptance_length"] = round(after[names["accept_length"]], 4)
    if server_info:
        value = find_key(server_info, "avg_spec_accept_length")
        if value is not None:
            out["spec_acceptance_length_server_info"] = value
    return out


def cross_check(engine: dict) -> str | None:
    """Where the client measured acceptance too (vLLM's client reads the same counters): do they agree?"""
    c = engine.get("client_spec_decode")
    if not c or "spec_draft_tokens" not in engine:
        return None
    same = c.get("spec_decode_draft_tokens") == engine["spec_draft_tokens"] and \
        c.get("spec_decode_accepted_tokens") == engine.get("spec_accepted")
    return "agrees" if same else (f"differs: client {c.get('spec_decode_draft_tokens')} draft / "
                                  f"{c.get('spec_decode_accepted_tokens')} accepted tokens, engine "
                                  f"{engine['spec_draft_tokens']} / {engine.get('spec_accepted')}")


def median_and_spread(runs: list[dict], keys) -> tuple[dict, dict]:
    med, spread = {}, {}
    for k in keys:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        if not vals:
            med[k] = None
            continue
        m = statistics.median(vals)
        med[k] = m
        spread[k] = {"min": min(vals), "max": max(vals),
                     "stdev": round(statistics.stdev(vals), 4) if len(vals) > 1 else 0.0,
                     "relative": round((max(vals) - min(vals)) / m, 4) if m else 0.0}
    return med, spread


SUMMARY_KEYS = ["request_throughput", "output_throughput", "request_goodput", "duration", "completed", "errors",
                *[f"{m}_ms_p{p}" for m in client.METRICS for p in client.PERCENTILES]]


def bench_strategy(cell: Cell, launcher: Launcher, strategy: Strategy, opts: BenchOptions, dataset: Path,
                   say=lambda s: None) -> dict:
    """One row (before losslessness is compared): boots, drives, stops."""
    eng = cell.engine_recipe
    smoke = eng.smoke
    if not eng.launch or not eng.health:
        raise UserError(f"the engine data has no launch line or health path for {cell.engine} {cell.version}")
    bench_data = data()
    tiny_args = bench_data.get("engines", {}).get(cell.engine, {}).get("tiny_args", []) if opts.model.tiny else []
    smoke_opts = layers.SmokeOptions(strategies=(strategy.name,), model=opts.model, gpus=opts.gpus,
                                     extra_args=tuple(tiny_args) + tuple(opts.extra_args), extra_env=opts.extra_env,
                                     log_dir=opts.out_dir, boot_timeout=opts.boot_timeout, tp=opts.tp)
    port = free_port()
    line = launch_line(cell, launcher, smoke_opts, strategy, port)
    env = {**HUB_OFF, **opts.caches.env, **dict(strategy.env), **opts.extra_env}
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = (opts.out_dir / f"{cell.id}-{strategy.name}-{opts.workload.name}.log").resolve()
    row: dict = {"strategy": strategy.name, "workload": opts.workload.name, "argv": line.argv,
                 "env": {k: v for k, v in env.items() if k not in HUB_OFF}, "log": str(log_path)}
    with GpuMemory(opts.gpus) as mem:
        try:
            engine = RunningEngine.start(launcher, line, env, port, log_path, eng.health,
                                         smoke.get("completions", "/v1/completions"), watch_root=opts.caches.root)
        except StartFailed as exc:
            raise BenchFailed(strategy.name, str(exc)) from None
        try:
            try:
                row["boot_s"] = engine.wait_ready(opts.boot_timeout)
            except BootFailed as exc:
                raise BenchFailed(strategy.name, exc.why, exc.tail) from None
            say(f"[{strategy.name}] ready in {row['boot_s']}s")
            row["kv_cache_tokens"] = kv_cache_tokens(engine.log_text())
            name = engine.models() or launcher.where(opts.model.target)
            first = engine.complete(name, layers.PROMPT, 16, 600)  # the first request after boot: JIT, graphs
            row["first_request_ttft_s"] = round(first["ttft_s"], 4) if first["ttft_s"] is not None else None
            row["first_request_latency_s"] = round(first["latency_s"], 4)

            def drive(label: str):
                args = client.argv(opts.client_python, engine.base, name, str(opts.model.target), dataset,
                                   opts.workload.requests, opts.workload.concurrency, opts.workload.output_tokens,
                                   opts.workload.seed, opts.out_dir, f"client-{strategy.name}-{label}.json",
                                   opts.slo_ttft_ms)
                try:
                    return args, client.run(args, {**os.environ, **opts.client_env}, opts.client_timeout)
                except client.ClientFailed as exc:
                    raise BenchFailed(strategy.name, str(exc), exc.tail()) from None

            if opts.warmup:  # the workload's own shapes once, discarded: what a first pass pays is not measured
                _, done = drive("warmup")
                figs = client.figures(done.result)
                rate = figs.get("request_throughput")
                row["warmup"] = {"request_throughput": rate, "client_seconds": round(done.seconds, 2)}
                say(f"[{strategy.name}] warm-up pass (discarded): {'-' if rate is None else f'{rate:.2f}'} req/s "
                    f"in {done.seconds:.1f}s")
            row["client_argv"], runs = _measured_runs(engine, drive, smoke, opts, strategy.name, say)
            _summarise(row, runs, opts, int(bench_data["diff"]["min_repeats"]))
            if opts.lossless:
                ll = bench_data["lossless"]
                row["greedy_outputs"] = greedy_outputs(engine, name, list(ll["prompts"]), int(ll["max_tokens"]), 300)
        finally:
            _cache_figures(row, engine.stop(), isinstance(launcher, DockerLauncher), opts.caches.warm)
    row.update(mem.figures())
    return row


def _measured_runs(engine: RunningEngine, drive, smoke: dict, opts: BenchOptions, strategy: str,
                   say) -> tuple[list[str] | None, list[dict]]:
    """The measured repeats of the workload on one boot, each with the engine's own speculative-decoding figures
    (/metrics deltas around it, its server info) cross-checked: the last run's client argv, and the runs."""
    runs, args = [], None
    for i in range(opts.repeats):
        _, before = engine.metrics()
        args, done = drive(str(i))
        _, after = engine.metrics()
        info = None
        if smoke.get("server_info"):
            _, info = engine.get_json(smoke["server_info"])
        figs = client.figures(done.result)
        figs.update(spec_figures(smoke, before, after, info))
        figs["client_seconds"] = round(done.seconds, 2)
        check = cross_check(figs)
        if check:
            figs["spec_cross_check"] = check
        runs.append(figs)
        rate, ttft = figs["request_throughput"], figs["ttft_ms_p99"]
        say(f"[{strategy}] run {i + 1}/{opts.repeats}: "
            f"{'-' if rate is None else f'{rate:.2f}'} req/s, "
            f"TTFT p99 {'-' if ttft is None else f'{ttft:.0f}'} ms in {done.seconds:.1f}s")
    return args, runs


def _summarise(row: dict, runs: list[dict], opts: BenchOptions, min_repeats: int) -> None:
    """The runs into the row: each figure's median and spread, whether `bench diff` can judge it, the SLO."""
    row["runs"] = runs
    spec_keys = sorted({k for r in runs for k in r if k.startswith("spec_") and k != "spec_cross_check"})
    med, spread = median_and_spread(runs, SUMMARY_KEYS + spec_keys)
    row.update(med)
    row["spread"] = spread
    row["repeats"] = len(runs)
    row["comparable"] = len(runs) >= min_repeats  # what `bench diff` can judge
    if opts.slo_ttft_ms is not None and row.get("ttft_ms_p99") is not None:  # the article's target: P99
        row["slo_ttft_p99_met"] = row["ttft_ms_p99"] < opts.slo_ttft_ms
    checks = {r.get("spec_cross_check") for r in runs if r.get("spec_cross_check")}
    if checks:
        row["spec_cross_check"] = "; ".join(sorted(checks))


def _cache_figures(row: dict, written, container: bool, warm: bool) -> None:
    """Measured, not read from a label: how the caches stood at boot (boot_state) and, with a root watched, what it
    held then and what this run compiled into it (caches.Written)."""
    row["boot_state"] = boot_state(written, container, warm)
    if written is not None:
        row.update(cache_root=written.root, cache_files_at_boot=written.held_before,
                   cache_files_written=len(written.files), cache_bytes_written=written.bytes,
                   cache_written=sorted(written.files)[:50])


def lossless(rows: list[dict], threshold: float) -> None:
    """Each strategy's greedy outputs against the no-speculation row's: match rate in the row, flagged below
    the threshold."""
    base = next((r for r in rows if r["strategy"] == NONE and r.get("greedy_outputs")), None)
    for r in rows:
        outs = r.get("greedy_outputs")
        if r["strategy"] == NONE or not outs:
            continue
        if base is None:
            r["lossless_match_rate"], r["lossless"] = None, "no baseline: add --strategy none"
            continue
        same = sum(a == b for a, b in zip(outs, base["greedy_outputs"]))
        r["lossless_match_rate"] = round(same / len(outs), 4)
        r["lossless"] = "ok" if r["lossless_match_rate"] >= threshold else \
            f"FLAGGED: {same}/{len(outs)} greedy outputs equal no speculation's (threshold {threshold:g})"


class BenchFailed(Exception):
    def __init__(self, strategy: str, why: str, tail: str = ""):
        super().__init__(f"{strategy}: {why}")
        self.strategy, self.why, self.tail = strategy, why, tail
