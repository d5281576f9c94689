"""The serve plan: what `builder serve IMAGE --strategy S --model M` runs, derived once (`derive`) as one frozen value
— the engine recipe and strategy, the launch line's arguments and environment (builder/image/launchline.py, the
derivation render and smoke L3 use too), where the model (and a drafter directory) comes from and where the
engine sees it, tensor parallel and the GPUs, /dev/shm, the port, the boot budget and the probes, and what a cold
image's compile cache needs. deploy/serve/docker.py renders a plan as the `docker run` line, deploy/serve/kube.py
as Kubernetes manifests: neither works any of it out again.

The target (`DOCKER`, `KUBERNETES`) is the one thing --kubernetes decides, and what it decides is written on it:
whether IMAGE may be a JSON file of its config and must run by digest, and whether the model and drafter
directories and the GPUs are this host's.

The boot budget (`BootBudget`) is the image's measured boot (label io.builder.boot-seconds) plus a stated margin, or
a stated default when no label records one; the probes are sized from it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ... import grammar, redact
from ...errors import UserError
from ...image import labels as labels_mod
from ...image import launchline
from ...imageref import ImageRef
from .. import runflags
from ..strategies import check_strategy
from . import fit

MODEL_ROOT = launchline.MODEL_ROOT
READY_PATH = "/v1/models"  # the OpenAI model list: answers once the engine serves the model (vLLM and SGLang)
DEFAULT_BOOT_BUDGET_S = 900  # no label records the image's boot: measured boots run 26 s to 11 min (cold > 500 s)
MIN_MARGIN_S = 120  # the least margin over a measured boot
PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 5
PROBE_FAILURES = 3  # misses in a row after the boot that mean not ready (docker: unhealthy)
LIVENESS_PERIOD_S = 30
LIVENESS_TIMEOUT_S = 10
WAIT_MARGIN_S = 5  # a probe's timeout over the engine's own wait on its path (engine data health_wait_s)
# startup and readiness ask the engine data's ready_path where it names one, READY_PATH otherwise: SGLang answers the
# model list before its warm-up has run, its /health only after (builder/data/engines.toml)
DEFAULT_SHM = "16Gi"  # /dev/shm: NCCL's shared-memory transport and the engines' worker queues between TP ranks


@dataclass(frozen=True)
class Target:
    """Where a plan is served: `docker run` on this host, or Kubernetes manifests."""

    name: str
    image_file: bool  # IMAGE may be a JSON file of its config (`docker image inspect`)
    by_digest: bool  # the image runs by digest only: the digest is what smoke tested; a tag can be pushed again
    this_host: bool  # the model and drafter directories and the GPUs are this host's
    compile_cache: bool  # a cold image gets a volume for what it compiles at its first requests


DOCKER = Target("docker", image_file=False, by_digest=False, this_host=True, compile_cache=False)
KUBERNETES = Target("kubernetes", image_file=True, by_digest=True, this_host=False, compile_cache=True)


@dataclass(frozen=True)
class BootBudget:
    """How long the engine may take to serve its model list before the runtime gives up on it: the measured boot
    the image's labels record plus a margin (the larger of the boot itself and MIN_MARGIN_S), else the default. A
    warm image that the judge (deploy/runtime/warmjudge.py) finds off its key gets the cold boot measured where its layer
    was made: its first boot compiles, and a budget sized for the warm boot would kill it mid-compile, again and
    again (a restart loop)."""

    boot_s: float | None  # the label's measured boot; None: no label
    seconds: int
    label: str = labels_mod.BOOT_SECONDS  # the label it was read from (a warm image's warm boot)
    off_key: str = ""  # a warm image judged off its key: the judge's one line
    stated: str = ""  # no label: the engine data's measured cold boot of the strategy it is sized from

    @classmethod
    def of(cls, labels: dict[str, str], judgement=None, strategy=None) -> BootBudget:
        """From the image's labels (and the judge's answer for a warm one); an image recording no boot gets the
        engine data's cold boot of `strategy` (engines.Strategy cold_boot_s), else the default."""
        boot = labels_mod.boot_seconds(labels)  # a label that is no number of seconds is refused, whatever is read
        if judgement is not None and not judgement.holds:
            cold = judgement.cold_s
            if cold is None:
                return cls(None, DEFAULT_BOOT_BUDGET_S, off_key=judgement.summary())
            return cls(cold, cls._with_margin(cold), f"{labels_mod.WARM}.cold-boot-s", judgement.summary())
        if boot is None:
            stated = getattr(strategy, "cold_boot_s", 0)
            if stated:
                return cls(None, max(DEFAULT_BOOT_BUDGET_S, cls._with_margin(stated)),
                           stated=f"{strategy.name}'s cold boot in the engine data, {stated}s measured")
            return cls(None, DEFAULT_BOOT_BUDGET_S)
        return cls(boot, cls._with_margin(boot), labels_mod.boot_label(labels))

    @staticmethod
    def _with_margin(boot: float) -> int:
        return int(math.ceil(boot + max(boot, MIN_MARGIN_S)))

    @property
    def failures(self) -> int:
        """Probe failures the budget allows at PROBE_PERIOD_S apart (Kubernetes' startupProbe failureThreshold)."""
        return max(1, math.ceil(self.seconds / PROBE_PERIOD_S))

    @property
    def why(self) -> str:
        if self.boot_s is None and self.stated:
            why = (f"{self.seconds}s: the image records no boot (label {labels_mod.BOOT_SECONDS}); {self.stated} + "
                   f"margin (the boot again, at least {MIN_MARGIN_S}s; never under {DEFAULT_BOOT_BUDGET_S}s)")
        elif self.boot_s is None:
            why = (f"{self.seconds}s: the image records no boot (label {labels_mod.BOOT_SECONDS}); the stated default "
                   "(measured boots run 26 s to 11 min)")
        else:
            margin = self.seconds - self.boot_s
            why = (f"{self.seconds}s: the image's measured {'cold ' if self.off_key else ''}boot {self.boot_s:g}s "
                   f"(label {self.label}) + margin {margin:g}s (the boot again, at least {MIN_MARGIN_S}s)")
        return f"{why}; off its warm key: {self.off_key}" if self.off_key else why


