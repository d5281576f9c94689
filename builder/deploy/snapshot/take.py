"""`builder snapshot take`: boot the engine, ask it smoke L3's request, quiesce it, checkpoint its CUDA processes,
dump its tree with CRIU, and store it with its key. Every refusal of input comes before the snapshot directory is
made; a take that fails after that removes what it started and the directory it made."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...errors import Failed, UserError
from ...image.launchline import launch_line
from ..runtime import gpus as gpus_mod
from ..runtime import warmkey
from ..runtime.engine import HUB_OFF, BootFailed, RunningEngine
from . import criu as criu_mod
from . import cuda, key as key_mod, noring, remaps

PROMPT = "The capital of France is"  # smoke L3's greedy prompt
TOKENS = 16
RECORD = "snapshot.json"
IMAGES = "images"
LOG = "engine.log"


@dataclass(frozen=True)
class Engine:
    """What boots: the subject (an image, or a cell on this host), its recipe and the launch line."""

    subject: str  # the image (docker) or the cell id (process)
    identity: str  # the image's digest, or the process route's venv identity
    recipe: object
    argv: tuple[str, ...]
    model: str
    tp: int = 1
    env: dict = field(default_factory=dict)
    served: str = ""  # the model's path as the engine reads it ("" = model): a generated model's directory

    @property
    def sleep(self) -> dict | None:
        return self.recipe.smoke.get("sleep")


def line_for(recipe, strategy_name: str, model: str, port: int, host: str, tp: int, extra: tuple[str, ...],
             generated: bool = False) -> tuple:
    """The launch line smoke L3 would start (a generated model: dummy weights and smoke's tiny_args), with the
    engine's sleep flag."""
    strategy = recipe.strategy(strategy_name) if strategy_name else None
    sleep = recipe.smoke.get("sleep")
    more = (*extra, sleep["flag"]) if sleep else extra
    line = launch_line(recipe, strategy, {"model": model, "host": host, "port": str(port)}, extra=more, tp=tp,
                       dummy_weights=generated, tiny=generated)
    return tuple(line.argv)


def engine_env(recipe, strategy_name: str, given: dict[str, str]) -> dict[str, str]:
    """The engine's environment as smoke L3 sets it (the hub off, the strategy's own), plus what its sleep mode
    needs (vLLM serves /sleep only with VLLM_SERVER_DEV_MODE=1), libuv without io_uring (noring.py) and the user's
    --env last."""
    strategy = recipe.strategy(strategy_name) if strategy_name else None
    sleep = recipe.smoke.get("sleep") or {}
    pairs = dict(v.split("=", 1) for v in sleep.get("env", []))
    return {**HUB_OFF, **dict(getattr(strategy, "env", ()) or ()), **pairs, **noring.ENV, **given}


def client(port: int, recipe, log: Path) -> RunningEngine:
    """The engine's HTTP client on 127.0.0.1:port (runtime/engine.RunningEngine: smoke's requests)."""
    return RunningEngine(server=None, port=port, log_path=log, health=recipe.health or "/health",
                         completions=recipe.smoke.get("completions", "/v1/completions"))


def wait_ready(place, engine: RunningEngine, pid: int, timeout: float) -> float:
    t0 = time.monotonic()
    while True:
        code, _ = engine.get(engine.health, timeout=5)
        if code == 200 and engine.models():
            return round(time.monotonic() - t0, 2)
        if not place.alive(pid):
            raise BootFailed(f"the engine (pid {pid}) ended before it was ready", engine.log_tail())
        if time.monotonic() - t0 > timeout:
            raise BootFailed(f"not ready after {timeout:g} s", engine.log_tail())
        time.sleep(0.5)


def boot(place, argv, env: dict, directory: Path, log: str, recipe, timeout: float) -> tuple[int, RunningEngine, float]:
    """The engine started in `place` (its output in directory/log) and waited for: (pid, its client, seconds to
    ready); BootFailed when it ends or is not ready in `timeout`."""
    pid = place.spawn(list(argv), env, f"{place.inside(directory)}/{log}")
    http = client(place.host_port, recipe, directory / log)
    return pid, http, wait_ready(place, http, pid, timeout)


def answer(engine: RunningEngine, model: str) -> dict:
    """smoke L3's requests: one greedy completion (its text is what a restore must say again) and one streamed
    (the engine's counters rise); the connections are closed when they return."""
    greedy = engine.post(engine.completions, {"model": model, "prompt": PROMPT, "max_tokens": TOKENS,
                                              "temperature": 0.0}, timeout=120)
    streamed = engine.complete(model, PROMPT, TOKENS, timeout=120)
    _, metrics = engine.metrics()
    return {"text": greedy["choices"][0]["text"], "streamed_tokens": streamed["output_tokens"], "metrics": metrics}


def sizes(images: Path) -> dict:
    files = [p for p in images.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def take(engine: Engine, place, out: Path, boot_timeout: float, say: Callable[[str], None],
         criu: str = "criu", build_dir: Path | None = None) -> dict:
    """The snapshot of `engine` booted in `place`, stored in `out` (which must not exist or be empty)."""
    made = not out.exists() or not any(out.iterdir())
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)  # every page the engine held, its environment too: root's alone
    try:
        if hasattr(place, "start"):
            place.start()
        return _take(engine, place, out, boot_timeout, say, criu, build_dir)
    except BaseException:
        place.close()
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _take(engine, place, out, boot_timeout, say, criu, build_dir) -> dict:
    criu_version = criu_mod.version(place, criu)
    host = gpus_mod.read()
    try:
        pid, http, boot_s = boot(place, engine.argv, engine.env, out, LOG, engine.recipe, boot_timeout)
    except BootFailed as exc:
        raise Failed(f"{exc.why} {place.where}; the end of its log:\n{exc.tail}") from None
    model = http.models()
    before = answer(http, model)
    say(f"booted in {boot_s} s (pid {pid}); answered {before['text']!r}")
    t_sleep = time.monotonic()
    if engine.sleep:
        code = http.call(engine.sleep["path"], timeout=600, body=engine.sleep.get("body", ""))
        if code != 200:
            needs = " and ".join([engine.sleep["flag"], *engine.sleep.get("env", [])])
            raise Failed(f"POST {engine.sleep['path']} answered {code}, not 200: the engine did not sleep (its sleep "
                         f"mode, from the engine data, needs {needs})")
    sleep_s = round(time.monotonic() - t_sleep, 2)
    if engine.sleep:
        say(f"asleep ({engine.sleep['path']}) in {sleep_s} s: its KV cache released before the GPU checkpoint")
    procs = criu_mod.tree(place, pid)
    on_gpu = cuda.cuda_pids(place, procs)
    say("the tree: " + "; ".join(f"{p} {criu_mod.name(place, p)}{' (maps /dev/nvidia*)' if p in on_gpu else ''}"
                                 for p in procs))
    remap_dirs = remaps.dirs_of(place, procs)
    top = criu_mod.max_tid(place, procs)  # while the tree runs: its threads' ids too
    t0 = time.monotonic()
    gpu_done: dict = {}
    if on_gpu:
        gpu_done = cuda.act(place, cuda.tool(place, build_dir), "checkpoint", on_gpu)
        say(f"GPU state of {len(gpu_done['toggled'])} CUDA process(es) {gpu_done['toggled']} checkpointed in "
            f"{time.monotonic() - t0:.2f} s; mapping a device without a CUDA context: {gpu_done['no_context']}")
    else:
        say(f"no CUDA process in the tree of {len(procs)} process(es): no GPU state to checkpoint")
    gpu_s = round(time.monotonic() - t0, 2)
    images = f"{place.inside(out)}/{IMAGES}"
    place.run(["mkdir", "-p", images], timeout=30)
    with remaps.held(place, remap_dirs, say):  # no other restore's remap appears there meanwhile, nor is taken
        remaps_before = remaps.present(place, remap_dirs)
        t0 = time.monotonic()
        rc, text = place.run(criu_mod.dump_argv(criu, pid, images), timeout=1800)
        dump_s = round(time.monotonic() - t0, 2)
        if rc != 0:
            rc2, log = place.run(["tail", "-n", "15", f"{images}/dump.log"], timeout=30)
            raise Failed(f"criu dump failed (exit {rc}) {place.where}:\n{log.strip() if rc2 == 0 else text.strip()}")
        say(f"dumped {len(procs)} process(es) with CRIU {criu_version} in {dump_s} s")
        link_remaps = remaps.keep(place, out, remap_dirs, remaps_before)
    if link_remaps:
        say(f"CRIU's link remap(s) kept in the snapshot (every restore puts them back): "
            f"{', '.join(e['path'] for e in link_remaps)}")
    gpu_names, driver = key_mod.gpu_part(host)
    key = key_mod.Key(gpus=gpu_names, driver=driver, subject=engine.identity, model=engine.model,
                      model_config_sha256=warmkey.model_config_sha(engine.served or engine.model) or "",
                      engine_args=engine.argv, tp=engine.tp, criu=criu_version)
    place.close()
    key.write(out)
    record = {"subject": engine.subject, "prompt": PROMPT, "max_tokens": TOKENS, "answer": before["text"],
              "metrics": before["metrics"], "served_model": model, "boot_s": boot_s, "sleep_s": sleep_s,
              "gpu_checkpoint_s": gpu_s, "dump_s": dump_s, "cuda_pids": on_gpu, "gpu_checkpoint": gpu_done,
              "processes": len(procs), "max_tid": top, "slept": bool(engine.sleep),
              "wake": engine.sleep["wake"] if engine.sleep else "",
              "sleep_body": engine.sleep.get("body", "") if engine.sleep else "", "health": http.health,
              "completions": http.completions, "env": engine.env,
              "images": sizes(out / IMAGES), "log_bytes": (out / LOG).stat().st_size, "link_remaps": link_remaps,
              # where the processes saw the snapshot's files (their open log): a container's mount, or this host's path
              "directory": images.rsplit("/", 1)[0]}
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def venv_identity(python: str) -> str:
    """The process route's subject: the interpreter's prefix and the sha256 of what is installed there."""
    import subprocess

    proc = subprocess.run([python, "-c", "import sys;print(sys.prefix)"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"--python {python}: does not run")
    freeze = subprocess.run([python, "-m", "pip", "freeze", "--all"], capture_output=True, text=True).stdout
    return f"venv {proc.stdout.strip()} {hashlib.sha256(freeze.encode()).hexdigest()[:16]}"

