"""The four smoke layers for one image (or Python environment) of a cell, read from the engine data.

- L0 metadata: the image's labels name the cell, and the engine, torch, CUDA and Python versions inside equal
  the plan.
- L1 inside: the engine, its serving modules and every compiled extension of the cell's packages import (or,
  for a library that needs the NVIDIA driver, are known to need it); the audit of those files passes for the
  cell's archs; the engine's own runtime checks (e.g. vLLM's has_flashinfer()) pass; the tools its JIT paths
  need are on PATH.
- JIT: what the engine compiles at its first request (engine data serve_jit: Triton's launcher and a kernel for
  each of the cell's archs, FlashInfer's nvcc link, a C extension against the Python headers; and jit_modules: the
  engine's own JIT modules, e.g. FlashInfer's fp8_blockscale_gemm_sm90, built through the framework's own
  generators for each of the cell's archs in the families that select them) is compiled inside the image without
  a GPU, so an image that would fail at its first request (no Python.h, no C compiler, no
  libcuda to link) fails here, before tag and publish. Its own layer, after L1 (it needs the imports L1 proves)
  and before L2: per image like L1, it is the slowest GPU-free layer, and its table column names the piece
  that is missing.
- L2 per strategy: the engine's own argument parser accepts the strategy's flags and resolves them to the
  values the data expects (and, where the data names one, the engine's own name resolution accepts the
  value: SGLang's parser lets any --speculative-algorithm through).
- L3 per strategy, on a GPU host: boot with the model read-only and hub access off, wait for readiness while
  the log streams to a file, one completion must return text, speculative decoding must be seen to run
  (counters rise, draft tokens = drafts × K where the data says so, the server's own view of its
  speculative settings), with boot time, time to first token, latency and output tokens/s.

A layer runs only when the lower layers that were asked for passed (for L2/L3: for the same strategy); a
strategy the engine version cannot run is refused from the data, with the data's reason, before L2.
"""

from __future__ import annotations

import fnmatch

import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ... import archs as archs_mod
from ...image import labels as labels_mod
from ...engines import Strategy
from ...image.launchline import LaunchLine, fill, launch_line
from ...resolve import Cell
from . import shapemodel, tinymodel
from ..runtime.caches import NONE as NO_CACHES
from ..runtime.caches import CacheSetting
from ..runtime.engine import (HUB_OFF, BootFailed, Launcher, ProbeRun, RunningEngine, StartFailed, find_key, free_port,
                              kv_cache_tokens, port_in_use)
from .report import FAIL, LAYERS, PASS, SKIP, Result, SmokeReport

PROMPT = "The capital of France is"


@dataclass(frozen=True)
class Model:
    target: Path
    drafter: str | Path | None = None  # a local drafter directory, or None for the data's default
    tiny: bool = False  # a generated model (tiny, shape:NAME): served with dummy weights and smoke's tiny_args
    generated: str = ""  # the --model value of a generated model ("tiny", "shape:27b"); "" for a checkpoint

    @property
    def has_weights(self) -> bool:
        return any(self.target.glob("*.safetensors")) or any(self.target.glob("*.bin"))

    @property
    def label(self) -> str:
        """What a record says the model was: the generated model's name, else the checkpoint's directory."""
        return self.generated or ("tiny" if self.tiny else str(self.target))

    @classmethod
    def resolve(cls, spec: str, drafter: str | None = None, cache_dir: Path | None = None) -> "Model":
        """--model: 'tiny' (tinymodel.py), shape:NAME (a published shape, shapemodel.py), both generated into the
        cache, or a local checkpoint directory."""
        from ...errors import UserError

        if spec == "tiny":
            tm = tinymodel.ensure(cache_dir)
            return cls(tm.target, Path(drafter) if drafter else tm.drafter, tiny=True, generated="tiny")
        if shapemodel.is_shape(spec):
            shapemodel.check(spec)
            target = shapemodel.ensure(shapemodel.shape_of(spec), cache_dir)
            return cls(target, Path(drafter) if drafter else None, tiny=True, generated=spec)
        target = Path(spec)
        if not (target / "config.json").is_file():
            raise UserError(f"--model {spec}: not a model directory (no config.json); give a local checkpoint, "
                            f"'tiny' or {' / '.join(shapemodel.known())} (hub access is off during smoke)")
        d = Path(drafter) if drafter and Path(drafter).is_dir() else drafter
        return cls(target.resolve(), d)