CLAIM_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"  # a PersistentVolumeClaim's name: a DNS subdomain


@dataclass(frozen=True)
class ModelSource:
    """Where the checkpoint comes from: a directory of this host (docker: bind-mounted), `hostpath:/DIR` (a node's
    directory), `pvc:CLAIM[/SUBPATH]` (a PersistentVolumeClaim) or `volume:NAME[/SUBPATH]` (a docker named
    volume). The engine sees it read-only at /models/<its last name>."""

    kind: str  # "dir" | "hostpath" | "pvc" | "volume"
    name: str  # the directory, the claim or the volume
    sub: str = ""  # the path inside the claim or volume

    @classmethod
    def parse(cls, value: str) -> ModelSource:
        kind, sep, rest = value.partition(":")
        if not sep or kind not in ("hostpath", "pvc", "volume"):
            return cls("dir", value)
        if kind == "hostpath":
            if not re.fullmatch(r"(/[A-Za-z0-9._@+-]+)+/?", rest) or {".", ".."} & set(rest.split("/")):
                raise UserError(f"--model {value}: hostpath:/DIR takes an absolute directory of the node (no '.' or "
                                "'..' in it)")
            return cls(kind, rest.rstrip("/"))
        name, _, sub = rest.partition("/")
        if not re.fullmatch(CLAIM_NAME, name):
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


@dataclass(frozen=True)
class Probe:
    """An HTTP probe of the engine: its path, every `period_s`, `timeout_s` each, `failures` misses in a row."""

    path: str
    period_s: int
    timeout_s: int
    failures: int


@dataclass(frozen=True)
class CompileCache:
    """A volume for what the first boot compiles, so that a restart finds it: a cold image's (the engine data's JIT
    cache root and each JIT framework's cache variable pointed into it, those the strategy's own environment does
    not set), or a warm image's (`seeded`: the volume starts as a copy of the image's cache root, the warm layer's
    files with their times; the image's own cache variables are said again); the judge's why is the plan's `warm`."""

    root: str
    env: tuple[tuple[str, str], ...]
    seeded: bool = False


