"""`builder serve IMAGE`: the exact `docker run` of a published image under a strategy (and, with --run, run it)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from .. import matrix as matrix_mod
from ..deploy import runflags, strategies
from ..errors import EXIT_FAILED, Failed, UserError
from ..options import flag_default
from . import flags
from .app import main


def plan_default(name: str):
    from ..deploy.serve import plan as plan_mod

    return getattr(plan_mod, name)


def fit_default(name: str):
    from ..deploy.serve import fit

    return getattr(fit, name)


def _bind_address(value: str) -> str:
    """--bind: one IP address of this host to publish the port on ('' would mean every interface); an IPv6
    address comes back in brackets, as docker's -p wants it."""
    import ipaddress

    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        addr = ipaddress.ip_address(bare)
    except ValueError:
        raise UserError(f"--bind: {value!r} is not an IP address (127.0.0.1, the default; 0.0.0.0 for every "
                        "interface, said explicitly)") from None
    return f"[{addr}]" if addr.version == 6 else str(addr)


KUBE_ONLY = ("output", "namespace", "replicas", "anti_affinity", "pod_monitor", "cpu", "memory",
             "compile_cache_claim", "gpu_family", "gpu_product", "no_gpu_affinity", "rollout", "runtime_class",
             "hub_cache")


@main.command("serve")
@click.argument("image")
@click.option("--strategy", required=True,
              help="A strategy of the engine data (e.g. MTP2): its real flags come from the engine data.")
@click.option("--model", "model_path", required=True,
              help="The checkpoint: a directory on this host (docker: mounted read-only at /models/<name>), "
                   "volume:NAME (a docker named volume), pvc:CLAIM[/PATH] or hostpath:/DIR (Kubernetes; an absolute "
                   "path is a node's directory there).")
@click.option("--port", type=flags.Number(1, 65535, "a TCP port", integer=True), default=flag_default("serve_port"), show_default=True, help="The port the engine listens on, published as the same.")
@click.option("--bind", default=flag_default("serve_bind"), show_default=True,
              help="The host address the port is published on (0.0.0.0: every interface).")
@click.option("--gpus", default=flag_default("serve_gpus"), show_default=True, help=flags.GPUS_HELP)
@click.option("--tp", "tp", type=flags.Number(1, 64, "a tensor-parallel size", integer=True), default=1,
              show_default=True, help=flags.TP_HELP)
@click.option("--shm-size", "shm", default=plan_default("DEFAULT_SHM"), show_default=True,
              help="/dev/shm for NCCL between the tensor-parallel ranks: docker's --shm-size, a memory emptyDir's "
                   "sizeLimit on Kubernetes.")
@click.option("--drafter", default=None, help="The strategy's draft model: a directory (mounted) or a hub id "
                                              "(default: the engine data's, for DFlash2).")
@click.option("--name", default=None, help="The container's name (Kubernetes: the Deployment's and Service's).")
@click.option("--kubernetes", "kubernetes", is_flag=True,
              help="Write Kubernetes manifests instead (a Deployment and a Service; the image by digest).")
@click.option("-o", "--output", "output", type=flags.FsPath(dir_okay=False), default=None,
              help="Write the manifests to FILE (default: stdout). Kubernetes only, as the options below.")
@click.option("--namespace", default=None, help="The manifests' namespace (default: none, kubectl's).")
@click.option("--replicas", type=flags.Number(1, 1000, "a number of replicas", integer=True), default=None, help="The Deployment's replicas (default 1).")
@click.option("--anti-affinity", "anti_affinity", is_flag=True, default=None,
              help="Replicas on different hosts (a required pod anti-affinity on kubernetes.io/hostname).")
@click.option("--pod-monitor", "pod_monitor", is_flag=True, default=None,
              help="Add a prometheus-operator PodMonitor scraping the engine's /metrics.")
@click.option("--cpu", default=None, help="CPU the pod requests (a quantity, e.g. 16).")
@click.option("--memory", default=None, help="Memory the pod requests and is limited to (e.g. 256Gi; /dev/shm counts "
                                             "against it).")
@click.option("--compile-cache-claim", "compile_cache_claim", default=None,
              help="A PVC for the compile cache (default: an emptyDir): a cold image's, and a warm image's, seeded "
                   "from its warm layer by an init container.")
@click.option("--gpu-family", "gpu_family", default=None,
              help="Admit only GPUs of this family (e.g. hopper, blackwell) among those the image's device code "
                   "runs on: the node affinity's compute capabilities narrowed to it.")
@click.option("--gpu-product", "gpu_product", default=None,
              help="Admit only nodes whose GPU feature discovery label nvidia.com/gpu.product is NAME (its form, with "
                   "dashes: NVIDIA-H200), besides the compute capabilities.")
