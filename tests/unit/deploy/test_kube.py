"""Deployers on Kubernetes and on several GPUs: `builder serve IMAGE --kubernetes` writes a Deployment and a Service
(and a PodMonitor) with the strategy's real flags and environment, N GPUs for --tp N, probes sized from the image's
measured boot, /dev/shm, the model from a PVC or a node's directory and a compile cache for a cold image; every
manifest validates offline against the schema of Kubernetes 1.37 (kubernetes-validate's, strict: an unknown field
fails). --tp N reaches smoke's, bench's and serve's launch line with the engine's own flag and asks N GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from builder.deploy import runflags
from builder.deploy.serve import kube
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
    (image/labels.py written; audited values are build arguments there)."""
    m = load(REPO / "matrix.toml")
    out = []
    for plan in plan_cells(select(m, Selection(profiles=("all",))), None):
        written = {k: v for k, v, _ in labels_mod.written(plan.cell, plan.keys)}
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
            assert c["args"] == list(launchline.launch_line(recipe, s, values, tp=tp).args)  # the one derivation
            assert c["image"] == image
            assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == str(tp)
            if tp > 1:
                assert c["args"][-2:] == [recipe.tp_flag, str(tp)]
            assert {e["name"]: e["value"] for e in c.get("env", [])}.items() >= dict(s.env).items()
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
    # no boot label: the stated default, 900 s at 10 s a probe; the annotation says so
    assert c["startupProbe"] == {"httpGet": {"path": "/v1/models", "port": "http"}, "periodSeconds": 10,
                                 "timeoutSeconds": 5, "failureThreshold": 90}
    assert "initialDelaySeconds" not in str(dep)
    assert "900s" in dep["spec"]["template"]["metadata"]["annotations"]["io.builder/startup-budget"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["livenessProbe"]["httpGet"]["path"] == kn.recipe("sglang", labels[labels_mod.ENGINE_VERSION]).health
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
def test_replicas_anti_affinity_node_selector_and_pod_monitor():
    kn = load_knowledge()
    image, labels = pick("vllm")
    family = kube.FAMILIES[int(labels[labels_mod.ARCHS].split(",")[-1])]
    docs = validate(kube.to_yaml(kube.manifests(image, labels, kn, "MTP2", "pvc:m", kube.KubeOptions(
        replicas=3, anti_affinity=True, gpu_family=family, pod_monitor=True, namespace="llm"))))
    dep, svc, pm = docs
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3 and pod["nodeSelector"] == {"nvidia.com/gpu.family": family}
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert dep["spec"]["template"]["metadata"]["labels"]["io.builder/engine"] == "vllm"
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["metadata"]["namespace"] == "llm"
    assert pm["spec"] == {"selector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]},
                          "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]}
    with pytest.raises(UserError, match="--gpu-family volta: the image is compiled for"):
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
    assert a[-2:] == ["--tensor-parallel-size", "8"] and a[a.index("--health-start-period") + 1] == "171s"
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