@dataclass
class SmokeOptions:
    strategies: tuple[str, ...]
    model: Model
    layers: tuple[str, ...] = LAYERS
    gpus: bool = False  # start the engine with the GPUs (L3 is skipped without them unless forced)
    gpu_ids: tuple[int, ...] = ()  # only these GPUs (--gpus 0,1); () every one
    tp: int = 1  # tensor parallel: the engine's own flag for this many GPUs (--tp)
    l3_without_gpu: bool = False  # --gpus none: run L3 anyway (CPU engines, test doubles)
    no_gpu_reason: str = "this host has no NVIDIA GPU"
    gpu_arch: int | None = None
    boot_timeout: float = 900.0
    request_timeout: float = 300.0
    port: int | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path("logs/smoke")
    probe_timeout: float = 600.0
    max_tokens: int = 64
    # the compile caches (runtime/caches.py: an image's labels, or the cell's engine data for a process): L3 boots
    # with their variables and watches their root; `capture_to` receives what the boot wrote there (builder warm);
    # with an allowance (a warm layer) a boot that writes anything else there fails
    caches: CacheSetting = NO_CACHES
    capture_to: Path | None = None
    # --image-paths (process route): the engine runs at the image's paths (image/launchline.ImagePaths), as checked
    paths: object = None
    # the GPU the engine gets (runtime/gpus.Gpu; None: none, or not read): a warm layer's key is judged against it
    gpu: object = None
    warm_keys: object = None  # the key data (runtime/warmkey.of_knowledge: a matrix's extra engine files too); None built-in

    @property
    def cache_root(self) -> str:
        """The cache root L3 watches ("" none): caches.root, read only."""
        return self.caches.root


# -- small helpers -----------------------------------------------------------------------------------------
def _same_version(found: str | None, planned: str) -> bool:
    if found is None:
        return False
    try:
        return Version(found).public == Version(planned).public
    except InvalidVersion:
        return found == planned


def _major_minor(v: str | None) -> str:
    return ".".join((v or "").split(".")[:2])


def _probe_failure(run: ProbeRun, what: str) -> str:
    return f"the {what} probe did not report (exit {run.returncode}):\n{run.tail()}"


# -- L0 ----------------------------------------------------------------------------------------------------
LABEL_FIELDS = labels_mod.PLAN_FIELDS


def l0(cell: Cell, launcher: Launcher, labels: dict | None, opts: SmokeOptions,
       entrypoint: list[str] | None = None) -> Result:
    problems, seen = [], {}
    if labels is not None:
        want_entry = launch_line(cell.engine_recipe, None, {}).entrypoint
        if tuple(entrypoint or ()) != want_entry:  # what `builder serve` and L3 run: the image's own ENTRYPOINT
            problems.append(f"the image's ENTRYPOINT is {entrypoint!r}, the engine's launch line starts "
                            f"{list(want_entry)!r}")
        if labels_mod.cell(labels) is None:
            return Result("L0", None, FAIL, "the image carries no io.builder.* labels: it was not built by builder")
        for label, attr in LABEL_FIELDS:
            want = str(getattr(cell, attr))
            if labels.get(label, "") != want:
                problems.append(f"label {label} is {labels.get(label)!r}, the plan says {want!r}")
        want_archs = ",".join(map(str, cell.archs))
        if labels.get(labels_mod.ARCHS) != want_archs:
            problems.append(f"label {labels_mod.ARCHS} is {labels.get(labels_mod.ARCHS)!r}, the plan says {want_archs!r}")
    dists = {p.recipe.pypi: p.version for p in cell.packages}
    run = launcher.probe("env", {"dists": sorted(dists), "torch": bool(cell.torch)}, {}, opts.probe_timeout)
    env = run.result()
    if env is None or "error" in env:
        return Result("L0", None, FAIL, _probe_failure(run, "env") if env is None else env["error"])
    for dist, want in sorted(dists.items()):
        found = env["dists"].get(dist)
        seen[dist] = found
        if not _same_version(found, want):
            problems.append(f"{dist} {found or 'is not installed'}{'' if found is None else ''}, the plan says {want}")
    if _major_minor(env["python"]) != cell.python:
        problems.append(f"Python {env['python']}, the plan says {cell.python}")
    seen["python"] = env["python"]
    if cell.torch:
        seen["torch"], seen["torch_cuda"] = env.get("torch"), env.get("torch_cuda")
        if env.get("torch_error") or not _same_version(env.get("torch"), cell.torch):
            problems.append(f"torch {env.get('torch') or env.get('torch_error')}, the plan says {cell.torch}")
        if _major_minor(env.get("torch_cuda")) != _major_minor(cell.cuda):
            problems.append(f"torch is built for CUDA {env.get('torch_cuda')}, the plan says {cell.cuda}")
    else:
        cuda = env.get("cuda_env") or ""
        majors = {f.split(".so.")[1].split(".")[0] for f in env.get("libcudart", [])}
        seen["cuda"] = cuda or ",".join(sorted(majors)) or None
        if cuda and _major_minor(cuda) != _major_minor(cell.cuda):
            problems.append(f"CUDA_VERSION {cuda}, the plan says {cell.cuda}")
        elif not cuda and majors and cell.cuda.split(".")[0] not in majors:
            problems.append(f"libcudart.so.{','.join(sorted(majors))}, the plan says CUDA {cell.cuda}")
    if problems:
        return Result("L0", None, FAIL, "\n".join(problems), figures=seen)
    where = "labels and versions" if labels is not None else "versions (no image: the process launcher has no labels)"
    return Result("L0", None, PASS, f"{where} match the plan", figures=seen)