@dataclass(frozen=True)
class ServePlan:
    target: Target
    image: str  # what runs: docker, the reference read (its digest when known); Kubernetes, REPO@sha256:…
    engine: str
    version: str
    recipe: object = field(repr=False)  # builder.engines.Recipe
    strategy: str
    spec: object = field(repr=False)  # the strategy's builder.engines.Strategy
    model: ModelSource  # docker: a directory of this host (resolved) or a named volume; Kubernetes: pvc or hostpath
    drafter: str  # the drafter the launch line names ("" none)
    drafter_given: bool  # --drafter said it (else the engine data's default)
    drafter_dir: ModelSource | None  # a drafter directory of this host, mounted (docker)
    args: tuple[str, ...]  # the launch line after the image's ENTRYPOINT
    env: tuple[tuple[str, str], ...]  # the strategy's environment
    tp: int
    gpus: str | None  # docker's --gpus: None none, device=0,1, N (a count) or all; Kubernetes asks `tp` GPUs
    shm: str  # /dev/shm as a Kubernetes quantity (16Gi)
    port: int
    budget: BootBudget
    startup: Probe
    readiness: Probe
    liveness: Probe
    health_path: str  # the engine data's health path ("" when it has none)
    compile_cache: CompileCache | None  # a cold image's (Kubernetes), a warm one's (off its key; Kubernetes always)
    warm: object  # deploy/runtime/warmjudge.Judgement of a warm image's layer for this serve; None for a cold image
    cell: str | None  # the image's io.builder.cell label
    archs: tuple[int, ...]  # the compute capabilities the image is compiled for (label io.builder.archs)
    archs_label: str  # that label as written
    gpu_ccs: tuple[int, ...]  # Kubernetes: the GPUs' compute capabilities the image's device code runs on (fit.py)
    gpu_product: str | None  # Kubernetes: the GPU product asked for (GFD's nvidia.com/gpu.product, e.g. NVIDIA-H200)
    shutdown: fit.Shutdown  # how the engine stops: its drain after SIGTERM and the grace before SIGKILL

    @property
    def mounts(self) -> tuple[ModelSource, ...]:
        """What the engine sees read-only under MODEL_ROOT: the model, then a drafter directory."""
        return (self.model,) + ((self.drafter_dir,) if self.drafter_dir else ())

    @property
    def hub_download(self) -> str:
        """The hub id the engine downloads at every boot ("" none): a drafter named by id, not a mounted directory
        or a path inside the container."""
        if not self.drafter or self.drafter_dir is not None or self.drafter.startswith("/"):
            return ""
        return self.drafter

    @property
    def drafter_from_data(self) -> bool:
        """The engine data's drafter, no --drafter: the engine downloads it."""
        return bool(self.drafter) and not self.drafter_given and bool(self.spec.drafter)


def check_shm(size: str) -> re.Match:
    """--shm-size: a size in Ki, Mi, Gi or Ti (16Gi, 512Mi), what both docker and Kubernetes take."""
    m = re.fullmatch(r"([1-9][0-9]{0,11})([KMGT])i", size)  # at most 12 digits: beyond any machine's memory
    if not m:
        raise UserError(f"--shm-size {size}: write a size like 16Gi or 512Mi")
    return m


def docker_gpus(gpus: str, tp: int) -> str | None:
    """What `docker run --gpus` takes for serve's --gpus (after runflags.Gpus.for_tp) and --tp: none → None, ids →
    device=0,1, all with tp > 1 → the count (docker's `--gpus N`: N GPUs), else all."""
    if gpus == "none":
        return None
    if gpus not in ("all", "auto"):
        return f"device={gpus}"
    return str(tp) if tp > 1 else "all"


def check_flags(target: Target, image: str, model: str, shm: str, gpus: str, tp: int) -> str:
    """serve's flags checked before any image is looked up (nothing asked of docker or a registry): the model's
    grammar, /dev/shm's size, and on this host the image reference, the model directory and the GPUs. Returns
    the GPUs as serve's --gpus: --tp N on this host, N device ids (auto / all: the host's first N when
    nvidia-smi lists its GPUs, else docker's count N; more than the host has is refused)."""
    source = ModelSource.parse(model)
    if target.this_host:
        grammar.check(grammar.image_ref, image, "IMAGE")
        if source.kind == "dir" and not Path(model).is_dir():
            raise UserError(f"--model: {model} is not a directory (the checkpoint to mount)")
    check_shm(shm)  # the size's grammar, either way
    chosen = runflags.Gpus.parse(gpus)
    if tp > 1 and target.this_host:
        from ..runtime import gpus as gpus_mod

        chosen = chosen.for_tp(tp, gpus_mod.read() if chosen.mode in ("auto", "all") else None)
    return "all" if chosen.mode == "auto" else str(chosen)


