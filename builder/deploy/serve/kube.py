"""`builder serve IMAGE --kubernetes`: the manifests that run a published image on Kubernetes — a Deployment and a
Service (and a prometheus-operator PodMonitor when asked) — built with lightkube's typed models, never as loose
dicts, and written as YAML.

The container is the image by digest with its own ENTRYPOINT and, as its arguments, the rest of the strategy's
launch line (builder/image/launchline.py, the derivation of `docker run` and smoke L3): the strategy's real flags
and environment, and the engine's own tensor-parallel flag for --tp N, which also asks `nvidia.com/gpu: N`. The
probes mean what deployers ask: a startup probe whose budget is the image's measured boot plus a stated margin
(deploy/serve/docker.py BootBudget; the budget and why in the annotation io.builder/startup-budget), readiness on the
model list (/v1/models: the model serves), liveness on the engine data's health path. /dev/shm is a memory
emptyDir (NCCL between the TP ranks); the model comes read-only from a PVC or a node's directory; a cold image
gets a volume at the engine data's JIT cache root with each JIT framework's cache variable pointed into it (a warm,
jit = "prebuilt", image carries its modules and gets none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import UserError
from ...image import labels as labels_mod
from ...image import launchline
from ..strategies import check_strategy
from . import docker as serve_mod

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource
GPU_FAMILY_LABEL = "nvidia.com/gpu.family"  # NVIDIA GPU feature discovery's node label
# compute capability → the family GPU feature discovery names (its getArchFamily: 7.0 volta, 7.5 turing, 8.0-8.7
# ampere, 8.9 ada-lovelace, 9.0 hopper, 10.x and 12.x blackwell)
FAMILIES = {70: "volta", 72: "volta", 75: "turing", 80: "ampere", 86: "ampere", 87: "ampere", 89: "ada-lovelace",
            90: "hopper", 100: "blackwell", 103: "blackwell", 110: "blackwell", 120: "blackwell", 121: "blackwell"}
ANNOTATION_BUDGET = "io.builder/startup-budget"
LIVENESS_PERIOD_S = 30
LIVENESS_TIMEOUT_S = 10  # SGLang's health path runs a one-token generation


@dataclass(frozen=True)
class KubeOptions:
    tp: int = 1
    port: int = 8000
    name: str | None = None
    namespace: str | None = None
    replicas: int = 1
    anti_affinity: bool = False  # replicas on different hosts (required)
    shm: str = serve_mod.DEFAULT_SHM
    cpu: str | None = None
    memory: str | None = None
    compile_cache_claim: str | None = None  # a PVC for the compile cache (default: an emptyDir)
    gpu_family: str | None = None  # a node selector on GPU feature discovery's family label
    pod_monitor: bool = False
    drafter: str | None = None
    extra_args: tuple[str, ...] = ()


def _quantity(value: str, flag: str) -> str:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(m|[KMGTPE]i?)?", value):
        raise UserError(f"{flag} {value}: not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return value


def _dns_name(value: str, flag: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise UserError(f"{flag} {value!r}: not a Kubernetes name (lower-case letters, digits, '-'; at most 63)")
    return value


def _label_value(value: str) -> str:
    value = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def manifests(image: str, labels: dict[str, str], kn, strategy: str, model: str, opts: KubeOptions) -> list:
    """The Deployment, the Service and (opts.pod_monitor) the PodMonitor of IMAGE (REPO@sha256:…) under STRATEGY,
    as lightkube resources."""
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.models import core_v1 as core
    from lightkube.models.apps_v1 import DeploymentSpec
    from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Service

    if "@sha256:" not in image:
        raise UserError(f"{image}: Kubernetes runs an image by digest (REPO@sha256:…): the digest is what smoke "
                        "tested; a tag can be pushed again")
    engine, version = labels_mod.engine(labels)
    if not engine or not version:
        raise UserError(f"{image}: no {labels_mod.ENGINE} / {labels_mod.ENGINE_VERSION} labels: not an image builder made")
    recipe = kn.recipe(engine, version)
    check_strategy(recipe, strategy, labels_mod.strategies(labels), image)
    s = recipe.strategy(strategy)
    source = serve_mod.ModelSource.parse(model)
    if source.kind == "volume":
        raise UserError(f"--model {model}: volume:NAME is a docker named volume; on Kubernetes use pvc:CLAIM[/PATH] "
                        "or hostpath:/DIR")
    if source.kind == "dir":
        if not source.name.startswith("/"):
            raise UserError(f"--model {model}: on Kubernetes the model is pvc:CLAIM[/PATH] or a node's directory "
                            "(hostpath:/DIR, or an absolute path)")
        source = serve_mod.ModelSource("hostpath", source.name.rstrip("/"))
    name = _dns_name(opts.name or _label_value(f"{engine}-{strategy}".lower()).replace(".", "-").replace("_", "-"),
                     "--name")
    if opts.namespace is not None:
        _dns_name(opts.namespace, "--namespace")
    if not 1 <= opts.replicas <= 1000:
        raise UserError(f"--replicas {opts.replicas}: from 1 to 1000")
    shm = _quantity(opts.shm, "--shm-size")
    archs = [int(a) for a in labels.get(labels_mod.ARCHS, "").split(",") if a.strip().isdigit()]
    if opts.gpu_family is not None:
        families = sorted({FAMILIES[a] for a in archs if a in FAMILIES})
        if opts.gpu_family not in families:
            raise UserError(f"--gpu-family {opts.gpu_family}: the image is compiled for {', '.join(families) or 'no known family'}"
                            f" (label {labels_mod.ARCHS}={labels.get(labels_mod.ARCHS, '')})")

    inside = source.inside
    drafter_value = opts.drafter or s.drafter
    values = {"model": inside, "drafter": drafter_value or "", "host": "0.0.0.0", "port": str(opts.port)}
    args = list(launchline.launch_line(recipe, s, values, extra=tuple(opts.extra_args), tp=opts.tp).args)
    budget = serve_mod.BootBudget.of(labels)

    app = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "inference-engine"}
    facts = {"io.builder/engine": engine, "io.builder/engine-version": version, "io.builder/strategy": strategy,
             "io.builder/tp": str(opts.tp)}
    if labels_mod.cell(labels):
        facts["io.builder/cell"] = labels_mod.cell(labels) or ""
    pod_labels = {**app, **{k: _label_value(v) for k, v in facts.items()}}

    volumes = [core.Volume(name="dshm", emptyDir=core.EmptyDirVolumeSource(medium="Memory", sizeLimit=shm))]
    mounts = [core.VolumeMount(name="dshm", mountPath="/dev/shm")]
    if source.kind == "pvc":
        volumes.append(core.Volume(name="model", persistentVolumeClaim=core.PersistentVolumeClaimVolumeSource(
            claimName=source.name, readOnly=True)))
        mounts.append(core.VolumeMount(name="model", mountPath=inside, readOnly=True, subPath=source.sub or None))
    else:
        volumes.append(core.Volume(name="model", hostPath=core.HostPathVolumeSource(path=source.name, type="Directory")))
        mounts.append(core.VolumeMount(name="model", mountPath=inside, readOnly=True))
    env = [core.EnvVar(name=k, value=v) for k, v in s.env]
    # cold: what it compiles at its first requests survives a restart; a warm image (builder warm) carries it
    if not labels_mod.jit_prebuilt(labels) and not labels_mod.warm(labels):
        root = kn.jit_cache_root()
        volumes.append(core.Volume(name="compile-cache", persistentVolumeClaim=core.PersistentVolumeClaimVolumeSource(
            claimName=opts.compile_cache_claim)) if opts.compile_cache_claim else
            core.Volume(name="compile-cache", emptyDir=core.EmptyDirVolumeSource()))
        mounts.append(core.VolumeMount(name="compile-cache", mountPath=root))
        caches = {m["cache_env"]: m["cache_dir"] for m in kn.jit_modules_of(recipe, (strategy,))}
        env += [core.EnvVar(name=k, value=v) for k, v in sorted(caches.items()) if k not in dict(s.env)]

    gpus = {GPU_RESOURCE: str(opts.tp)}
    requests, limits = dict(gpus), dict(gpus)
    if opts.cpu:
        requests["cpu"] = _quantity(opts.cpu, "--cpu")
    if opts.memory:
        requests["memory"] = limits["memory"] = _quantity(opts.memory, "--memory")

    def http(path: str):
        return core.HTTPGetAction(path=path, port="http")

    container = core.Container(
        name="engine", image=image, args=args, env=env or None,
        ports=[core.ContainerPort(name="http", containerPort=opts.port, protocol="TCP")],
        resources=core.ResourceRequirements(requests=requests, limits=limits),
        volumeMounts=mounts,
        startupProbe=core.Probe(httpGet=http(serve_mod.READY_PATH), periodSeconds=serve_mod.PROBE_PERIOD_S,
                                timeoutSeconds=serve_mod.PROBE_TIMEOUT_S, failureThreshold=budget.failures),
        readinessProbe=core.Probe(httpGet=http(serve_mod.READY_PATH), periodSeconds=serve_mod.PROBE_PERIOD_S,
                                  timeoutSeconds=serve_mod.PROBE_TIMEOUT_S, failureThreshold=3),
        livenessProbe=core.Probe(httpGet=http(recipe.health or serve_mod.READY_PATH), periodSeconds=LIVENESS_PERIOD_S,
                                 timeoutSeconds=LIVENESS_TIMEOUT_S, failureThreshold=3),
    )
    affinity = None
    if opts.anti_affinity:
        affinity = core.Affinity(podAntiAffinity=core.PodAntiAffinity(requiredDuringSchedulingIgnoredDuringExecution=[
            core.PodAffinityTerm(topologyKey="kubernetes.io/hostname", labelSelector=LabelSelector(matchLabels=app))]))
    pod = core.PodSpec(
        containers=[container], volumes=volumes, affinity=affinity,
        nodeSelector={GPU_FAMILY_LABEL: opts.gpu_family} if opts.gpu_family else None,
        tolerations=[core.Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")],
    )
    annotations = {ANNOTATION_BUDGET: budget.why}
    meta = ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels)
    deployment = Deployment(
        metadata=meta,
        spec=DeploymentSpec(
            replicas=opts.replicas, selector=LabelSelector(matchLabels=app),
            template=core.PodTemplateSpec(metadata=ObjectMeta(labels=pod_labels, annotations=annotations), spec=pod)))
    service = Service(metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
                      spec=core.ServiceSpec(selector=app, ports=[core.ServicePort(name="http", port=opts.port,
                                                                                  targetPort="http", protocol="TCP")]))
    out = [deployment, service]
    if opts.pod_monitor:
        PodMonitor = create_namespaced_resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
        out.append(PodMonitor(apiVersion="monitoring.coreos.com/v1", kind="PodMonitor",
                              metadata=ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels),
                              spec={"selector": {"matchLabels": app},
                                    "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}))
    return out


def to_yaml(resources: list) -> str:
    from lightkube import codecs

    return codecs.dump_all_yaml(resources)