# -- L1 ----------------------------------------------------------------------------------------------------
def l1(cell: Cell, launcher: Launcher, opts: SmokeOptions, audit_files) -> Result:
    eng = cell.engine_recipe
    smoke = eng.smoke
    modules = list(dict.fromkeys([cell.engine.replace("-", "_"), *getattr(eng, "serve_modules", ()),
                                  *smoke.get("imports", [])]))
    compiled = [p for p in cell.packages if p.recipe.compiled]
    spec = {"torch": bool(cell.torch), "modules": modules, "dists": [p.recipe.pypi for p in compiled],
            "checks": list(getattr(eng, "runtime_checks", ())), "tools": list(smoke.get("jit_tools", []))}
    env = dict(smoke.get("cpu_env", {})) if not launcher.gpus else {}
    run = launcher.probe("imports", spec, env, opts.probe_timeout)
    res = run.result()
    if res is None or "error" in res:
        return Result("L1", None, FAIL, _probe_failure(run, "imports") if res is None else res["error"])
    problems, notes, figures = [], [], {}
    for mod, (status, detail) in res["modules"].items():
        if status != "ok":
            problems.append(f"import {mod}: {detail}")
    by = {}
    for e in res["extensions"]:
        by.setdefault(e["status"], []).append(e)
    for e in by.get("failed", []):
        problems.append(f"{e['dist']}: {e['file'] or ''} does not load: {e['detail']}")
    if by.get("needs-driver"):
        names = ", ".join(e["file"] for e in by["needs-driver"])
        if launcher.gpus:
            problems += [f"{e['file']} does not load even with the GPUs: {e['detail']}" for e in by["needs-driver"]]
        else:
            notes.append(f"{len(by['needs-driver'])} need the NVIDIA driver (libcuda), absent here: {names}")
    figures["extensions_loaded"] = len(by.get("ok", []))
    figures["extensions_for_other_pythons"] = len(by.get("other-python", []))
    for c in res["checks"]:
        if c["error"]:
            problems.append(f"runtime check failed: {c['error']}")
    for tool, path in res["tools"].items():
        if not path:
            problems.append(f"{tool} is not on PATH: the engine's JIT kernels need it")
    # the audit of what is installed: every binary of the cell's compiled packages, for the cell's archs
    if compiled:
        report = audit_files(res["so_files"], list(cell.archs), [s for p in cell.packages for s in p.arch_scoped])
        figures["binaries_audited"] = len(report.binaries)
        figures["binaries_with_device_code"] = sum(1 for b in report.binaries if b.has_device_code)
        for b in report.failures:
            problems.append(f"audit: {b.path}: {b.status}")
    if problems:
        return Result("L1", None, FAIL, "\n".join(problems + notes), figures=figures)
    what = f"{', '.join(modules)} import; {figures['extensions_loaded']} compiled extensions load"
    if compiled:
        what += f"; audit passes for {', '.join(map(archs_mod.sm, cell.archs))} ({figures['binaries_with_device_code']} binaries with device code)"
    if notes:
        what += "; " + "; ".join(notes)
    return Result("L1", None, PASS, what, figures=figures)


