"""`builder serve`'s plan (builder/deploy/serve/plan.py) is derived once and rendered twice: the `docker run` line
(deploy/serve/docker.py) and the Kubernetes manifests (deploy/serve/kube.py) carry the same arguments, environment,
boot budget, probes and model mount because they read them from one frozen value, and the verb derives that value
once whichever it renders."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from builder.deploy import strategies
from builder.deploy.serve import docker as serve_docker
from builder.deploy.serve import fit, kube
from builder.deploy.serve import plan as plan_mod
from builder.deploy.subject import FILE, Subject
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.image import labels as labels_mod
from builder.image import launchline

from tests.helpers import run_cli

pytestmark = pytest.mark.pure

IMAGE = "registry.example.com/ml/vllm@sha256:" + "a" * 64
LABELS = {labels_mod.ENGINE: "vllm", labels_mod.ENGINE_VERSION: "0.33.0", labels_mod.STRATEGIES: "MTP2,DFlash2",
          labels_mod.BOOT_SECONDS: "51", labels_mod.ARCHS: "80,90"}


@pytest.fixture()
def model(tmp_path):
    d = tmp_path / "Qwen3.8-27B-FP8"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def _plan(model, **kw) -> plan_mod.ServePlan:
    args = {"port": 9000, "gpus": "0,1", "tp": 2, "shm": "32Gi", "extra_args": ("--max-model-len", "4096"), **kw}
    return plan_mod.derive(plan_mod.DOCKER, IMAGE, LABELS, load_knowledge(), "DFlash2", model, **args)


def _deployment(text: str) -> tuple[dict, dict]:
    """(the Deployment, its engine container) of the manifests TEXT."""
    deployment = next(yaml.safe_load_all(text))
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def _manifests(plan) -> tuple[dict, dict]:
    """PLAN's manifests: a docker plan's GPUs are this host's, so it names no compute capability for a node affinity."""
    return _deployment(kube.to_yaml(kube.resources(plan, kube.KubeOptions(gpu_affinity=plan.target.this_host is False))))


def test_the_docker_line_and_the_manifests_render_one_plan(model):
    plan = _plan(model)
    argv = serve_docker.line(plan).argv
    deployment, c = _manifests(plan)

    def opt(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    # the same launch line, image and environment
    assert argv[argv.index(IMAGE) + 1:] == list(plan.args) == c["args"] and c["image"] == IMAGE
    assert plan.args[-6:] == ("--tensor-parallel-size", "2", "--shutdown-timeout", "30", "--max-model-len", "4096")
    assert plan.env and [argv[i + 1] for i, a in enumerate(argv) if a == "-e"] == [f"{k}={v}" for k, v in plan.env]
    # (the manifests add the hub cache the DFlash2 drafter downloads to: a volume only Kubernetes gets)
    assert plan.hub_download == "z-lab/Qwen3.8-27B-DFlash2"
    assert [(e["name"], e["value"]) for e in c["env"]] == [*plan.env, (kube.HUB_CACHE_ENV, kube.HUB_CACHE_PATH)]
    # the same budget and probes: 51 s measured + 120 s margin
    assert plan.budget.seconds == 171 and opt("--health-start-period") == "171s"
    assert c["startupProbe"]["failureThreshold"] == plan.budget.failures == 18
    assert deployment["spec"]["template"]["metadata"]["annotations"][kube.ANNOTATION_BUDGET] == plan.budget.why
    ready = c["readinessProbe"]
    assert (ready["httpGet"]["path"], ready["periodSeconds"], ready["timeoutSeconds"], ready["failureThreshold"]) == (
        plan.readiness.path, plan.readiness.period_s, plan.readiness.timeout_s, plan.readiness.failures)
    assert f"http://127.0.0.1:9000{plan.readiness.path}" in opt("--health-cmd")
    assert (opt("--health-interval"), opt("--health-timeout"), opt("--health-retries")) == (
        f"{ready['periodSeconds']}s", f"{ready['timeoutSeconds']}s", str(ready["failureThreshold"]))
    # the same model, seen at the same place
    assert opt("-v") == f"{model}:{plan.model.inside}:ro" and plan.model.inside == "/models/Qwen3.8-27B-FP8"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "model")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    assert mount["mountPath"] == plan.model.inside and volume["hostPath"]["path"] == str(model)
    # the same port, GPUs and /dev/shm, each in its runtime's words
    assert opt("-p") == "127.0.0.1:9000:9000" and c["ports"][0]["containerPort"] == 9000
    assert opt("--gpus") == "device=0,1" and c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert opt("--shm-size") == "32g"
    assert next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "32Gi"
    # the same drain: the engine's flag in both, docker stop and the pod's grace above it
    assert opt("--stop-timeout") == str(plan.shutdown.stop_s) and plan.shutdown.stop_s > plan.shutdown.drain_s == 30
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == plan.shutdown.grace_s


