"""Deployers on Kubernetes and on several GPUs: `builder serve IMAGE --kubernetes` writes a Deployment and a Service
(and a PodMonitor) with the strategy's real flags and environment, N GPUs for --tp N on nodes whose compute capability
the image's device code runs on, probes sized from the image's measured boot on the engine data's ready and health
paths, /dev/shm, the model from a PVC or a node's directory, a compile cache for a cold image, a hub cache for a
downloaded drafter, a rollout that needs no spare GPUs and a grace period above the engine's drain; every manifest
validates offline against the schema of Kubernetes 1.37 (kubernetes-validate's, strict: an unknown field fails). --tp
N reaches smoke's, bench's and serve's launch line with the engine's own flag and asks N GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.deploy import runflags
from builder.deploy.serve import fit, kube
from builder.deploy.serve import docker as serve
from builder.deploy.runtime.gpus import Gpu, HostGpus
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.image import labels as labels_mod
from builder.image import launchline
from builder.matrix import Selection, load
from builder.plan import plan_cells
from builder.resolve import select

from tests.helpers import REPO

K8S = "1.37.0"  # the Kubernetes release whose schema the manifests are held to (kubernetes-validate ships it)
DIGEST = "@sha256:" + "a" * 64


def shipped_images() -> list[tuple[str, dict[str, str]]]:
    """(image by digest, labels) of every cell of the shipped matrix, its labels as the image build writes them
    (image/labels.py written), the audited ones (build arguments there) as an audit that found the SASS the plan
    predicts."""
    m = load(REPO / "matrix.toml")
    out = []
    for plan in plan_cells(select(m, Selection(profiles=("all",))), None):
        written = {k: v for k, v, _ in labels_mod.written(plan.cell, plan.keys)}
        for p in plan.cell.packages:
            if p.recipe.compiled:
                written.update({labels_mod.package(p.name, "sass"): ",".join(p.built_sass),
                                labels_mod.package(p.name, "ptx"): "", labels_mod.package(p.name, "binaries"): ""})
        assert not [k for k, v in written.items() if v.startswith("${")]
        out.append((f"registry.example.com/ml/{plan.cell.engine}{DIGEST}", written))
    return out


IMAGES = shipped_images()


def pick(engine: str) -> tuple[str, dict[str, str]]:
    """A shipped cell of ENGINE built for MTP2."""
    return next((i, lab) for i, lab in IMAGES if lab[labels_mod.ENGINE] == engine and "MTP2" in labels_mod.strategies(lab))


def validate(text: str) -> list[dict]:
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        if d["kind"] != "PodMonitor":  # a CRD: not in the core schema (see test_the_pod_monitor_...)
            kubernetes_validate.validate(d, K8S, strict=True)
    return docs


def container(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]


def pod(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def node_terms(docs: list[dict]) -> dict[int, list[int]]:
    """{major: [minors]} of the pod's required node affinity on GPU feature discovery's compute capability."""
    terms = pod(docs)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    out = {}
    for t in terms:
        e = {x["key"]: x for x in t["matchExpressions"]}
        assert e[kube.GPU_MAJOR]["operator"] == e[kube.GPU_MINOR]["operator"] == "In"
        (major,) = e[kube.GPU_MAJOR]["values"]
        out[int(major)] = [int(v) for v in e[kube.GPU_MINOR]["values"]]
    return out


@pytest.mark.pure
def test_the_validator_is_offline_and_strict():
    """kubernetes-validate reads the schema it ships (no network) and refuses an unknown field and a wrong type."""
    image, labels = next((i, lab) for i, lab in IMAGES if labels_mod.strategies(lab))
    text = kube.to_yaml(kube.manifests(image, labels, load_knowledge(), labels_mod.strategies(labels)[0],
                                       "pvc:models/Q", kube.KubeOptions()))
    deployment = yaml.safe_load_all(text).__next__()
    kubernetes_validate.validate(deployment, K8S, strict=True)
    bad = yaml.safe_load(text.split("---")[0])
    bad["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["initialDelay"] = 600
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S, strict=True)
    bad = yaml.safe_load(text.split("---")[0])
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S, strict=True)


@pytest.mark.pure
@pytest.mark.parametrize("tp", [1, 8])
def test_every_shipped_cell_every_strategy_validates_against_the_kubernetes_schema(tp):
    kn = load_knowledge()
    engines, seen = set(), 0
    for image, labels in IMAGES:
        recipe = kn.recipe(labels[labels_mod.ENGINE], labels[labels_mod.ENGINE_VERSION])
        for strategy in labels_mod.strategies(labels):
            opts = kube.KubeOptions(replicas=2, anti_affinity=True, pod_monitor=True, cpu="16", memory="256Gi")
            docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, strategy, "pvc:models/Qwen3.8-27B-FP8",
                                                        opts, tp=tp)))
            assert [d["kind"] for d in docs] == ["Deployment", "Service", "PodMonitor"]
            c = container(docs)
            s = recipe.strategy(strategy)
            values = {"model": "/models/Qwen3.8-27B-FP8", "drafter": s.drafter, "host": "0.0.0.0", "port": "8000"}
            stop = fit.Shutdown.of(recipe, fit.DEFAULT_DRAIN_S)
            assert c["args"] == list(launchline.launch_line(recipe, s, values, extra=stop.args, tp=tp).args)  # one derivation
            assert c["image"] == image
            assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == str(tp)
            if tp > 1:
                assert c["args"][len(c["args"]) - len(stop.args) - 2:][:2] == [recipe.tp_flag, str(tp)]
            assert {e["name"]: e["value"] for e in c.get("env", [])}.items() >= dict(s.env).items()
            # the nodes: every shipped cell is built for 8.0 and 9.0 (sm_80 SASS runs on 8.x from 8.0; sm_90 / sm_90a on 9.0)
            assert labels[labels_mod.ARCHS] == "80,90" and node_terms(docs) == {8: [0, 6, 7, 9], 9: [0]}
            assert pod(docs)["terminationGracePeriodSeconds"] == stop.grace_s > stop.drain_s + stop.pre_stop_s
            assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": stop.pre_stop_s}}}
            assert docs[0]["spec"]["strategy"] == {"type": "RollingUpdate",  # two replicas: one down at a time
                                                   "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
            engines.add(labels[labels_mod.ENGINE])
            seen += 1
    assert engines == {"vllm", "sglang"} and seen >= 4



@pytest.mark.pure
def test_probes_shm_model_and_compile_cache():
    kn = load_knowledge()
    image, labels = pick("sglang")
    docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "hostpath:/srv/models/Q",
                                                kube.KubeOptions(), tp=8, shm="32Gi")))
    dep = docs[0]
    pod, c = dep["spec"]["template"]["spec"], container(docs)
    recipe = kn.recipe("sglang", labels[labels_mod.ENGINE_VERSION])
    # no boot label: the stated default, 900 s at 10 s a probe; the annotation says so. SGLang is ready once its
    # warm-up has run (engine data ready_path /health; its /v1/models answers before), and /health and its health
    # path may take the engine's own 20 s to answer: every timeout is above that
    assert (recipe.ready_path, recipe.health, recipe.health_wait_s) == ("/health", "/health_generate", 20)
    assert c["startupProbe"] == {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                                 "timeoutSeconds": 25, "failureThreshold": 90}
    assert "initialDelaySeconds" not in str(dep)
    assert "900s" in dep["spec"]["template"]["metadata"]["annotations"]["io.builder/startup-budget"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and c["readinessProbe"]["timeoutSeconds"] == 25
    assert c["livenessProbe"]["httpGet"]["path"] == "/health_generate" and c["livenessProbe"]["timeoutSeconds"] == 25
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert vols["model"]["hostPath"] == {"path": "/srv/models/Q", "type": "Directory"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["dshm"]["mountPath"] == "/dev/shm" and mounts["model"] == {"name": "model", "mountPath": "/models/Q",
                                                                               "readOnly": True}
    # a cold image: the engine data's JIT cache root, each framework's cache variable pointed into it
    assert mounts["compile-cache"]["mountPath"] == kn.jit_cache_root() and "emptyDir" in vols["compile-cache"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["SGLANG_JIT_CACHE_DIR"] == f"{kn.jit_cache_root()}/sglang"
    # a measured boot: budget = boot + the larger of the boot and 120 s
    for boot, budget in (("51", 171), ("520", 1040)):
        docs = validate(kube.to_yaml(kube.manifests(image, {**labels, labels_mod.BOOT_SECONDS: boot}, kn, "MTP2",
                                                    "pvc:models", kube.KubeOptions(compile_cache_claim="jit"))))
        c = container(docs)
        assert c["startupProbe"]["failureThreshold"] * 10 >= budget > (c["startupProbe"]["failureThreshold"] - 1) * 10
        note = docs[0]["spec"]["template"]["metadata"]["annotations"]["io.builder/startup-budget"]
        assert note.startswith(f"{budget}s: the image's measured boot {boot}s")
        vols = {v["name"]: v for v in docs[0]["spec"]["template"]["spec"]["volumes"]}
        assert vols["compile-cache"]["persistentVolumeClaim"] == {"claimName": "jit"}
    # a warm image (jit = "prebuilt") carries its modules: no compile-cache volume
    warm = {**labels, labels_mod.CELL: labels[labels_mod.CELL] + "-jitprebuilt"}
    c = container(validate(kube.to_yaml(kube.manifests(image, warm, kn, "MTP2", "pvc:m", kube.KubeOptions()))))
    assert "compile-cache" not in {m["name"] for m in c["volumeMounts"]}


@pytest.mark.pure
def test_replicas_anti_affinity_node_affinity_and_pod_monitor():
    kn = load_knowledge()
    image, labels = pick("vllm")
    family = fit.FAMILIES[int(labels[labels_mod.ARCHS].split(",")[-1])]
    docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(
        replicas=3, anti_affinity=True, gpu_family=family, pod_monitor=True, namespace="llm"))))
    dep, svc, pm = docs
    spec = pod(docs)
    assert dep["spec"]["replicas"] == 3 and "nodeSelector" not in spec and node_terms(docs) == {9: [0]}
    term = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert dep["spec"]["template"]["metadata"]["labels"]["io.builder/engine"] == "vllm"
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["metadata"]["namespace"] == "llm"
    assert pm["spec"] == {"selector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]},
                          "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}
    with pytest.raises(UserError, match=r"--gpu-family volta: the image's device code runs on ampere 8.0, 8.6, 8.7; "
                                        r"ada-lovelace 8.9; hopper 9.0 only \(label io.builder.archs=80,90\)"):
        kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(gpu_family="volta"))
    with pytest.raises(UserError, match="by digest"):
        kube.manifests("reg.example/ml/vllm:0.33.0", labels, kn, "MTP2", "pvc:m", kube.KubeOptions())
    with pytest.raises(UserError, match="docker named volume"):
        kube.manifests(image, labels, kn, "MTP2", "volume:models", kube.KubeOptions())


@pytest.mark.pure
def test_tp_sets_the_engines_own_flag_and_asks_n_gpus():
    kn = load_knowledge()
    assert launchline.tp_args(kn.recipe("vllm", "0.33.0"), 8) == ["--tensor-parallel-size", "8"]
    assert launchline.tp_args(kn.recipe("sglang", "0.5.23"), 8) == ["--tp-size", "8"]
    assert launchline.tp_args(kn.recipe("vllm", "0.33.0"), 1) == []
    from dataclasses import replace
    with pytest.raises(UserError, match="names no tensor-parallel flag"):
        launchline.tp_args(replace(kn.recipe("vllm", "0.33.0"), tp_flag=""), 2)
    # the GPUs: ids must be N; auto / all become the host's first N; a host with fewer is refused
    host = HostGpus(tuple(Gpu(i, "NVIDIA H200", "580.1", 90, "NVIDIA") for i in range(4)))
    assert runflags.Gpus.parse("auto").for_tp(2, host) == runflags.Gpus("ids", (0, 1))
    assert runflags.Gpus.parse("all").for_tp(4, host).ids == (0, 1, 2, 3)
    with pytest.raises(UserError, match=r"--tp 8: this host has 4 GPUs"):
        runflags.Gpus.parse("all").for_tp(8, host)
    with pytest.raises(UserError, match="names 1 GPU; tensor parallel 2"):
        runflags.Gpus.parse("3").for_tp(2, host)
    with pytest.raises(UserError, match="none gives the engine no GPU"):
        runflags.Gpus.parse("none").for_tp(2, host)
    assert runflags.Gpus.parse("auto").for_tp(8, HostGpus((), "no nvidia-smi")).mode == "auto"  # unknown: not refused
    # the docker line: --gpus 8 (docker's count), the engine's flag, /dev/shm, the health check's start period
    model = REPO / "tests"
    line = serve.serve_line("img" + DIGEST, {"io.builder.engine": "vllm", "io.builder.engine.version": "0.33.0",
                                             "io.builder.strategies": "MTP2", labels_mod.BOOT_SECONDS: "51"},
                            kn, "MTP2", model, tp=8, shm="32Gi")
    a = line.argv
    assert a[a.index("--gpus") + 1] == "8" and a[a.index("--shm-size") + 1] == "32g"
    assert a[-4:] == ["--tensor-parallel-size", "8", "--shutdown-timeout", "30"]
    assert a[a.index("--health-start-period") + 1] == "171s" and a[a.index("--stop-timeout") + 1] == "45"
    assert "/v1/models" in a[a.index("--health-cmd") + 1]
    line = serve.serve_line("img" + DIGEST, {"io.builder.engine": "sglang", "io.builder.engine.version": "0.5.23",
                                             "io.builder.strategies": "MTP2"}, kn, "MTP2", model, tp=2, gpus="0,1")
    assert line.argv[line.argv.index("--gpus") + 1] == "device=0,1" and line.argv[-2:] == ["--tp-size", "2"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd)})


def test_serve_kubernetes_writes_the_manifests_and_refuses_at_once(tmp_path):
    image = tmp_path / "image.json"  # `docker image inspect` of a published image (its RepoDigests)
    _, labels = pick("vllm")
    import json
    image.write_text(json.dumps([{"RepoDigests": ["registry.example.com/ml/vllm" + DIGEST],
                                  "Config": {"Labels": labels}}]))
    res = _cli("serve", str(image), "--strategy", "MTP2", "--tp", "8", "--kubernetes", "--model", "pvc:models/Q",
               "--pod-monitor", "-o", str(tmp_path / "out.yaml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    docs = validate((tmp_path / "out.yaml").read_text())
    assert container(docs)["image"] == "registry.example.com/ml/vllm" + DIGEST and len(docs) == 3
    for args, message in ((["--tp", "0"], "--tp: '0' is not a tensor-parallel size at least 1 and at most 64"),
                          (["--tp", "2", "--gpus", "0"], "--gpus 0 names 1 GPU"),
                          (["--replicas", "2"], "a Kubernetes option"),
                          (["--kubernetes", "--gpu-family", "volta"], "--gpu-family volta"),
                          (["--kubernetes", "--shm-size", "lots"], "--shm-size lots")):
        target = str(image) if "--kubernetes" in args else "img:tag"  # refused before docker or a registry is asked
        res = _cli("serve", target, "--strategy", "MTP2", "--model", str(tmp_path), *args, cwd=tmp_path)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, \
            (args, res.stderr)


def test_serve_kubernetes_refuses_an_image_kubernetes_cannot_pull_and_a_claim_that_is_no_claim(tmp_path):
    """Issue 46 item 6: an image JSON's RepoDigests[0], or an IMAGE holding `@sha256:`, was taken as the container
    image unchecked (quoted, no key injected, but nothing Kubernetes can pull); --compile-cache-claim was not checked
    at all. Each is refused in one line now, and no manifest file is written."""
    import json

    _, labels = pick("vllm")
    good = "registry.example.com/ml/vllm" + DIGEST
    for i, digests in enumerate([["sha256:" + "a" * 64], ["not an image@sha256:" + "a" * 64],
                                 ["registry.example.com/ml/vllm@sha256:" + "A" * 64],
                                 ["registry.example.com/ml/vllm@sha256:" + "a" * 64 + "\nimage: evil"], [7]]):
        image = tmp_path / f"image{i}.json"
        image.write_text(json.dumps([{"RepoDigests": digests, "Config": {"Labels": labels}}]))
        res = _cli("serve", str(image), "--strategy", "MTP2", "--kubernetes", "--model", "pvc:models/Q", "-o",
                   str(tmp_path / "out.yaml"), cwd=tmp_path)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (digests, res.stderr)
        assert not (tmp_path / "out.yaml").exists()
    image = tmp_path / "image.json"
    image.write_text(json.dumps([{"RepoDigests": [good], "Config": {"Labels": labels}}]))
    for claim in ("Jit", "jit/../x", "a" * 254, "jit cache", "-jit"):
        res = _cli("serve", str(image), "--strategy", "MTP2", "--kubernetes", "--model", "pvc:models/Q",
                   "--compile-cache-claim", claim, "-o", str(tmp_path / "out.yaml"), cwd=tmp_path)
        assert res.returncode == 2 and "--compile-cache-claim" in res.stderr, (claim, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.yaml").exists()
    res = _cli("serve", str(image), "--strategy", "MTP2", "--kubernetes", "--model", "pvc:models/Q",
               "--compile-cache-claim", "jit-cache.v2", "-o", str(tmp_path / "out.yaml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr


# -- issue 45: manifests that fit the field ----------------------------------------------------------------------
def _with(labels: dict[str, str], **over) -> dict[str, str]:
    """LABELS with some replaced (a value None: left out)."""
    out = {**labels, **{k.replace("__", "."): v for k, v in over.items()}}
    return {k: v for k, v in out.items() if v is not None}


def _device_code(labels: dict[str, str], **codes: str) -> dict[str, str]:
    """LABELS whose packages' audited device code is only CODES (package → "sm_90a,compute_80")."""
    out = {k: v for k, v in labels.items() if not (labels_mod.package_key(k) or ("", ""))[1] in ("sass", "ptx", "binaries")}
    for name, text in codes.items():
        out[labels_mod.package(name, "sass")] = ",".join(c for c in text.split(",") if c.startswith("sm_"))
        out[labels_mod.package(name, "ptx")] = ",".join(c for c in text.split(",") if c.startswith("compute_"))
    return out