# -- JIT ---------------------------------------------------------------------------------------------------
def jit_spec(cell: Cell) -> dict:
    """What the probe's jit command builds: the serve-time paths' probes, and each JIT module the engine builds for
    the cell's archs in its families (engine data jit_modules), with its framework's settings. A prebuilt image's
    modules are built against the image's own JIT cache: they must all be there already."""
    modules = [{"name": m["name"], "generator": m["generator"], "kwargs": m["kwargs"], "objects": m["objects"],
                "build": m["build"], "archs": m["archs"], "runs": [list(r) for r in cell.jit_runs(m)],
                "arch_env": m["arch_env"], "arch_context": m["arch_context"], "answer_gpu": m["answer_gpu"],
                "cache_env": m["cache_env"], "cache_dir": m["cache_dir"] if cell.jit_prebuilt else None}
               for m in cell.jit_builds]
    return {"paths": list(dict.fromkeys(p["probe"] for p in cell.serve_jit)), "archs": list(cell.archs),
            "modules": modules}


def _module_line(name: str, got: dict) -> str:
    size = f", {got['library_bytes'] / 2**20:.2f} MiB" if got.get("library_bytes") else ""
    return f"{name} ({got.get('seconds', 0):g}s{size})"


def jit(cell: Cell, launcher: Launcher, opts: SmokeOptions) -> Result:
    paths = list(cell.serve_jit)
    builds = cell.jit_builds
    if not paths and not builds:
        return Result("JIT", None, SKIP, f"the engine data names nothing that {cell.engine} {cell.version} compiles "
                                         "at its first request (serve_jit, jit_modules)")
    spec = jit_spec(cell)
    n_builds = sum(len(cell.jit_runs(m)) for m in builds)
    run = launcher.probe("jit", spec, {}, opts.probe_timeout * (1 + n_builds))
    res = run.result()
    if res is None or "error" in res:
        return Result("JIT", None, FAIL, _probe_failure(run, "jit") if res is None else res["error"])
    problems, done, figures = [], [], {}
    for p in paths:
        got = res["paths"].get(p["probe"], {"ok": False, "error": "the probe did not report this path"})
        figures[p["name"]] = {"seconds": got.get("seconds"), **(got.get("detail") or {})}
        if got["ok"]:
            done.append(f"{p['name']} ({got.get('seconds', 0):g}s)")
        else:
            problems.append(f"{p['name']}: {got['error']}\n  needed because: {p['why']}")
    for m in builds:
        for label, _arch in cell.jit_runs(m):
            key = f"{m['name']}@{label}"
            got = (res.get("modules") or {}).get(key, {"ok": False, "error": "the probe did not report this module"})
            figures[key] = {k: got.get(k) for k in ("seconds", "library", "library_bytes", "built", "needed", "error")
                            if got.get(k) is not None}
            if not got["ok"]:
                problems.append(f"{key} ({m['generator']}): {got['error']}\n  selected by: {m['selected_by']}")
            elif cell.jit_prebuilt and got.get("built"):
                problems.append(f"{key}: the image is built with jit = \"prebuilt\", yet building it made "
                                f"{got['built']} objects / libraries again: its JIT cache ({m['cache_dir']}) did not "
                                "hold them")
            else:
                done.append(_module_line(key, got) + (" prebuilt, nothing compiled" if cell.jit_prebuilt else ""))
    if problems:
        return Result("JIT", None, FAIL, "\n".join(problems), figures=figures)
    return Result("JIT", None, PASS, f"compiled in the image for {', '.join(map(archs_mod.sm, cell.archs))}: "
                  + ", ".join(done), figures=figures)


# -- L2 ----------------------------------------------------------------------------------------------------
def placeholders(cell: Cell, launcher: Launcher, opts: SmokeOptions, strategy: Strategy, port: int = 0) -> dict[str, str]:
    model = opts.model
    drafter = model.drafter if model.drafter is not None else strategy.drafter
    if isinstance(drafter, Path):
        drafter = launcher.where(drafter)
    return {"model": launcher.where(model.target), "drafter": str(drafter or ""), "host": launcher.host,
            "port": str(port)}


def strategy_argv(strategy: Strategy, values: dict[str, str]) -> list[str]:
    return [fill(f, values) for f in strategy.flags]


