"""`builder serve IMAGE --kubernetes`: a serve plan (deploy/serve/plan.py) rendered as the manifests that run a
published image on Kubernetes — a Deployment and a Service (and a prometheus-operator PodMonitor when asked) — built
with lightkube's typed models, never as loose dicts, and written as YAML.

The container is the image by digest with its own ENTRYPOINT and, as its arguments, the plan's: the rest of the
strategy's launch line (builder/image/launchline.py, the derivation of `docker run` and smoke L3), the strategy's
real flags and environment, and the engine's own tensor-parallel flag for --tp N, which also asks
`nvidia.com/gpu: N`. The probes are the plan's: a startup probe whose budget is the image's measured boot plus a
stated margin (plan.py BootBudget; the budget and why in the annotation io.builder/startup-budget), readiness on
the model list (/v1/models: the model serves), liveness on the engine data's health path. /dev/shm is a memory
emptyDir (NCCL between the TP ranks); the model comes read-only from a PVC or a node's directory; a cold image
gets a volume at the engine data's JIT cache root with each JIT framework's cache variable pointed into it (the
plan's compile cache; a warm, jit = "prebuilt", image carries its modules and gets none).

What is Kubernetes' own is here and only here: the objects' names and labels, replicas, anti-affinity, the node
selector on the GPU family (checked against the image's archs), requests and limits, the PodMonitor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ... import redact
from ...errors import UserError
from ...image import labels as labels_mod
from . import plan as plan_mod
from .plan import DEFAULT_SHM, ServePlan

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"  # NVIDIA GPU feature discovery's node label
# compute capability → the family GPU feature discovery names (its getArchFamily: 7.0 volta, 7.5 turing, 8.0-8.7
# ampere, 8.9 ada-lovelace, 9.0 hopper, 10.x and 12.x blackwell)
FAMILIES = {70: "volta", 72: "volta", 75: "turing", 80: "ampere", 86: "ampere", 87: "ampere", 89: "ada-lovelace",
            90: "hopper", 100: "blackwell", 103: "blackwell", 110: "blackwell", 120: "blackwell", 121: "blackwell"}
ANNOTATION_BUDGET = "io.builder/startup-budget"


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
    gpu_family: str | None = None  # a node selector on GPU feature discovery's family label
    pod_monitor: bool = False

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
            raise UserError(f"--gpu-family {redact.describe(self.gpu_family)}: not a family GPU feature discovery "
                            f"names ({', '.join(sorted(set(FAMILIES.values())))})")


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
    if opts.gpu_family is not None:
        families = sorted({FAMILIES[a] for a in plan.archs if a in FAMILIES})
        if opts.gpu_family not in families:
            raise UserError(f"--gpu-family {opts.gpu_family}: the image is compiled for {', '.join(families) or 'no known family'}"
                            f" (label {labels_mod.ARCHS}={plan.archs_label})")
    return name


def _volumes(plan: ServePlan, opts: KubeOptions) -> tuple[list, list, list]:
    """(volumes, the container's mounts, its environment): /dev/shm, the model, a cold image's compile cache."""
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
    return volumes, mounts, env


def _probe(probe: plan_mod.Probe):
    from lightkube.models import core_v1 as core

    return core.Probe(httpGet=core.HTTPGetAction(path=probe.path, port="http"), periodSeconds=probe.period_s,
                      timeoutSeconds=probe.timeout_s, failureThreshold=probe.failures)


def _pod(plan: ServePlan, opts: KubeOptions, app: dict[str, str]):
    """The pod: the engine's container (the plan's image, arguments, environment, GPUs and probes), its volumes,
    anti-affinity, the node selector and the GPU toleration."""
    from lightkube.models import core_v1 as core
    from lightkube.models.meta_v1 import LabelSelector

    volumes, mounts, env = _volumes(plan, opts)
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
    )
    affinity = None
    if opts.anti_affinity:
        affinity = core.Affinity(podAntiAffinity=core.PodAntiAffinity(requiredDuringSchedulingIgnoredDuringExecution=[
            core.PodAffinityTerm(topologyKey="kubernetes.io/hostname", labelSelector=LabelSelector(matchLabels=app))]))
    return core.PodSpec(
        containers=[container], volumes=volumes, affinity=affinity,
        nodeSelector={GPU_FAMILY_LABEL: opts.gpu_family} if opts.gpu_family else None,
        tolerations=[core.Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")],
    )


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
    annotations = {ANNOTATION_BUDGET: plan.budget.why}
    deployment = Deployment(
        metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
        spec=DeploymentSpec(
            replicas=opts.replicas, selector=LabelSelector(matchLabels=app),
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
              extra_args: tuple[str, ...] = ()) -> list:
    """The manifests of IMAGE (REPO@sha256:…, whose labels are LABELS) under STRATEGY: its plan, derived, rendered."""
    plan = plan_mod.derive(plan_mod.KUBERNETES, image, labels, kn, strategy, model, port=port, tp=tp, shm=shm,
                           drafter=drafter, extra_args=extra_args)
    return resources(plan, opts)


def to_yaml(resources: list) -> str:
    from lightkube import codecs

    return codecs.dump_all_yaml(resources)