@pytest.mark.pure
def test_the_node_affinity_admits_the_compute_capabilities_the_image_runs_on():
    """GPU feature discovery writes nvidia.com/gpu.compute.major / .minor on every GPU node, while its gpu.family is
    "undefined" for 10.x and 12.x in some releases: the pod asks for the compute capabilities the image's device code
    runs on, by builder's rule (archs.runs_on: SASS within its major from its minor up, `a` on its own GPU, `f` within
    its family, PTX on every later GPU), --gpu-family narrowing them, --gpu-product adding the product."""
    kn = load_knowledge()
    image, labels = pick("vllm")

    def terms(lab, **opts):
        return node_terms(validate(kube.to_yaml(kube.manifests(image, lab, kn, "MTP2", "pvc:m", kube.KubeOptions(**opts)))))

    assert terms(labels) == {8: [0, 6, 7, 9], 9: [0]}  # sm_80, sm_90
    assert terms(_device_code(labels, vllm="sm_90a")) == {9: [0]}
    assert terms(_device_code(labels, vllm="sm_100f,sm_120a")) == {10: [0, 3], 12: [0]}  # f: 10.x; a: 12.0 alone
    assert terms(_device_code(labels, vllm="sm_100,sm_120")) == {10: [0, 3], 12: [0, 1]}
    assert terms(_device_code(labels, vllm="sm_90,compute_90")) == {9: [0], 10: [0, 3], 11: [0], 12: [0, 1]}  # PTX: JIT
    # every package must run: the intersection; a package the labels say nothing of is not judged (doctor --host)
    assert terms(_device_code(labels, vllm="sm_80,sm_90,sm_100", **{"flash-attn": "sm_90,sm_100"})) == {9: [0], 10: [0, 3]}
    # no package labels: io.builder.archs as SASS
    assert terms(_device_code(labels), ) == {8: [0, 6, 7, 9], 9: [0]}
    assert terms(_device_code(_with(labels, io__builder__archs="100,120"))) == {10: [0, 3], 12: [0, 1]}
    # --gpu-family: Blackwell is 10.x, 11.0 and 12.x, whatever GPU feature discovery's family label says
    assert terms(_device_code(labels, vllm="sm_90,sm_100f,sm_120"), gpu_family="blackwell") == {10: [0, 3], 12: [0, 1]}
    with pytest.raises(UserError, match=r"--gpu-family blackwell: the image's device code runs on ampere 8.0, 8.6, 8.7; "
                                        r"ada-lovelace 8.9; hopper 9.0 only"):
        kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(gpu_family="blackwell"))
    # --gpu-product: in every term, as GPU feature discovery writes it; on the plan for who judges a warm image's GPU
    docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(),
                                                gpu_product="NVIDIA-H200")))
    for t in pod(docs)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
        assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]} in t["matchExpressions"]
    from builder.deploy.serve import plan as plan_mod
    plan = plan_mod.derive(plan_mod.KUBERNETES, image, labels, kn, "MTP2", "pvc:m", gpu_product="NVIDIA-H200")
    assert plan.gpu_product == "NVIDIA-H200" and plan.gpu_ccs == (80, 86, 87, 89, 90)
    for bad, says in (("NVIDIA H200", "writes the name with dashes: NVIDIA-H200"), ("", "not a GPU product"),
                      ("-H200", "not a GPU product"), ("a" * 64, "not a GPU product"), ("H200\nx", "not a GPU product")):
        with pytest.raises(UserError, match=says):
            plan_mod.derive(plan_mod.KUBERNETES, image, labels, kn, "MTP2", "pvc:m", gpu_product=bad)
    # --no-gpu-affinity: none (a cluster without GPU feature discovery); an image whose labels name no device code
    # cannot be placed by it
    assert "affinity" not in pod(validate(kube.to_yaml(kube.manifests(
        image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(gpu_affinity=False)))))
    bare = _device_code(_with(labels, io__builder__archs=None))
    with pytest.raises(UserError, match="no GPU builder knows runs all of the image's device code .*no io.builder.archs label"):
        kube.manifests(image, bare, kn, "MTP2", "pvc:m", kube.KubeOptions())
    assert "affinity" not in pod(validate(kube.to_yaml(kube.manifests(
        image, bare, kn, "MTP2", "pvc:m", kube.KubeOptions(gpu_affinity=False)))))
    with pytest.raises(UserError, match="is not a device code"):
        kube.manifests(image, {**labels, labels_mod.package("vllm", "sass"): "sm80"}, kn, "MTP2", "pvc:m",
                       kube.KubeOptions())
    with pytest.raises(UserError, match="--gpu-family narrows the node affinity that --no-gpu-affinity leaves out"):
        kube.KubeOptions(gpu_family="hopper", gpu_affinity=False)
    with pytest.raises(UserError, match="--gpu-product is a term of the node affinity"):
        kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(gpu_affinity=False), gpu_product="NVIDIA-H200")
    # the docker line runs on this host's GPUs: no compute capabilities are asked there
    assert plan_mod.derive(plan_mod.DOCKER, image, labels, kn, "MTP2", REPO / "tests").gpu_ccs == ()