def l2(cell: Cell, launcher: Launcher, opts: SmokeOptions, strategies: list[Strategy]) -> list[Result]:
    smoke = cell.engine_recipe.smoke
    if not smoke.get("args_class"):
        return [Result("L2", s.name, SKIP, f"the engine data names no argument parser for {cell.engine} {cell.version}")
                for s in strategies]
    cases, read = [], {}
    for s in strategies:
        values = placeholders(cell, launcher, opts, s)
        read[s.name] = {k: (fill(v, values) if isinstance(v, str) else v) for k, v in s.expect}
        argv = [smoke.get("model_flag", "--model"), values["model"], *strategy_argv(s, values)]
        cases.append({"name": s.name, "argv": argv, "read": [k for k in read[s.name] if "@" not in k]})
    spec = {"args_class": smoke["args_class"], "parser": list(smoke.get("parser", ["argparse:ArgumentParser"])),
            "cases": cases, "name_resolver": smoke.get("name_resolver")}
    env = dict(smoke.get("cpu_env", {})) if not launcher.gpus else {}
    for s in strategies:
        env.update(dict(getattr(s, "env", ())))
    t0 = time.monotonic()
    run = launcher.probe("parse", spec, {**env, **HUB_OFF}, opts.probe_timeout)
    res = run.result()
    secs = (time.monotonic() - t0) / max(1, len(strategies))
    if res is None or "error" in res:
        why = _probe_failure(run, "parse") if res is None else f"the engine's parser could not be built: {res['error']}"
        return [Result("L2", s.name, FAIL, why, secs) for s in strategies]
    out = []
    for s, case in zip(strategies, res["cases"]):
        argv = " ".join(case["argv"][2:])
        if not case["ok"]:
            who = ("the engine's own name resolution refuses" if case.get("stage") == "resolve"
                   else "the engine's parser refuses")
            out.append(Result("L2", s.name, FAIL, f"{who} {argv}: {case['error']}", secs))
            continue
        got = case["resolved"]
        wrong = [f"{k} = {got.get(k)!r}, expected {v!r}" for k, v in read[s.name].items() if got.get(k) != v]
        if wrong:
            out.append(Result("L2", s.name, FAIL, f"{argv} resolves to the wrong config: " + "; ".join(wrong), secs,
                              figures={"resolved": got}))
        else:
            shown = ", ".join(f"{k}={v}" for k, v in got.items())
            out.append(Result("L2", s.name, PASS, f"resolved: {shown}", secs, figures={"resolved": got}))
    return out


# -- L3 ----------------------------------------------------------------------------------------------------
def engine_line(cell: Cell, launcher: Launcher, opts: SmokeOptions, strategy: Strategy, port: int) -> LaunchLine:
    """What L3 starts: builder/image/launchline.py, the derivation of the image's ENTRYPOINT and of `builder serve`."""
    return launch_line(cell.engine_recipe, strategy, placeholders(cell, launcher, opts, strategy, port),
                       dummy_weights=not opts.model.has_weights, tiny=opts.model.tiny, extra=tuple(opts.extra_args),
                       tp=opts.tp)