@click.option("--no-gpu-affinity", "no_gpu_affinity", is_flag=True, default=None,
              help="Leave out the node affinity on GPU feature discovery's nvidia.com/gpu.compute.major / .minor "
                   "(a cluster without those labels); any GPU node may then get the pod.")
@click.option("--rollout", default=None,
              help="How a new version replaces the pods: recreate (Recreate), no-surge (RollingUpdate maxSurge 0, "
                   "maxUnavailable 1) or surge (maxSurge 1, maxUnavailable 0: GPUs for one more replica). Default: "
                   "recreate for one replica, no-surge for more; neither needs spare GPUs.")
@click.option("--runtime-class", "runtime_class", default=None,
              help="The pod's runtimeClassName (e.g. nvidia, where the NVIDIA container runtime is not the default).")
@click.option("--hub-cache", "hub_cache", default=None,
              help="pvc:CLAIM[/PATH] for the hub cache (HF_HUB_CACHE) a drafter named by hub id is downloaded to "
                   "(default: an emptyDir, which survives container restarts but not a new pod).")
@click.option("--drain-timeout", "drain_s", type=flags.Number(0, 3600, "a number of seconds", integer=True),
              default=fit_default("DEFAULT_DRAIN_S"), show_default=True,
              help="Seconds in-flight requests may finish after SIGTERM: the engine's own flag where it has one (vLLM "
                   ">= 0.18 --shutdown-timeout; 0 aborts them), and the grace before SIGKILL above it (Kubernetes' "
                   "terminationGracePeriodSeconds after a 15 s preStop sleep; docker's --stop-timeout).")
@flags.engine_args
@flags.matrix
@click.option("--run", "do_run", is_flag=True, help="Run it (in the foreground; Ctrl-C stops the container).")
@flags.verification
def serve(image, strategy, model_path, port, bind, gpus, tp, shm, drafter, name, kubernetes, output, namespace,
          replicas, anti_affinity, pod_monitor, cpu, memory, compile_cache_claim, gpu_family, gpu_product,
          no_gpu_affinity, rollout, runtime_class, hub_cache, drain_s, engine_args, matrix_path, do_run, verification):
    """Print the exact `docker run` that serves IMAGE (a tag or REPO@sha256:…) with STRATEGY: the GPUs (--tp N:
    N of them and the engine's own tensor-parallel flag), /dev/shm, the model mounted read-only, the port, a health
    check on the engine's ready path sized from the image's measured boot, a stop timeout above the engine's drain,
    and the strategy's real flags and environment from the engine data for the engine version the image's labels
    name. With --run, run it. With --kubernetes, write the Deployment and Service (and --pod-monitor's PodMonitor)
    that run the image by digest: N GPUs on nodes whose compute capability the image's device code runs on, a
    startup probe from the image's measured boot (default 900 s), readiness on the engine's ready path, liveness on
    its health path, /dev/shm as a memory emptyDir, the compile cache of a cold image, the hub cache of a downloaded
    drafter, a rollout that needs no spare GPUs and a grace period above the engine's drain.

    \b
    Example:
      builder serve 127.0.0.1:5000/builder/vllm@sha256:… --strategy MTP2 --model /srv/models/Qwen3.8-27B-FP8
      builder serve 127.0.0.1:5000/builder/sglang:0.5.23 --strategy DFlash2 --model /srv/models/q --gpus 0,1 --run
      builder serve registry.example.com/ml/vllm@sha256:… --strategy MTP2 --tp 8 --kubernetes \\
          --model pvc:models/Qwen3.8-27B-FP8 --replicas 2 --anti-affinity --pod-monitor -o vllm.yaml
    """
    from ..deploy import subject
    from ..deploy.serve import plan as plan_mod
    from ..engines import load_knowledge
    from ..image import launchline

    tp = runflags.tp(tp)
    runflags.port(port)
    bind = _bind_address(bind)
    if kubernetes:  # docker's own options are not silently dropped from the manifests
        if said := [f"--{p}" for p in ("gpus", "bind") if flags.given(click.get_current_context(), p)]:
            what = "a docker option" if len(said) == 1 else "docker options"
            raise UserError(f"{', '.join(said)}: {what}; on Kubernetes the pod asks for --tp GPUs (nvidia.com/gpu) "
                            "and the Service publishes the port: leave them out")
    target, kube_opts = _target(kubernetes, do_run, name, {
        "output": output, "namespace": namespace, "replicas": replicas, "anti_affinity": anti_affinity,
        "pod_monitor": pod_monitor, "cpu": cpu, "memory": memory, "compile_cache_claim": compile_cache_claim,
        "gpu_family": gpu_family, "gpu_product": gpu_product, "no_gpu_affinity": no_gpu_affinity, "rollout": rollout,
        "runtime_class": runtime_class, "hub_cache": hub_cache})
    gpus = plan_mod.check_flags(target, image, model_path, shm, gpus, tp)  # before the image is looked up
    if name is not None and not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
        raise UserError(f"--name: {name!r} is not a container name (letters, digits, '_', '.', '-')")
    extra = runflags.engine_args(engine_args)
    kn = matrix_mod.load(Path(matrix_path)).knowledge if Path(matrix_path).is_file() else load_knowledge()
    strategy = strategies.one(strategy, strategies.known(kn))  # the engine data's names, extra files included
    found = subject.read(image, files=target.image_file)  # the daemon's, else the registry's: nothing pulled
    from .verify import say_verified

    say_verified(image, verification, matrix_path, lambda line: click.echo(line, err=True))
    launchline.tp_args(found.recipe(kn), tp)  # an engine without a tensor-parallel flag: refused now
    plan = plan_mod.derive(target, plan_mod.reference(target, image, found.digest), found.labels, kn, strategy,
                           model_path, port=port, gpus=gpus, tp=tp, shm=shm, drafter=drafter, extra_args=extra,
                           drain_s=drain_s, gpu_product=gpu_product, gpu=_serving_gpu(target, found.labels, gpus))
    if kube_opts is not None:
        _write_manifests(plan, kube_opts, output)
    else:
        _docker_line(plan, image, bind, name, do_run)