@pytest.mark.pure
def test_the_rollout_needs_no_spare_gpus_unless_asked():
    kn = load_knowledge()
    image, labels = pick("vllm")

    def strategy(**opts):
        return validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(**opts))))[0][
            "spec"]["strategy"]

    assert strategy() == {"type": "Recreate"}  # one replica: the old pod is gone before the new one is made
    assert strategy(replicas=3) == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert strategy(rollout="recreate", replicas=3) == {"type": "Recreate"}
    assert strategy(rollout="no-surge") == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert strategy(rollout="surge") == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    for bad in ("rolling", "Recreate", "", "surge0"):
        with pytest.raises(UserError, match=f"--rollout '{bad}': one of recreate, no-surge, surge"):
            kube.KubeOptions(rollout=bad)


@pytest.mark.pure
def test_the_pod_stops_after_the_engines_own_drain():
    """vLLM >= 0.18 drains for --shutdown-timeout seconds after SIGTERM (0: aborts its requests); SGLang drains with no
    bound of its own. The pod: a preStop sleep (endpoints stop routing first), then SIGTERM, and a grace period above
    the sleep and the drain; docker gets a --stop-timeout above the drain."""
    kn = load_knowledge()
    image, labels = pick("vllm")
    assert kn.recipe("vllm", "0.33.0").shutdown_flag == kn.recipe("vllm", "0.18.0").shutdown_flag == "--shutdown-timeout"
    assert kn.recipe("vllm", "0.17.1").shutdown_flag == "" and kn.recipe("sglang", "0.5.23").shutdown_flag == ""
    for drain in (0, 30, 300):
        docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(), drain_s=drain)))
        c, spec = container(docs), pod(docs)
        assert c["args"][-2:] == ["--shutdown-timeout", str(drain)]
        assert spec["terminationGracePeriodSeconds"] == 15 + drain + 15 and c["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}
        note = docs[0]["spec"]["template"]["metadata"]["annotations"][kube.ANNOTATION_GRACE]
        assert note == f"{30 + drain}s: preStop sleep 15s + drain {drain}s (--shutdown-timeout {drain}) + margin 15s"
    simage, slabels = pick("sglang")
    docs = validate(kube.to_yaml(kube.manifests(simage, slabels, kn, "MTP2", "pvc:m", kube.KubeOptions(), drain_s=120)))
    assert "--shutdown-timeout" not in container(docs)["args"] and pod(docs)["terminationGracePeriodSeconds"] == 150
    assert "has no flag bounding its drain" in docs[0]["spec"]["template"]["metadata"]["annotations"][kube.ANNOTATION_GRACE]
    with pytest.raises(UserError, match="--engine-args sets --shutdown-timeout: give --drain-timeout instead"):
        kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(), extra_args=("--shutdown-timeout=5",))
    with pytest.raises(UserError, match="--drain-timeout 3601: from 0 to 3600"):
        kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(), drain_s=3601)
    line = serve.serve_line("img" + DIGEST, labels, kn, "MTP2", REPO / "tests", drain_s=60)
    assert line.argv[line.argv.index("--stop-timeout") + 1] == "75" and line.argv[-2:] == ["--shutdown-timeout", "60"]


