"""`builder serve IMAGE --kubernetes`: a serve plan (deploy/serve/plan.py) rendered as the manifests that run a
published image on Kubernetes — a Deployment and a Service (and a prometheus-operator PodMonitor when asked) — built
with lightkube's typed models, never as loose dicts, and written as YAML.

The container is the image by digest with its own ENTRYPOINT and, as its arguments, the plan's: the rest of the
strategy's launch line (builder/image/launchline.py, the derivation of `docker run` and smoke L3), the strategy's
real flags and environment, and the engine's own tensor-parallel flag for --tp N, which also asks
`nvidia.com/gpu: N`. The probes are the plan's: a startup probe whose budget is the image's measured boot plus a
stated margin (plan.py BootBudget; the budget and why in the annotation io.builder/startup-budget), readiness on
the engine data's ready path (SGLang's /health, ready only once its warm-up has run; the model list elsewhere),
liveness on its health path, each timeout above the engine's own wait there. /dev/shm is a memory emptyDir (NCCL
between the TP ranks); the model comes read-only from a PVC or a node's directory; a cold image gets a volume at the
engine data's JIT cache root with each JIT framework's cache variable pointed into it (the plan's compile cache; a
warm, jit = "prebuilt", image carries its modules and gets none); a drafter the engine downloads from the hub gets a
volume at the hub cache (HF_HUB_CACHE) so that a restart finds it. The pod stops as the plan says: a preStop sleep,
the engine's own drain flag, and terminationGracePeriodSeconds above both (annotation io.builder/shutdown-grace).

What is Kubernetes' own is here and only here: the objects' names and labels, replicas, the rollout strategy,
anti-affinity, the node affinity on GPU feature discovery's compute-capability labels (the plan's gpu_ccs: what the
image's device code runs on, narrowed by --gpu-family; the plan's GPU product), the runtime class, requests and
limits, the PodMonitor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ... import redact
from ...errors import UserError
from ...image import labels as labels_mod
from . import fit
from . import plan as plan_mod
from .plan import DEFAULT_SHM, ServePlan

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
# NVIDIA GPU feature discovery's node labels (k8s-device-plugin internal/lm/resource.go: newArchitectureLabels writes
# compute.major and compute.minor for every GPU; its gpu.family comes from getArchFamily, which answers "undefined"
# for 10.x and 12.x in some releases and for 11.x in those read here, and "ampere" for 8.9 in older ones: selecting by
# family misses Blackwell nodes; productLabel is the device name with spaces turned into dashes, NVIDIA-H200)
GPU_MAJOR = "nvidia.com/gpu.compute.major"
GPU_MINOR = "nvidia.com/gpu.compute.minor"
GPU_PRODUCT = "nvidia.com/gpu.product"
FAMILIES = fit.FAMILIES
ANNOTATION_BUDGET = "io.builder/startup-budget"
ANNOTATION_WARM = "io.builder/warm-layer"  # a warm image: the judge's one line (holds, or why the first boot compiles)
SEED_MOUNT = "/seed"  # where the seed init container sees the compile-cache volume
ANNOTATION_GRACE = "io.builder/shutdown-grace"
# the hub cache a downloaded drafter lands in: huggingface_hub reads HF_HUB_CACHE (constants.py; default
# $HF_HOME/hub), and both engines look there for a hub id's snapshot (vLLM weight_utils.py, SGLang srt/utils/common.py)
HUB_CACHE_ENV = "HF_HUB_CACHE"
HUB_CACHE_PATH = "/opt/hub-cache"
# the Deployment's rollout: recreate (the old pod is gone before the new one starts: what SGLang's own Kubernetes
# example does for its single replica), no-surge (one replica down at a time, none added: KServe's setting for
# GPU-constrained clusters), surge (one replica added before one stops: no capacity lost, but GPUs for one more
# replica must be free, vLLM production-stack's default is 100 % of them)
ROLLOUTS = ("recreate", "no-surge", "surge")


@dataclass(frozen=True)
class KubeOptions:
    """What only the manifests take (the plan holds the rest: tp, port, /dev/shm, the drafter, engine args)."""

    name: str | None = None
    namespace: str | None = None
    replicas: int = 1
    anti_affinity: bool = False  # replicas on different hosts (required)
    cpu: str | None = None
    memory: str | None = None
    compile_cache_claim: str | None = None  # a PVC for the compile cache (default: an emptyDir)
    gpu_family: str | None = None  # narrows the node affinity to the compute capabilities of one family
    gpu_affinity: bool = True  # the node affinity on GPU feature discovery's compute-capability labels
    pod_monitor: bool = False
    rollout: str | None = None  # one of ROLLOUTS (default: recreate for one replica, no-surge for more)
    runtime_class: str | None = None  # the pod's runtimeClassName
    hub_cache: str | None = None  # pvc:CLAIM[/PATH] for the hub cache (default: an emptyDir)

    def __post_init__(self) -> None:
        """Each option by its grammar, before any image is looked up (what the image's archs allow: `_name`)."""
        if self.name is not None:
            _dns_name(self.name, "--name")
        if self.namespace is not None:
            _dns_name(self.namespace, "--namespace")
        if not 1 <= self.replicas <= 1000:
            raise UserError(f"--replicas {self.replicas}: from 1 to 1000")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if value is not None:
                _quantity(value, flag)
        if self.compile_cache_claim is not None and not re.fullmatch(plan_mod.CLAIM_NAME, self.compile_cache_claim):
            raise UserError(f"--compile-cache-claim {redact.describe(self.compile_cache_claim)}: not a "
                            "PersistentVolumeClaim name (lower-case letters, digits, '-', '.'; at most 253)")
        if self.gpu_family is not None and self.gpu_family not in set(FAMILIES.values()):
            raise UserError(f"--gpu-family {redact.describe(self.gpu_family)}: not a GPU family builder knows "
                            f"({', '.join(sorted(set(FAMILIES.values())))})")
        if self.gpu_family is not None and not self.gpu_affinity:
            raise UserError("--gpu-family narrows the node affinity that --no-gpu-affinity leaves out: give one")
        if self.rollout is not None and self.rollout not in ROLLOUTS:
            raise UserError(f"--rollout {redact.describe(self.rollout)}: one of {', '.join(ROLLOUTS)}")
        if self.runtime_class is not None and not re.fullmatch(plan_mod.CLAIM_NAME, self.runtime_class):
            raise UserError(f"--runtime-class {redact.describe(self.runtime_class)}: not a RuntimeClass name "
                            "(lower-case letters, digits, '-', '.'; at most 253)")
        if self.hub_cache is not None:
            hub_claim(self.hub_cache)

    @property
    def strategy(self) -> str:
        """The rollout: the one asked, else recreate for one replica (no second pod is ever started beside it, so
        no spare GPUs are needed) and no-surge for more (one replica down at a time)."""
        return self.rollout or ("recreate" if self.replicas == 1 else "no-surge")


def hub_claim(value: str) -> plan_mod.ModelSource:
    """--hub-cache pvc:CLAIM[/PATH]: the claim the hub cache lives on."""
    kind, sep, rest = value.partition(":")
    if kind != "pvc" or not sep:
        raise UserError(f"--hub-cache {redact.describe(value)}: pvc:CLAIM[/PATH] (a PersistentVolumeClaim; without "
                        "--hub-cache the hub cache is an emptyDir)")
    name, _, sub = rest.partition("/")
    if not re.fullmatch(plan_mod.CLAIM_NAME, name):
        raise UserError(f"--hub-cache {redact.describe(value)}: {redact.describe(name)} is not a claim name "
                        "(lower-case letters, digits, '-', '.')")
    sub = sub.strip("/")
    if sub and (".." in sub.split("/") or not re.fullmatch(r"[A-Za-z0-9._@+/-]+", sub)):
        raise UserError(f"--hub-cache {redact.describe(value)}: {redact.describe(sub)} is not a relative path inside "
                        "the claim")
    return plan_mod.ModelSource("pvc", name, sub)


def _quantity(value: str, flag: str) -> str:
    if len(value) > 24 or not re.fullmatch(r"[0-9]+(\.[0-9]+)?(m|[KMGTPE]i?)?", value):  # 24: beyond any machine
        raise UserError(f"{flag} {value}: not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return value


def _dns_name(value: str, flag: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise UserError(f"{flag} {value!r}: not a Kubernetes name (lower-case letters, digits, '-'; at most 63)")
    return value


def _label_value(value: str) -> str:
    value = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _name(plan: ServePlan, opts: KubeOptions) -> str:
    """The objects' name, the options checked against Kubernetes' grammars and the image's archs."""
    name = _dns_name(opts.name or _label_value(f"{plan.engine}-{plan.strategy}".lower()).replace(".", "-")
                     .replace("_", "-"), "--name")
    _quantity(plan.shm, "--shm-size")
    _gpu_ccs(plan, opts)
    if opts.hub_cache is not None and not plan.hub_download:
        raise UserError(f"--hub-cache: the engine downloads nothing from the hub here (the model is a volume; "
                        f"{plan.strategy} {'drafts with ' + plan.drafter if plan.drafter else 'has no drafter'}): "
                        "leave it out")
    return name


def _gpu_ccs(plan: ServePlan, opts: KubeOptions) -> tuple[int, ...]:
    """The compute capabilities the node affinity admits: those the image's device code runs on (the plan's), of
    --gpu-family's family when given; () with --no-gpu-affinity. Refused when none is left."""
    if not opts.gpu_affinity:
        if plan.gpu_product is not None:
            raise UserError("--gpu-product is a term of the node affinity that --no-gpu-affinity leaves out: give one")
        return ()
    said = f"label {labels_mod.ARCHS}={plan.archs_label}" if plan.archs_label else f"no {labels_mod.ARCHS} label"
    if not plan.gpu_ccs:
        raise UserError(f"{plan.image}: no GPU builder knows runs all of the image's device code (its packages' "
                        f"io.builder.package.*.sass / .ptx labels, else {said}): the node affinity would admit no node "
                        "(--no-gpu-affinity leaves it out)")
    if opts.gpu_family is None:
        return plan.gpu_ccs
    ccs = fit.family_ccs(opts.gpu_family, plan.gpu_ccs)
    if not ccs:
        raise UserError(f"--gpu-family {opts.gpu_family}: the image's device code runs on {fit.spelled(plan.gpu_ccs)} "
                        f"only ({said})")
    return ccs


def _node_affinity(plan: ServePlan, opts: KubeOptions):
    """GPU feature discovery's compute.major / compute.minor: one term per major (terms are ORed, a term's
    expressions ANDed), each with the GPU product when one is asked; None with --no-gpu-affinity."""
    from lightkube.models import core_v1 as core

    ccs = _gpu_ccs(plan, opts)
    if not ccs:
        return None
    terms = []
    for major in sorted({cc // 10 for cc in ccs}):
        exprs = [core.NodeSelectorRequirement(key=GPU_MAJOR, operator="In", values=[str(major)]),
                 core.NodeSelectorRequirement(key=GPU_MINOR, operator="In",
                                              values=[str(cc % 10) for cc in ccs if cc // 10 == major])]
        if plan.gpu_product is not None:
            exprs.append(core.NodeSelectorRequirement(key=GPU_PRODUCT, operator="In", values=[plan.gpu_product]))
        terms.append(core.NodeSelectorTerm(matchExpressions=exprs))
    return core.NodeAffinity(requiredDuringSchedulingIgnoredDuringExecution=core.NodeSelector(nodeSelectorTerms=terms))


def _volumes(plan: ServePlan, opts: KubeOptions) -> tuple[list, list, list]:
    """(volumes, the container's mounts, its environment): /dev/shm, the model, a cold image's compile cache, the hub
    cache of a drafter the engine downloads."""
    from lightkube.models import core_v1 as core

    source, inside = plan.model, plan.model.inside
    volumes = [core.Volume(name="dshm", emptyDir=core.EmptyDirVolumeSource(medium="Memory", sizeLimit=plan.shm))]
    mounts = [core.VolumeMount(name="dshm", mountPath="/dev/shm")]
    if source.kind == "pvc":
        volumes.append(core.Volume(name="model", persistentVolumeClaim=core.PersistentVolumeClaimVolumeSource(
            claimName=source.name, readOnly=True)))
        mounts.append(core.VolumeMount(name="model", mountPath=inside, readOnly=True, subPath=source.sub or None))
    else:
        volumes.append(core.Volume(name="model", hostPath=core.HostPathVolumeSource(path=source.name, type="Directory")))
        mounts.append(core.VolumeMount(name="model", mountPath=inside, readOnly=True))
    env = [core.EnvVar(name=k, value=v) for k, v in plan.env]
    cache = plan.compile_cache
    if cache is not None:
        volumes.append(core.Volume(name="compile-cache", persistentVolumeClaim=core.PersistentVolumeClaimVolumeSource(
            claimName=opts.compile_cache_claim)) if opts.compile_cache_claim else
            core.Volume(name="compile-cache", emptyDir=core.EmptyDirVolumeSource()))
        mounts.append(core.VolumeMount(name="compile-cache", mountPath=cache.root))
        env += [core.EnvVar(name=k, value=v) for k, v in cache.env]
    if plan.hub_download:
        claim = hub_claim(opts.hub_cache) if opts.hub_cache else None
        volumes.append(core.Volume(name="hub-cache", persistentVolumeClaim=core.PersistentVolumeClaimVolumeSource(
            claimName=claim.name)) if claim else core.Volume(name="hub-cache", emptyDir=core.EmptyDirVolumeSource()))
        mounts.append(core.VolumeMount(name="hub-cache", mountPath=HUB_CACHE_PATH,
                                       subPath=(claim.sub or None) if claim else None))
        env.append(core.EnvVar(name=HUB_CACHE_ENV, value=HUB_CACHE_PATH))
    return volumes, mounts, env


def _seed(plan: ServePlan):
    """A warm image judged off its key: its compile-cache volume would hide the warm layer at the cache root, so an
    init container of the same image copies the layer's files into it first, their times kept (`cp -a`; ninja and
    FlashInfer's JIT read them), without overwriting what an earlier boot compiled there (`-n`: a claim outlives the
    pod). None for any other image."""
    from lightkube.models import core_v1 as core

    cache = plan.compile_cache
    if cache is None or not cache.seeded:
        return None
    return [core.Container(name="seed-compile-cache", image=plan.image, command=["cp"],
                           args=["-a", "-n", f"{cache.root}/.", SEED_MOUNT],
                           volumeMounts=[core.VolumeMount(name="compile-cache", mountPath=SEED_MOUNT)])]


def _probe(probe: plan_mod.Probe):
    from lightkube.models import core_v1 as core

    return core.Probe(httpGet=core.HTTPGetAction(path=probe.path, port="http"), periodSeconds=probe.period_s,
                      timeoutSeconds=probe.timeout_s, failureThreshold=probe.failures)


def _pod(plan: ServePlan, opts: KubeOptions, app: dict[str, str]):
    """The pod: the engine's container (the plan's image, arguments, environment, GPUs, probes and preStop), its
    volumes, the node affinity and anti-affinity, the GPU toleration, the runtime class and the grace period."""
    from lightkube.models import core_v1 as core
    from lightkube.models.meta_v1 import LabelSelector

    volumes, mounts, env = _volumes(plan, opts)
    init = _seed(plan)
    gpus = {GPU_RESOURCE: str(plan.tp)}
    requests, limits = dict(gpus), dict(gpus)
    if opts.cpu:
        requests["cpu"] = _quantity(opts.cpu, "--cpu")
    if opts.memory:
        requests["memory"] = limits["memory"] = _quantity(opts.memory, "--memory")
    container = core.Container(
        name="engine", image=plan.image, args=list(plan.args), env=env or None,
        ports=[core.ContainerPort(name="http", containerPort=plan.port, protocol="TCP")],
        resources=core.ResourceRequirements(requests=requests, limits=limits),
        volumeMounts=mounts, startupProbe=_probe(plan.startup), readinessProbe=_probe(plan.readiness),
        livenessProbe=_probe(plan.liveness),
        lifecycle=core.Lifecycle(preStop=core.LifecycleHandler(
            sleep=core.SleepAction(seconds=plan.shutdown.pre_stop_s))),
    )
    anti = None
    if opts.anti_affinity:
        anti = core.PodAntiAffinity(requiredDuringSchedulingIgnoredDuringExecution=[
            core.PodAffinityTerm(topologyKey="kubernetes.io/hostname", labelSelector=LabelSelector(matchLabels=app))])
    nodes = _node_affinity(plan, opts)
    return core.PodSpec(
        containers=[container], initContainers=init, volumes=volumes,
        affinity=core.Affinity(nodeAffinity=nodes, podAntiAffinity=anti) if nodes or anti else None,
        tolerations=[core.Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")],
        runtimeClassName=opts.runtime_class, terminationGracePeriodSeconds=plan.shutdown.grace_s,
    )


def _strategy(opts: KubeOptions):
    from lightkube.models.apps_v1 import DeploymentStrategy, RollingUpdateDeployment

    if opts.strategy == "recreate":
        return DeploymentStrategy(type="Recreate")
    surge = opts.strategy == "surge"
    return DeploymentStrategy(type="RollingUpdate", rollingUpdate=RollingUpdateDeployment(
        maxSurge=1 if surge else 0, maxUnavailable=0 if surge else 1))


def grace_why(plan: ServePlan) -> str:
    """The pod annotation saying how the grace period is made up."""
    stop = plan.shutdown
    drain = (f"drain {stop.drain_s}s ({stop.flag} {stop.drain_s})" if stop.flag else
             f"drain {stop.drain_s}s ({plan.engine} {plan.version} has no flag bounding its drain)")
    return f"{stop.grace_s}s: preStop sleep {stop.pre_stop_s}s + {drain} + margin {fit.STOP_MARGIN_S}s"


def resources(plan: ServePlan, opts: KubeOptions) -> list:
    """The Deployment, the Service and (opts.pod_monitor) the PodMonitor of PLAN, as lightkube resources."""
    name = _name(plan, opts)  # refused before lightkube is imported
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.models import core_v1 as core
    from lightkube.models.apps_v1 import DeploymentSpec
    from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Service

    app = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference-engine"}
    facts = {"io.builder/engine": plan.engine, "io.builder/engine-version": plan.version,
             "io.builder/strategy": plan.strategy, "io.builder/tp": str(plan.tp)}
    if plan.cell:
        facts["io.builder/cell"] = plan.cell
    pod_labels = {**app, **{k: _label_value(v) for k, v in facts.items()}}
    annotations = {ANNOTATION_BUDGET: plan.budget.why, ANNOTATION_GRACE: grace_why(plan)}
    if plan.warm is not None:
        annotations[ANNOTATION_WARM] = plan.warm.summary()
    deployment = Deployment(
        metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
        spec=DeploymentSpec(
            replicas=opts.replicas, selector=LabelSelector(matchLabels=app), strategy=_strategy(opts),
            template=core.PodTemplateSpec(metadata=ObjectMeta(labels=pod_labels, annotations=annotations),
                                          spec=_pod(plan, opts, app))))
    service = Service(metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
                      spec=core.ServiceSpec(selector=app, ports=[core.ServicePort(name="http", port=plan.port,
                                                                                  targetPort="http", protocol="TCP")]))
    out = [deployment, service]
    if opts.pod_monitor:
        PodMonitor = create_namespaced_resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
        out.append(PodMonitor(apiVersion="monitoring.coreos.com/v1", kind="PodMonitor",
                              metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
                              spec={"selector": {"matchLabels": app},
                                    "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}))
    return out


def manifests(image: str, labels: dict[str, str], kn, strategy: str, model: Path | str, opts: KubeOptions, *,
              tp: int = 1, port: int = 8000, shm: str = DEFAULT_SHM, drafter: str | None = None,
              extra_args: tuple[str, ...] = (), drain_s: int = fit.DEFAULT_DRAIN_S,
              gpu_product: str | None = None) -> list:
    """The manifests of IMAGE (REPO@sha256:…, whose labels are LABELS) under STRATEGY: its plan, derived, rendered."""
    plan = plan_mod.derive(plan_mod.KUBERNETES, image, labels, kn, strategy, model, port=port, tp=tp, shm=shm,
                           drafter=drafter, extra_args=extra_args, drain_s=drain_s, gpu_product=gpu_product)
    return resources(plan, opts)


def to_yaml(resources: list) -> str:
    from lightkube import codecs

    return codecs.dump_all_yaml(resources)