def l3(cell: Cell, launcher: Launcher, opts: SmokeOptions, strategy: Strategy) -> Result:
    eng = cell.engine_recipe
    smoke = eng.smoke
    if not eng.launch or not eng.health:
        return Result("L3", strategy.name, SKIP, f"the engine data has no launch line or health path for {cell.engine} {cell.version}")
    port = opts.port or free_port()
    if port_in_use(port):
        return Result("L3", strategy.name, FAIL, f"port {port} on 127.0.0.1 is in use: the engine could not be "
                      "reached there (pick another with --port, or stop what listens on it)")
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = (opts.log_dir / f"{cell.id}-{strategy.name}-{launcher.name}.log").resolve()
    line = engine_line(cell, launcher, opts, strategy, port)
    env = {**HUB_OFF, **opts.caches.env, **dict(getattr(strategy, "env", ())), **opts.extra_env}
    # what the engine was started with: a warm layer's key (builder/deploy/runtime/warmkey.py) is read from these
    figures: dict = {"port": port, "launch_args": list(line.args),
                     "launch_env": {**dict(getattr(strategy, "env", ())), **opts.extra_env}}
    if opts.caches.warm_facts:  # judged before the boot; the boot then measures it (cache_verdict)
        figures["warm_judgement"] = warm_judgement(cell, opts, figures).to_json()
    t0 = time.monotonic()
    try:
        engine = RunningEngine.start(launcher, line, env, port, log_path, eng.health,
                                     smoke.get("completions", "/v1/completions"), watch_root=opts.caches.root)
    except StartFailed as exc:
        return Result("L3", strategy.name, FAIL, str(exc), time.monotonic() - t0, log=str(log_path))

    def fail(why: str, tail: bool = True) -> Result:
        text = why + (f"\nlast lines of the engine log:\n{engine.log_tail()}" if tail else "")
        return Result("L3", strategy.name, FAIL, text, time.monotonic() - t0, figures=figures, log=str(log_path))

    def body() -> Result:
        try:  # readiness: health 200 before the deadline, or the engine's exit, or the deadline
            figures["boot_s"] = engine.wait_ready(opts.boot_timeout)
        except BootFailed as exc:
            return fail(exc.why)
        if eng.ready_log:  # the engine's own "ready" line, a moment after health answers
            figures["ready_log_seen"] = _ready_line_seen(engine, eng.ready_log)
        name = engine.models() or launcher.where(opts.model.target)
        try:  # warm-up: the first request compiles graphs / JIT kernels
            engine.complete(name, PROMPT, 4, opts.request_timeout)
        except (OSError, ValueError) as exc:
            return fail(f"the warm-up completion failed: {exc}")
        _, before = engine.metrics()
        try:
            done = engine.complete(name, PROMPT, opts.max_tokens, opts.request_timeout)
        except (OSError, ValueError) as exc:
            return fail(f"the completion failed: {exc}")
        code, after = engine.metrics()
        figures.update({
            "ttft_s": round(done["ttft_s"], 3) if done["ttft_s"] is not None else None,
            "latency_s": round(done["latency_s"], 3),
            "output_tokens": done["output_tokens"],
            "output_tokens_per_s": round(done["output_tokens"] / done["latency_s"], 1) if done["latency_s"] else None,
            "output_text": done["text"][:120],
        })
        if not done["text"].strip():
            return fail("the completion returned no text", tail=False)
        drafts, draft_tokens, problems = _spec_metrics(smoke.get("spec_metrics", {}), strategy, code, before, after,
                                                       figures)
        if smoke.get("server_info"):
            problems += _server_info(engine, smoke["server_info"], strategy,
                                     lambda: placeholders(cell, launcher, opts, strategy, port))
        text = engine.log_text()
        tokens = kv_cache_tokens(text)
        if tokens is not None:
            figures["kv_cache_tokens"] = tokens
        for line in getattr(strategy, "forbid_log", ()):
            if line in text:
                problems.append(f"the engine log says {line!r}: the strategy did not take effect")
        if problems:
            return fail("\n".join(problems))
        why = f"ready in {figures['boot_s']:g}s; {done['output_tokens']} tokens"
        if eng.ready_log and not figures.get("ready_log_seen"):
            why += f" (note: the data's ready line {eng.ready_log!r} is not in the log)"
        if drafts is not None:
            why += f"; {int(drafts)} drafts" + (f", {int(draft_tokens)} draft tokens (= {int(drafts)} x {strategy.k})"
                                                  if draft_tokens is not None and strategy.k else "")
        return Result("L3", strategy.name, PASS, why, time.monotonic() - t0, figures=figures, log=str(log_path))

    written = None
    try:
        result = body()
    finally:
        written = engine.stop(opts.capture_to)
    return cache_verdict(result, written, opts, fail)


def _ready_line_seen(engine: RunningEngine, ready_log: str) -> bool:
    """Whether the engine's log holds its own "ready" line, looked for a few seconds after health answered."""
    for _ in range(10):
        seen = ready_log in engine.log_text()
        if seen:
            break
        time.sleep(0.5)
    return seen