def test_the_renderers_work_nothing_out_again(model, monkeypatch):
    """Once the plan is made, rendering it asks neither the labels, the engine data nor the launch line."""
    plan = _plan(model)

    def refuse(*a, **k):
        raise AssertionError("derived again while rendering")

    for target, attr in ((plan_mod, "derive"), (plan_mod.BootBudget, "of"), (plan_mod.ModelSource, "parse"),
                         (launchline, "launch_line"), (strategies, "check_strategy"), (plan_mod, "check_strategy"),
                         (labels_mod, "engine"), (labels_mod, "boot_seconds"), (fit, "runs_on"),
                         (fit.Shutdown, "of"), (fit, "check_product")):
        monkeypatch.setattr(target, attr, refuse)
    assert serve_docker.line(plan).argv[-len(plan.args):] == list(plan.args)
    assert _manifests(plan)[1]["args"] == list(plan.args)


def test_the_plan_is_frozen_and_holds_the_probe_constants(model):
    plan = _plan(model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.port = 1  # type: ignore[misc]
    assert plan.startup == plan_mod.Probe(plan_mod.READY_PATH, plan_mod.PROBE_PERIOD_S, plan_mod.PROBE_TIMEOUT_S,
                                          plan.budget.failures)
    assert plan.liveness == plan_mod.Probe("/health", plan_mod.LIVENESS_PERIOD_S, plan_mod.LIVENESS_TIMEOUT_S, 3)
    assert plan.health_path == "/health" and plan.compile_cache is None  # docker: no compile-cache volume


def test_the_probes_come_from_the_engine_data(model):
    """Where the engine data names a ready path and a wait of the engine's own (SGLang: /health, 20 s), startup and
    readiness ask that path and every timeout is above the wait; plan.py names no engine."""
    kn = load_knowledge()
    recipe = kn.recipe("vllm", "0.33.0")

    class Data:
        def __init__(self, r):
            self.r = r

        def recipe(self, *a):
            return self.r

    changed = dataclasses.replace(recipe, ready_path="/ready", health_wait_s=40)
    plan = plan_mod.derive(plan_mod.DOCKER, IMAGE, LABELS, Data(changed), "MTP2", model)
    assert (plan.startup.path, plan.readiness.path, plan.liveness.path) == ("/ready", "/ready", "/health")
    assert plan.startup.timeout_s == plan.readiness.timeout_s == plan.liveness.timeout_s == 45
    sglang = kn.recipe("sglang", "0.5.23")
    plan = plan_mod.derive(plan_mod.DOCKER, IMAGE, {**LABELS, labels_mod.ENGINE: "sglang",
                                                    labels_mod.ENGINE_VERSION: "0.5.23"}, kn, "MTP2", model)
    assert plan.readiness == plan_mod.Probe(sglang.ready_path, plan_mod.PROBE_PERIOD_S, 25, plan_mod.PROBE_FAILURES)
    assert plan.liveness.path == sglang.health and plan.liveness.timeout_s > sglang.health_wait_s


def test_the_target_decides_the_model_the_drafter_and_the_image(model, tmp_path):
    kn = load_knowledge()

    def derive(target, image, m, **kw):
        return plan_mod.derive(target, image, LABELS, kn, "DFlash2", m, **kw)

    with pytest.raises(UserError, match="a PersistentVolumeClaim is a Kubernetes volume"):
        derive(plan_mod.DOCKER, IMAGE, "pvc:models/Q")
    with pytest.raises(UserError, match="volume:NAME is a docker named volume"):
        derive(plan_mod.KUBERNETES, IMAGE, "volume:models")
    with pytest.raises(UserError, match="Kubernetes runs an image by digest"):
        derive(plan_mod.KUBERNETES, "reg.example/ml/vllm:0.33.0", "pvc:m")
    assert derive(plan_mod.KUBERNETES, IMAGE, f"{model}/").model == plan_mod.ModelSource("hostpath", str(model))
    assert derive(plan_mod.DOCKER, "img:tag", "volume:models").model == plan_mod.ModelSource("volume", "models")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    on_host = derive(plan_mod.DOCKER, "img:tag", model, drafter=str(drafter))
    assert on_host.drafter == "/models/drafter" and [m.inside for m in on_host.mounts] == [
        "/models/Qwen3.8-27B-FP8", "/models/drafter"]
    on_kube = derive(plan_mod.KUBERNETES, IMAGE, "pvc:m", drafter=str(drafter))
    assert on_kube.drafter == str(drafter) and on_kube.mounts == (on_kube.model,)
    assert on_kube.compile_cache is not None and on_kube.compile_cache.root == kn.jit_cache_root()
    assert derive(plan_mod.DOCKER, "img:tag", model).drafter_from_data


@pytest.mark.parametrize("kubernetes", [False, True], ids=["docker", "kubernetes"])
def test_the_verb_derives_the_plan_once_and_renders_it_once(kubernetes, model, tmp_path, monkeypatch):
    from builder.deploy import subject

    monkeypatch.setattr(subject, "read", lambda ref, *a, **k: Subject(ref, FILE, {"Labels": LABELS}, IMAGE))
    derived, rendered = [], []
    real_derive, real_line, real_resources = plan_mod.derive, serve_docker.line, kube.resources

    def derive(*a, **k):
        derived.append(real_derive(*a, **k))
        return derived[-1]

    def render(real):
        def call(plan, *a, **k):
            rendered.append((real.__name__, plan))
            return real(plan, *a, **k)
        return call

    monkeypatch.setattr(plan_mod, "derive", derive)
    monkeypatch.setattr(serve_docker, "line", render(real_line))
    monkeypatch.setattr(kube, "resources", render(real_resources))
    args = ["serve", "registry.example.com/ml/vllm:0.33.0", "--strategy", "MTP2", "--model",
            "pvc:models/Q" if kubernetes else str(model), "--tp", "2", *([] if kubernetes else ["--gpus", "0,1"])]
    if kubernetes:
        args += ["--kubernetes", "-o", str(tmp_path / "out.yaml")]
    result = run_cli(*args, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert len(derived) == 1 and derived[0].target is (plan_mod.KUBERNETES if kubernetes else plan_mod.DOCKER)
    assert rendered == [("resources" if kubernetes else "line", derived[0])]
    assert derived[0].image == IMAGE  # the digest read, never the tag
    if kubernetes:
        assert _deployment((tmp_path / "out.yaml").read_text())[1]["args"] == list(derived[0].args)
    else:
        assert result.stdout.strip() == real_line(derived[0]).command


def test_the_judgement_of_a_strategy_is_the_deployers():
    """check_strategy (what serve, bench and warm may start) is deploy/strategies.py's; the image's labels keep
    only the data it reads."""
    assert not hasattr(labels_mod, "check_strategy") and plan_mod.check_strategy is strategies.check_strategy
    with pytest.raises(UserError, match=r"--strategy MTP7: img was built and smoke-tested for MTP2 \(label "):
        strategies.check_strategy(load_knowledge().recipe("vllm", "0.33.0"), "MTP7", ("MTP2",), "img")


def test_an_image_recording_no_boot_gets_its_strategys_measured_cold_boot_else_the_default():
    """Issue 45 item 3: a cold image without io.builder.boot-seconds is budgeted from the engine data's measured cold
    boot of its strategy (a cold DFlash2 boot JIT-compiles FlashInfer's top-k for 12-21 min), never less than the
    default, and the why says so; an image that records its boot keeps it."""
    kn = load_knowledge()
    unlabelled = {k: v for k, v in LABELS.items() if k != labels_mod.BOOT_SECONDS}
    dflash2 = kn.recipe("vllm", "0.33.0").strategy("DFlash2")
    b = plan_mod.BootBudget.of(unlabelled, None, dflash2)
    assert dflash2.cold_boot_s == 1260 and b.seconds == 1260 + 1260 and b.failures == 252
    assert "DFlash2's cold boot in the engine data, 1260s measured" in b.why
    mtp7 = kn.recipe("vllm", "0.33.0").strategy("MTP7")  # none stated: the default
    assert plan_mod.BootBudget.of(unlabelled, None, mtp7).seconds == plan_mod.DEFAULT_BOOT_BUDGET_S
    assert plan_mod.BootBudget.of(LABELS, None, dflash2).seconds == 171  # the image's own measured boot wins