def reference(target: Target, image: str, digest: str) -> str:
    """The image a plan runs: the digest read, never the tag (local: its repo digest, else its ID); by digest
    only, REPO@sha256:…, where the target asks it."""
    if not target.by_digest:
        return digest or image
    ref = image if "@sha256:" in image else digest
    if "@sha256:" not in ref:
        raise UserError(f"{image}: no registry digest known (push it, then serve REPO@sha256:…): Kubernetes runs "
                        "an image by digest")
    return pullable(ref, image)


def pullable(ref: str, image: str) -> str:
    """REF (IMAGE's, or the RepoDigests entry of IMAGE's JSON file) as an image Kubernetes can pull by digest:
    REPO@sha256:<64 hex> by the reference grammar (builder/imageref.py), refused in one line otherwise."""
    parsed = ImageRef.parse(ref, f"{redact.describe(image)}: the image Kubernetes would pull")
    if not parsed.digest.startswith("sha256:"):
        raise UserError(f"{redact.describe(image)}: {redact.describe(ref)} names no sha256 digest: Kubernetes runs an "
                        "image by digest (REPO@sha256:…)")
    return str(parsed)


def _model(target: Target, value: str) -> ModelSource:
    """--model where the target serves it: docker, a directory of this host (resolved) or a whole named volume;
    Kubernetes, a claim or a node's directory."""
    source = ModelSource.parse(value)
    if target.this_host:
        if source.kind == "pvc":
            raise UserError(f"--model {value}: a PersistentVolumeClaim is a Kubernetes volume (--kubernetes); docker "
                            "takes a directory or volume:NAME")
        if source.kind == "volume":
            if source.sub:
                raise UserError(f"--model {value}: docker mounts a whole named volume (volume:NAME)")
            return source
        model = Path(source.name).resolve()
        if not model.is_dir():
            raise UserError(f"--model: {model} is not a directory (a local checkpoint: config.json, weights, tokenizer)")
        return ModelSource("dir", str(model))
    if source.kind == "volume":
        raise UserError(f"--model {value}: volume:NAME is a docker named volume; on Kubernetes use pvc:CLAIM[/PATH] "
                        "or hostpath:/DIR")
    if source.kind == "dir":
        if not source.name.startswith("/"):
            raise UserError(f"--model {value}: on Kubernetes the model is pvc:CLAIM[/PATH] or a node's directory "
                            "(hostpath:/DIR, or an absolute path)")
        return ModelSource("hostpath", source.name.rstrip("/"))
    return source


def _compile_cache(target: Target, labels: dict[str, str], kn, recipe, strategy: str, env,
                   judgement) -> CompileCache | None:
    """A cold image's, where the target gives it one: what it compiles at its first requests survives a restart; a
    jit = "prebuilt" one carries its modules and gets none; a warm image gets one seeded from the image's own cache
    root where the judge finds it off its key (its first boot compiles) and on Kubernetes always (a pod may land on a
    node the judge could not see; --compile-cache-claim then keeps what it compiled)."""
    if labels_mod.warm(labels):  # Kubernetes: always (the node is the scheduler's; a claim the user names is used)
        if judgement is None or (judgement.holds and not target.compile_cache):
            return None
        root = labels_mod.cache_root(labels) or kn.jit_cache_root()  # the image's variables, said again: the volume
        env = tuple(sorted((k, v) for k, v in labels_mod.cache_env(labels).items() if k not in dict(env)))
        return CompileCache(root, env, seeded=True)
    if not target.compile_cache or labels_mod.jit_prebuilt(labels):
        return None
    root = kn.jit_cache_root()
    caches = {m["cache_env"]: m["cache_dir"] for m in kn.jit_modules_of(recipe, (strategy,))}
    return CompileCache(root, tuple((k, v) for k, v in sorted(caches.items()) if k not in dict(env)))


def warm_judgement(target: Target, labels: dict[str, str], kn, recipe, args, env, source: ModelSource, gpu,
                   gpu_product: str | None = None):
    """The judge's answer (deploy/runtime/warmjudge.py) for serving a warm image with this launch line: `gpu` is this
    host's (docker); on Kubernetes the node is the scheduler's, known only where --gpu-product pins the layer's own
    GPU (one product, one SKU: its SM count and arch). The model's config is read where it is a directory here. None
    for an image without a warm layer."""
    if not labels_mod.warm(labels):
        return None
    from ..runtime import warmjudge as judge_mod
    from ..runtime import warmkey as key_mod

    config = key_mod.model_config_sha(source.name) if target.this_host and source.kind == "dir" else None
    if gpu is None and gpu_product:
        gpu = key_mod.product_gpu(gpu_product, labels)
    data = key_mod.of_knowledge(kn)
    serve = judge_mod.side(gpu, data.flags_of(recipe.name, recipe.version), args, dict(env),
                           set(labels_mod.cache_env(labels)), config)
    return judge_mod.of_image(labels, serve, data)