def _spec_metrics(m: dict, strategy: Strategy, code: int, before: dict[str, float], after: dict[str, float],
                  figures: dict) -> tuple[float | None, float | None, list[str]]:
    """Speculative decoding seen to run, from the engine's /metrics before and after the completion (`m`: the
    engine data's spec_metrics names): drafts rose, draft tokens = drafts x K where the strategy says K, the
    acceptance length moved. The figures go into `figures`; the drafts, draft tokens and the problems found."""
    problems = []
    if code != 200 and m:
        problems.append(f"GET /metrics answered {code or 'nothing'}")

    def delta(key: str) -> float | None:
        name = m.get(key)
        if not name:
            return None
        if name not in after:
            problems.append(f"{name} is not on /metrics")
            return None
        return after[name] - before.get(name, 0.0)

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted")
    for key, value in (("drafts", drafts), ("draft_tokens", draft_tokens), ("accepted_tokens", accepted)):
        if value is not None:
            figures[key] = int(value)
    if drafts is not None and drafts <= 0:
        problems.append(f"speculative decoding did not run: {m['drafts']} did not rise ({before.get(m['drafts'], 0):g} "
                        f"before the completion, {after.get(m['drafts'], 0):g} after)")
    if drafts and draft_tokens is not None and strategy.k and draft_tokens != drafts * strategy.k:
        problems.append(f"{m['draft_tokens']} rose by {draft_tokens:g}, expected {drafts:g} drafts x K={strategy.k}")
    if draft_tokens:
        figures["acceptance_rate"] = round((accepted or 0) / draft_tokens, 3)
    if m.get("accept_length"):
        value = after.get(m["accept_length"])
        if value is None or value <= 0:
            problems.append(f"{m['accept_length']} did not move (got {value})")
        else:
            figures["accept_length"] = value
    return drafts, draft_tokens, problems


def _server_info(engine: RunningEngine, path: str, strategy: Strategy, values) -> list[str]:
    """The server's own view of its speculative settings (GET `path`) against the strategy's expect (its plain
    keys; `values()`: the placeholders they may hold): the problems found."""
    code, info = engine.get_json(path)
    if info is None:
        return [f"GET {path} answered {code or 'nothing'}"]
    problems, filled = [], values()
    for key, want in strategy.expect:
        if "@" in key or "." in key:
            continue
        want = fill(want, filled) if isinstance(want, str) else want
        got = find_key(info, key)
        if got != want:
            problems.append(f"{path}: {key} = {got!r}, expected {want!r}")
    return problems


def warm_judgement(cell: Cell, opts: SmokeOptions, figures: dict):
    """The one judge's answer (deploy/runtime/warmjudge.py) for this boot from a warm layer: this GPU, the launch line,
    the environment and the model's config against the layer's key."""
    from ..runtime import warmjudge as judge_mod
    from ..runtime import warmkey as key_mod

    data = opts.warm_keys or key_mod.data()
    side = judge_mod.side(opts.gpu, data.flags_of(cell.engine, cell.version), figures["launch_args"],
                          figures["launch_env"], set(opts.caches.env), key_mod.model_config_sha(opts.model.target))
    return judge_mod.of_facts(dict(opts.caches.warm_facts), cell.engine, cell.version, side, data)


def _measured_against_judge(result: Result, extra: list[str]) -> str:
    """What the boot compiled per cache, set against what the judge said before it: a judged hit that compiled is
    a part the key data lacks; a judged miss is the expected reason."""
    said = result.figures.get("warm_judgement")
    if not said:
        return ""
    from ..runtime import warmkey as key_mod

    compiled = key_mod.files_per_cache({f: 0 for f in extra}, key_mod.cache_subdirs())
    result.figures["compiled_per_cache"] = compiled
    verdicts = {c["cache"]: c["verdict"] for c in said["caches"]}
    wrong = [f"{c} (judged a hit, compiled {n}: its key holds a part warmkeys.toml does not list)"
             for c, n in compiled.items() if verdicts.get(c) == "hit"]
    if wrong:
        return "; the judge was wrong for " + ", ".join(wrong)
    if said.get("holds"):
        return ""
    return "; judged before the boot: " + said["made_for"] + " off its key (" + ", ".join(
        c["cache"] for c in said["caches"] if c["verdict"] != "hit") + ")"