def _serving_gpu(target, labels: dict[str, str], gpus: str):
    """The GPU the engine gets on this host (docker, a warm image: the judge compares it with the layer's key): the
    first of --gpus IDS, else GPU 0; None on Kubernetes (the node is the scheduler's), without a warm layer or a
    GPU here."""
    from ..image import labels as labels_mod

    if not target.this_host or not labels_mod.warm(labels) or gpus == "none":
        return None
    from ..deploy.runtime import gpus as gpus_mod

    ids = tuple(int(i) for i in gpus.split(",") if i.isdigit()) if gpus not in ("all", "auto") else ()
    return gpus_mod.read().chosen(ids)


def _target(kubernetes: bool, do_run: bool, name: str | None, kube_only: dict):
    """(the plan's target, the manifests' options): the one place --kubernetes is read. Without it a Kubernetes
    option is refused; with it, --run."""
    from ..deploy.serve import plan as plan_mod

    given = {k: v for k, v in kube_only.items() if v is not None}
    if not kubernetes:
        if given:
            raise UserError(f"--{next(iter(given)).replace('_', '-')}: a Kubernetes option (give --kubernetes)")
        return plan_mod.DOCKER, None
    if do_run:
        raise UserError("--run runs the docker line; --kubernetes writes manifests (kubectl apply -f them)")
    if given.get("output"):  # a file in its way: refused now, not once the manifests are made
        from .. import files

        files.writable_dir(Path(given["output"]).parent, f"-o {given['output']}")
    from ..deploy.serve import fit, kube

    if given.get("gpu_product") is not None:
        fit.check_product(given["gpu_product"])
        if given.get("no_gpu_affinity"):
            raise UserError("--gpu-product is a term of the node affinity that --no-gpu-affinity leaves out: give one")
    opts = kube.KubeOptions(name=name, namespace=given.get("namespace"), replicas=given.get("replicas") or 1,
                            anti_affinity=bool(given.get("anti_affinity")), cpu=given.get("cpu"),
                            memory=given.get("memory"), compile_cache_claim=given.get("compile_cache_claim"),
                            gpu_family=given.get("gpu_family"), gpu_affinity=not given.get("no_gpu_affinity"),
                            pod_monitor=bool(given.get("pod_monitor")), rollout=given.get("rollout"),
                            runtime_class=given.get("runtime_class"), hub_cache=given.get("hub_cache"))
    return plan_mod.KUBERNETES, opts


def _write_manifests(plan, opts, output: str | None) -> None:
    from ..deploy.serve import kube

    text = kube.to_yaml(kube.resources(plan, opts))
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise UserError(f"-o {output}: {exc.strerror or exc}") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


def _docker_line(plan, image: str, bind: str, name: str | None, do_run: bool) -> None:
    """Print the `docker run` of PLAN (its notes on stderr) and, with --run, run it in the foreground."""
    from .. import docker
    from ..deploy.serve import docker as serve_docker

    line = serve_docker.line(plan, bind=bind, name=name)
    if plan.image != image:  # the digest read, never the tag: what runs is what was read
        click.echo(f"# {image} read as {plan.image}: the command runs that image, wherever the tag moves", err=True)
    for note in line.notes:
        click.echo(f"# {note}", err=True)
    if line.health:
        click.echo(f"# ready when {line.health} answers 200", err=True)
    click.echo(line.command)
    if not do_run:
        return
    proc = docker.popen(line.argv, process_group=0)
    try:
        rc = proc.wait()
    except BaseException:
        click.echo(f"stopping: {docker.stop_group(proc)}", err=True)
        raise
    if rc:
        raise Failed(exit_code=rc if rc < 128 else EXIT_FAILED)
