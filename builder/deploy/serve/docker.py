"""`builder serve IMAGE --strategy S --model PATH`: the exact `docker run` that serves a published image —
its GPUs, the model mounted read-only, the port, and the strategy's real flags and environment from the engine
data (builder/data/engines.toml) for the engine version the image's labels name.

The image's ENTRYPOINT is the engine's launch line up to the model; the arguments here are the rest of that
line, then where it listens, then the strategy's flags: builder/image/launchline.py, the derivation render and smoke L3
use too.

What the `docker run` and the Kubernetes manifests (deploy/serve/kube.py) share is here too: where the model comes from
(`ModelSource`), and the boot budget (`BootBudget`) their probes are sized from — the image's measured boot (label
io.builder.boot-seconds) plus a stated margin, or a stated default when no label records one.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ... import docker
from ...image import labels as labels_mod
from ...errors import UserError
from ...image import launchline
from ..strategies import check_strategy

MODEL_ROOT = launchline.MODEL_ROOT
LABEL_ENGINE, LABEL_VERSION, LABEL_STRATEGIES = labels_mod.ENGINE, labels_mod.ENGINE_VERSION, labels_mod.STRATEGIES


READY_PATH = "/v1/models"  # the OpenAI model list: answers once the engine serves the model (vLLM and SGLang)
DEFAULT_BOOT_BUDGET_S = 900  # no label records the image's boot: measured boots run 26 s to 11 min (cold > 500 s)
MIN_MARGIN_S = 120  # the least margin over a measured boot
PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 5
DEFAULT_SHM = "16Gi"  # /dev/shm: NCCL's shared-memory transport and the engines' worker queues between TP ranks


@dataclass(frozen=True)
class BootBudget:
    """How long the engine may take to serve its model list before the runtime gives up on it: the measured boot
    the image's labels record plus a margin (the larger of the boot itself and MIN_MARGIN_S), else the default."""

    boot_s: float | None  # the label's measured boot; None: no label
    seconds: int
    label: str = labels_mod.BOOT_SECONDS  # the label it was read from (a warm image's warm boot)

    @classmethod
    def of(cls, labels: dict[str, str]) -> "BootBudget":
        boot = labels_mod.boot_seconds(labels)
        if boot is None:
            return cls(None, DEFAULT_BOOT_BUDGET_S)
        return cls(boot, int(math.ceil(boot + max(boot, MIN_MARGIN_S))), labels_mod.boot_label(labels))

    @property
    def failures(self) -> int:
        """Probe failures the budget allows at PROBE_PERIOD_S apart (Kubernetes' startupProbe failureThreshold)."""
        return max(1, math.ceil(self.seconds / PROBE_PERIOD_S))

    @property
    def why(self) -> str:
        if self.boot_s is None:
            return (f"{self.seconds}s: the image records no boot (label {labels_mod.BOOT_SECONDS}); the stated default "
                    "(measured boots run 26 s to 11 min)")
        margin = self.seconds - self.boot_s
        return (f"{self.seconds}s: the image's measured boot {self.boot_s:g}s (label {self.label}) + "
                f"margin {margin:g}s (the boot again, at least {MIN_MARGIN_S}s)")


@dataclass(frozen=True)
class ModelSource:
    """Where the checkpoint comes from: a directory of this host (docker: bind-mounted), `hostpath:/DIR` (a node's
    directory), `pvc:CLAIM[/SUBPATH]` (a PersistentVolumeClaim) or `volume:NAME[/SUBPATH]` (a docker named
    volume). The engine sees it read-only at /models/<its last name>."""

    kind: str  # "dir" | "hostpath" | "pvc" | "volume"
    name: str  # the directory, the claim or the volume
    sub: str = ""  # the path inside the claim or volume

    @classmethod
    def parse(cls, value: str) -> "ModelSource":
        kind, sep, rest = value.partition(":")
        if not sep or kind not in ("hostpath", "pvc", "volume"):
            return cls("dir", value)
        if kind == "hostpath":
            if not re.fullmatch(r"(/[A-Za-z0-9._@+-]+)+/?", rest):
                raise UserError(f"--model {value}: hostpath:/DIR takes an absolute directory of the node")
            return cls(kind, rest.rstrip("/"))
        name, _, sub = rest.partition("/")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
            raise UserError(f"--model {value}: {name!r} is not a {'claim' if kind == 'pvc' else 'volume'} name "
                            "(lower-case letters, digits, '-', '.')")
        sub = sub.strip("/")
        if sub and (".." in sub.split("/") or not re.fullmatch(r"[A-Za-z0-9._@+/-]+", sub)):
            raise UserError(f"--model {value}: {sub!r} is not a relative path inside the {kind}")
        return cls(kind, name, sub)

    @property
    def inside(self) -> str:
        """Where the engine sees the model."""
        last = (self.sub or self.name).rstrip("/").rsplit("/", 1)[-1]
        return f"{MODEL_ROOT}/{last}"