def derive(target: Target, image: str, labels: dict[str, str], kn, strategy: str, model: Path | str, *,
           port: int = 8000, gpus: str = "all", tp: int = 1, shm: str = DEFAULT_SHM, drafter: str | None = None,
           extra_args: tuple[str, ...] = (), drain_s: int = fit.DEFAULT_DRAIN_S,
           gpu_product: str | None = None, gpu=None) -> ServePlan:
    """The plan of serving IMAGE (whose labels are LABELS) under STRATEGY on TARGET, once. `gpu`: the GPU the engine
    gets where it is known (docker: this host's first chosen GPU), for the warm judge."""
    if target.by_digest and "@sha256:" not in image:
        raise UserError(f"{image}: Kubernetes runs an image by digest (REPO@sha256:…): the digest is what smoke "
                        "tested; a tag can be pushed again")
    if target.by_digest:
        image = pullable(image, image)
    engine, version = labels_mod.engine(labels)
    if not engine or not version:
        raise UserError(f"{image}: no {labels_mod.ENGINE} / {labels_mod.ENGINE_VERSION} labels: not an image builder made")
    recipe = kn.recipe(engine, version)
    check_strategy(recipe, strategy, labels_mod.strategies(labels), image)
    s = recipe.strategy(strategy)
    source = _model(target, str(model))
    drafter_value, drafter_dir = drafter or s.drafter, None
    if target.this_host and drafter and Path(drafter).is_dir():
        drafter_dir = ModelSource("dir", str(Path(drafter).resolve()))
        drafter_value = drafter_dir.inside
    values = {"model": source.inside, "drafter": drafter_value or "", "host": "0.0.0.0", "port": str(port)}
    shutdown = fit.Shutdown.of(recipe, drain_s, tuple(extra_args))
    args = tuple(launchline.launch_line(recipe, s, values, extra=(*shutdown.args, *extra_args), tp=tp).args)
    judgement = warm_judgement(target, labels, kn, recipe, args, s.env, source, gpu, gpu_product)
    budget = BootBudget.of(labels, judgement, s)
    archs_label = labels.get(labels_mod.ARCHS, "")
    return ServePlan(
        target=target, image=image, engine=engine, version=version, recipe=recipe, strategy=strategy, spec=s,
        model=source, drafter=drafter_value or "", drafter_given=bool(drafter), drafter_dir=drafter_dir, args=args,
        env=tuple(s.env), tp=tp, gpus=docker_gpus(gpus, tp), shm=shm, port=port, budget=budget,
        startup=Probe(recipe.ready_path or READY_PATH, PROBE_PERIOD_S, _timeout(PROBE_TIMEOUT_S, recipe),
                      budget.failures),
        readiness=Probe(recipe.ready_path or READY_PATH, PROBE_PERIOD_S, _timeout(PROBE_TIMEOUT_S, recipe),
                        PROBE_FAILURES),
        liveness=Probe(recipe.health or READY_PATH, LIVENESS_PERIOD_S, _timeout(LIVENESS_TIMEOUT_S, recipe),
                       PROBE_FAILURES),
        health_path=recipe.health or "", warm=judgement,
        compile_cache=_compile_cache(target, labels, kn, recipe, strategy, s.env, judgement),
        cell=labels_mod.cell(labels), archs=tuple(int(a) for a in archs_label.split(",") if a.strip().isdigit()),
        archs_label=archs_label, gpu_ccs=() if target.this_host else fit.runs_on(image, labels),
        gpu_product=None if gpu_product is None else fit.check_product(gpu_product), shutdown=shutdown)


def _timeout(floor: int, recipe) -> int:
    """A probe's timeout: above the engine's own wait on its health and ready paths (engine data health_wait_s: SGLang
    answers after up to 20 s), so that the engine's answer decides, not the kubelet's timeout."""
    return max(floor, recipe.health_wait_s + WAIT_MARGIN_S) if recipe.health_wait_s else floor
