"""`builder serve IMAGE --strategy S --model PATH`: a serve plan (deploy/serve/plan.py) rendered as the exact
`docker run` that serves a published image — its GPUs, /dev/shm, the model mounted read-only, the port, a health
check with the meaning of the manifests' probes, a stop timeout above the engine's drain, and the strategy's real flags
and environment from the engine data.

The image's ENTRYPOINT is the engine's launch line up to the model; the arguments are the plan's, the rest of that
line (builder/image/launchline.py, the derivation render and smoke L3 use too). Nothing here is worked out again
from the labels or the engine data: it is all the plan's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ... import docker
from . import fit
from . import plan as plan_mod
from .plan import DEFAULT_SHM, ServePlan


def health_options(plan: ServePlan) -> list[str]:
    """docker's health check with the meaning of the manifests' probes: healthy once the model list answers (the
    plan's readiness probe), the boot budget as its start period, the readiness probe's misses in a row after it
    unhealthy."""
    ready = plan.readiness
    url = f"http://127.0.0.1:{plan.port}{ready.path}"
    cmd = f"python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout={ready.timeout_s})\""
    return ["--health-cmd", cmd, "--health-interval", f"{ready.period_s}s", "--health-timeout", f"{ready.timeout_s}s",
            "--health-retries", str(ready.failures), "--health-start-period", f"{plan.budget.seconds}s"]


def docker_shm(size: str) -> str:
    """A Kubernetes quantity (16Gi, 512Mi) as docker's --shm-size (16g, 512m)."""
    m = plan_mod.check_shm(size)
    return f"{m[1]}{m[2].lower()}"


@dataclass(frozen=True)
class ServeLine:
    argv: list[str]
    health: str  # URL that answers once the engine is ready ("" when the data has none)
    notes: list[str]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def cache_volume(plan: ServePlan) -> str:
    """The named volume a warm image off its key compiles into: one per image digest, so that docker fills it from
    the image's own cache root (the warm layer's files, their times kept) when it is made, and a later run of the
    same image, the same flags, finds what the first compiled."""
    import hashlib

    return "builder-jit-" + hashlib.sha256(plan.image.encode()).hexdigest()[:16]


def line(plan: ServePlan, bind: str = "127.0.0.1", name: str | None = None, docker_cmd: str = "docker") -> ServeLine:
    """The `docker run` of PLAN, its port published on BIND, the container named NAME."""
    cache = plan.compile_cache
    writable = ((cache_volume(plan), cache.root),) if cache is not None and cache.seeded else ()
    argv = docker.run_argv(plan.image, list(plan.args), gpus=plan.gpus, shm_size=docker_shm(plan.shm),
                           ports=(f"{bind}:{plan.port}:{plan.port}",),
                           mounts=tuple((m.name, m.inside) for m in plan.mounts),
                           env=plan.env + (cache.env if writable else ()), name=name, writable=writable,
                           docker=docker_cmd,
                           options=("--stop-timeout", str(plan.shutdown.stop_s), *health_options(plan)))
    notes = []
    if plan.warm is not None:
        notes += plan.warm.lines()
    if writable:
        notes.append(f"what the first boot compiles goes to the volume {writable[0][0]} at {cache.root} (filled from "
                     "the image's warm layer when it is made): a restart or the next run reuses it")
    if plan.drafter_from_data:
        notes.append(f"{plan.strategy} drafts with {plan.spec.drafter} (engine data); the engine downloads it unless "
                     "you pass --drafter DIR (mounted read-only)")
    notes.append(f"healthy once {plan.readiness.path} answers; boot budget {plan.budget.why}")
    notes.append(_stop_note(plan))
    host = "127.0.0.1" if bind in ("0.0.0.0", "") else "[::1]" if bind == "[::]" else bind
    health = f"http://{host}:{plan.port}{plan.health_path}" if plan.health_path else ""
    return ServeLine(argv, health, notes)


def _stop_note(plan: ServePlan) -> str:
    stop = plan.shutdown
    if stop.flag:
        return (f"stop: {stop.flag} {stop.drain_s}: in-flight requests finish for up to {stop.drain_s}s after SIGTERM; "
                f"--stop-timeout {stop.stop_s}s before SIGKILL")
    return (f"stop: {plan.engine} {plan.version} has no flag bounding its drain; --stop-timeout {stop.stop_s}s "
            f"(--drain-timeout {stop.drain_s}s and {fit.STOP_MARGIN_S}s) before SIGKILL")


def serve_line(image: str, labels: dict[str, str], kn, strategy: str, model: Path | str, port: int = 8000,
               bind: str = "127.0.0.1", gpus: str = "all", drafter: str | None = None, name: str | None = None,
               extra_args: tuple[str, ...] = (), docker_cmd: str = "docker", tp: int = 1,
               shm: str = DEFAULT_SHM, drain_s: int = fit.DEFAULT_DRAIN_S) -> ServeLine:
    """The `docker run` of IMAGE (whose labels are LABELS) under STRATEGY: its plan, derived, rendered."""
    plan = plan_mod.derive(plan_mod.DOCKER, image, labels, kn, strategy, model, port=port, gpus=gpus, tp=tp, shm=shm,
                           drafter=drafter, extra_args=extra_args, drain_s=drain_s)
    return line(plan, bind=bind, name=name, docker_cmd=docker_cmd)