def docker_gpus(gpus: str, tp: int) -> str | None:
    """What `docker run --gpus` takes for serve's --gpus (after runflags.Gpus.for_tp) and --tp: none → None, ids →
    device=0,1, all with tp > 1 → the count (docker's `--gpus N`: N GPUs), else all."""
    if gpus == "none":
        return None
    if gpus not in ("all", "auto"):
        return f"device={gpus}"
    return str(tp) if tp > 1 else "all"


def health_options(port: int, budget: BootBudget) -> list[str]:
    """docker's health check with the meaning of the manifests' probes: healthy once the model list answers, the
    boot budget as its start period, three misses in a row after it unhealthy."""
    url = f"http://127.0.0.1:{port}{READY_PATH}"
    cmd = f"python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout={PROBE_TIMEOUT_S})\""
    return ["--health-cmd", cmd, "--health-interval", f"{PROBE_PERIOD_S}s", "--health-timeout", f"{PROBE_TIMEOUT_S}s",
            "--health-retries", "3", "--health-start-period", f"{budget.seconds}s"]


def docker_shm(size: str) -> str:
    """A Kubernetes quantity (16Gi, 512Mi) as docker's --shm-size (16g, 512m)."""
    m = re.fullmatch(r"([1-9][0-9]*)([KMGT])i", size)
    if not m:
        raise UserError(f"--shm-size {size}: write a size like 16Gi or 512Mi")
    return f"{m[1]}{m[2].lower()}"


@dataclass(frozen=True)
class ServeLine:
    argv: list[str]
    health: str  # URL that answers once the engine is ready ("" when the data has none)
    notes: list[str]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def serve_line(image: str, labels: dict[str, str], kn, strategy: str, model: Path | str, port: int = 8000,
               bind: str = "127.0.0.1", gpus: str = "all", drafter: str | None = None, name: str | None = None,
               extra_args: tuple[str, ...] = (), docker_cmd: str = "docker", tp: int = 1,
               shm: str = DEFAULT_SHM) -> ServeLine:
    engine, version = labels_mod.engine(labels)
    if not engine or not version:
        raise UserError(f"{image}: no {LABEL_ENGINE} / {LABEL_VERSION} labels: not an image builder made")
    recipe = kn.recipe(engine, version)
    built_for = labels_mod.strategies(labels)
    check_strategy(recipe, strategy, built_for, image)
    s = recipe.strategy(strategy)
    source = ModelSource.parse(str(model))
    if source.kind == "pvc":
        raise UserError(f"--model {model}: a PersistentVolumeClaim is a Kubernetes volume (--kubernetes); docker "
                        "takes a directory or volume:NAME")
    if source.kind == "volume":
        if source.sub:
            raise UserError(f"--model {model}: docker mounts a whole named volume (volume:NAME)")
        mounts: list = [(source.name, source.inside)]
    else:
        model = Path(source.name).resolve()
        if not model.is_dir():
            raise UserError(f"--model: {model} is not a directory (a local checkpoint: config.json, weights, tokenizer)")
        mounts = [(model, f"{MODEL_ROOT}/{model.name}")]
    drafter_value = drafter or s.drafter
    if drafter and Path(drafter).is_dir():
        d = Path(drafter).resolve()
        mounts.append((d, f"{MODEL_ROOT}/{d.name}"))
        drafter_value = f"{MODEL_ROOT}/{d.name}"
    values = {"model": mounts[0][1], "drafter": drafter_value or "", "host": "0.0.0.0", "port": str(port)}
    args = list(launchline.launch_line(recipe, s, values, extra=tuple(extra_args), tp=tp).args)
    budget = BootBudget.of(labels)
    argv = docker.run_argv(image, args, gpus=docker_gpus(gpus, tp), shm_size=docker_shm(shm),
                           ports=(f"{bind}:{port}:{port}",), mounts=tuple((str(a), b) for a, b in mounts),
                           env=tuple(s.env), name=name, docker=docker_cmd, options=tuple(health_options(port, budget)))
    notes = []
    if drafter_value and not drafter and s.drafter:
        notes.append(f"{strategy} drafts with {s.drafter} (engine data); the engine downloads it unless you pass "
                     "--drafter DIR (mounted read-only)")
    notes.append(f"healthy once {READY_PATH} answers; boot budget {budget.why}")
    health = f"http://{'127.0.0.1' if bind in ('0.0.0.0', '') else '[::1]' if bind == '[::]' else bind}:{port}{recipe.health}" if recipe.health else ""
    return ServeLine(argv, health, notes)