@pytest.mark.pure
def test_a_drafter_from_the_hub_gets_a_hub_cache_and_the_pod_a_runtime_class():
    """DFlash2's drafter is a hub id the engine downloads at every boot: its hub cache (HF_HUB_CACHE, which both engines
    read through huggingface_hub) is a volume, an emptyDir (a container restart finds it) or --hub-cache's claim (a new
    pod finds it too)."""
    kn = load_knowledge()
    for engine in ("vllm", "sglang"):
        image, labels = pick(engine)
        docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "DFlash2", "pvc:m", kube.KubeOptions())))
        c, spec = container(docs), pod(docs)
        assert {e["name"]: e["value"] for e in c["env"]}["HF_HUB_CACHE"] == "/opt/hub-cache"
        assert {"name": "hub-cache", "mountPath": "/opt/hub-cache"} in c["volumeMounts"]
        assert {"name": "hub-cache", "emptyDir": {}} in spec["volumes"]
        assert "z-lab/Qwen3.8-27B-DFlash2" in " ".join(c["args"])
        docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "DFlash2", "pvc:m", kube.KubeOptions(
            hub_cache="pvc:hf-cache/hub", runtime_class="nvidia"))))
        assert {"name": "hub-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod(docs)["volumes"]
        assert {"name": "hub-cache", "mountPath": "/opt/hub-cache", "subPath": "hub"} in container(docs)["volumeMounts"]
        assert pod(docs)["runtimeClassName"] == "nvidia"
    image, labels = pick("vllm")
    # nothing downloaded: no hub cache, and --hub-cache is refused rather than dropped
    for strategy, drafter in (("MTP2", None), ("DFlash2", "/models/drafter")):
        c = container(validate(kube.to_yaml(kube.manifests(image, labels, kn, strategy, "pvc:m", kube.KubeOptions(),
                                                            drafter=drafter))))
        assert "HF_HUB_CACHE" not in str(c.get("env")) and "hub-cache" not in str(c["volumeMounts"])
        with pytest.raises(UserError, match="--hub-cache: the engine downloads nothing from the hub here"):
            kube.manifests(image, labels, kn, strategy, "pvc:m", kube.KubeOptions(hub_cache="pvc:hf"), drafter=drafter)
    for bad, says in (("hf", "pvc:CLAIM"), ("pvc:", "not a claim name"), ("pvc:HF", "not a claim name"),
                      ("pvc:hf/../x", "not a relative path"), ("hostpath:/srv/hf", "pvc:CLAIM"), ("volume:hf", "pvc:CLAIM")):
        with pytest.raises(UserError, match=f"--hub-cache .*{says}"):
            kube.KubeOptions(hub_cache=bad)
    for bad in ("Nvidia", "nvidia_runtime", "", "a/b", "-x", "x" * 254):
        with pytest.raises(UserError, match="not a RuntimeClass name"):
            kube.KubeOptions(runtime_class=bad)


def test_serve_kubernetes_refuses_each_new_option_in_one_line_before_writing(tmp_path):
    import json

    image = tmp_path / "image.json"
    _, labels = pick("vllm")
    image.write_text(json.dumps([{"RepoDigests": ["registry.example.com/ml/vllm" + DIGEST], "Config": {"Labels": labels}}]))
    base = ["serve", str(image), "--strategy", "MTP2", "--kubernetes", "--model", "pvc:models/Q", "-o",
            str(tmp_path / "out.yaml")]
    for args, message in ((["--rollout", "rolling"], "--rollout 'rolling': one of recreate, no-surge, surge"),
                          (["--gpu-product", "NVIDIA H200"], "writes the name with dashes: NVIDIA-H200"),
                          (["--no-gpu-affinity", "--gpu-product", "NVIDIA-H200"], "--no-gpu-affinity leaves out"),
                          (["--no-gpu-affinity", "--gpu-family", "hopper"], "--no-gpu-affinity leaves out"),
                          (["--runtime-class", "Nvidia"], "not a RuntimeClass name"),
                          (["--hub-cache", "pvc:hf"], "the engine downloads nothing from the hub"),
                          (["--drain-timeout", "-5"], "--drain-timeout: '-5' is not a number of seconds"),
                          (["--engine-args", "--shutdown-timeout 5"], "give --drain-timeout instead")):
        res = _cli(*base, *args, cwd=tmp_path)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
        assert not (tmp_path / "out.yaml").exists()
    res = _cli("serve", "img:tag", "--strategy", "MTP2", "--model", str(tmp_path), "--rollout", "surge", cwd=tmp_path)
    assert res.returncode == 2 and "--rollout: a Kubernetes option" in res.stderr
    res = _cli(*base, "--gpu-product", "NVIDIA-H200", "--rollout", "surge", "--runtime-class", "nvidia",
               "--drain-timeout", "90", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    docs = validate((tmp_path / "out.yaml").read_text())
    assert pod(docs)["terminationGracePeriodSeconds"] == 120 and pod(docs)["runtimeClassName"] == "nvidia"