def cache_verdict(result: Result, written, opts: SmokeOptions, fail) -> Result:
    """What the boot wrote under the image's cache root, as figures; a warm image's boot (an allowance in
    opts.caches) that wrote anything beyond the allowance compiled what its warm layer should have held: L3 fails,
    naming the files."""
    if written is None:
        return result
    result.figures.update({"cache_root": written.root, "cache_files_written": len(written.files),
                           "cache_bytes_written": written.bytes})
    if written.held_before is not None:  # what the root held when the boot began (0: a cold boot)
        result.figures["cache_files_before"] = written.held_before
    if written.files:
        result.figures["cache_written"] = sorted(written.files)[:50]
    if written.outside is not None:
        result.figures["written_outside_cache_root"] = written.outside[:50]
    allowance = opts.caches.allowance
    if allowance is None or result.status != PASS:
        return result
    extra = sorted(f for f in written.files if not any(fnmatch.fnmatchcase(f, g) for g in allowance))
    if extra:
        shown = ", ".join(extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
        failed = fail(f"the image has a warm layer, yet its boot compiled {len(extra)} file(s) under {written.root} "
                      f"beyond the allowance ({' '.join(allowance) or 'none'}): {shown}"
                      + _measured_against_judge(result, extra), tail=False)
        failed.figures.update(result.figures)
        return failed
    return result


# -- one image ---------------------------------------------------------------------------------------------
def run(cell: Cell, launcher: Launcher, opts: SmokeOptions, labels: dict | None, subject: str,
        audit_files, say=lambda s: None, entrypoint: list[str] | None = None) -> SmokeReport:
    rep = SmokeReport(subject=subject, cell=cell.id, launcher=launcher.name, strategies=tuple(opts.strategies))
    t_all = time.monotonic()
    eng = cell.engine_recipe
    asked = set(opts.layers)

    def blocked(layer: str, strategy: str | None) -> str | None:
        for lower in LAYERS[: LAYERS.index(layer)]:
            if lower not in asked:
                continue
            for subj in (None, strategy) if strategy else (None,):
                r = rep.get(lower, subj)
                if r is not None and r.status != PASS:
                    return f"not run: {lower}{' ' + subj if subj else ''} did not pass"
        return None

    def timed(layer: str, fn, *args) -> Result:
        t0 = time.monotonic()
        r = fn(*args)
        r.seconds = r.seconds or time.monotonic() - t0
        say(f"[{cell.id}] {layer}{' ' + r.strategy if r.strategy else ''}: {r.status} {r.reason.splitlines()[0] if r.reason else ''}")
        return r

    for layer, fn, args in (("L0", l0, (cell, launcher, labels, opts, entrypoint)),
                            ("L1", l1, (cell, launcher, opts, audit_files)),
                            ("JIT", jit, (cell, launcher, opts))):
        if layer not in asked:
            rep.add(Result(layer, None, SKIP, f"not asked for (--layers {','.join(opts.layers)})"))
        elif (why := blocked(layer, None)):
            rep.add(Result(layer, None, SKIP, why))
        else:
            rep.add(timed(layer, fn, *args))

    runnable: list[Strategy] = []
    refused: dict[str, str] = {}
    for name in opts.strategies:
        problem = eng.strategy_problem(name)
        if problem:
            refused[name] = problem
        else:
            runnable.append(eng.strategy(name))
    for name, why in refused.items():
        for layer in ("L2", "L3"):
            rep.add(Result(layer, name, SKIP, f"refused by the engine data: {why}"))

    if "L2" not in asked:
        for s in runnable:
            rep.add(Result("L2", s.name, SKIP, f"not asked for (--layers {','.join(opts.layers)})"))
    else:
        ready = [s for s in runnable if not blocked("L2", s.name)]
        for s in runnable:
            if s not in ready:
                rep.add(Result("L2", s.name, SKIP, blocked("L2", s.name) or ""))
        if ready:
            for r in l2(cell, launcher, opts, ready):
                say(f"[{cell.id}] L2 {r.strategy}: {r.status} {r.reason.splitlines()[0] if r.reason else ''}")
                rep.add(r)

    for s in runnable:
        if "L3" not in asked:
            rep.add(Result("L3", s.name, SKIP, f"not asked for (--layers {','.join(opts.layers)})"))
        elif not launcher.gpus and not opts.l3_without_gpu:
            rep.add(Result("L3", s.name, SKIP, f"skipped because {opts.no_gpu_reason}"))
        elif (why := blocked("L3", s.name)):
            rep.add(Result("L3", s.name, SKIP, why))
        elif launcher.gpus and opts.gpu_arch and archs_mod.sass_substitute(opts.gpu_arch, cell.archs) is None:
            rep.add(Result("L3", s.name, SKIP, f"this host's GPU is {archs_mod.sm(opts.gpu_arch)}, which the cell's "
                                               f"archs ({', '.join(map(archs_mod.sm, cell.archs))}) do not cover"))
        else:
            say(f"[{cell.id}] L3 {s.name}: starting {cell.engine} ({launcher.name})")
            rep.add(timed("L3", l3, cell, launcher, opts, s))
    rep.seconds = time.monotonic() - t_all
    return rep

