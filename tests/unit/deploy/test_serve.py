"""`builder serve IMAGE --strategy S --model PATH`: the exact `docker run` for a published image — GPUs, the model
mounted read-only, the port, the strategy's real flags and environment from builder/data/engines.toml — and
with --run, that very command, run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder import render
from builder.deploy.serve import docker as serve
from builder.image import launchline
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.matrix import Selection, load
from builder.plan import plan_cells
from builder.resolve import select

from tests.helpers import REPO
from tests.support import serve as support

# fixtures shared with the other half, found by pytest under these names
model = support.model


def labels(engine: str, version: str, strategies: str = "MTP2,MTP7,DFlash2") -> dict[str, str]:
    return {"io.builder.engine": engine, "io.builder.engine.version": version, "io.builder.strategies": strategies,
            "io.builder.archs": "80,90"}


@pytest.mark.pure
def test_vllm_mtp2_is_the_exact_docker_run_with_the_datas_flags(model):
    kn = load_knowledge()
    line = serve.serve_line("reg.example/ml/vllm@sha256:" + "a" * 64, labels("vllm", "0.33.0"), kn, "MTP2", model)
    flags = list(kn.recipe("vllm", "0.33.0").strategy("MTP2").flags)
    assert flags == ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']
    health = ["--health-cmd", "python3 -c \"import urllib.request; urllib.request.urlopen("
              "'http://127.0.0.1:8000/v1/models', timeout=5)\"", "--health-interval", "10s", "--health-timeout", "5s",
              "--health-retries", "3", "--health-start-period", "1602s"]  # no boot label: MTP2's measured cold boot (801 s) + margin
    # vLLM >= 0.18 drains in-flight requests for --shutdown-timeout seconds after SIGTERM; docker stop waits longer
    assert line.argv == ["docker", "run", "--rm", "--gpus", "all", "--shm-size", "16g", "-p", "127.0.0.1:8000:8000",
                         "-v", f"{model}:/models/Qwen3.8-27B-FP8:ro", "--stop-timeout", "45", *health,
                         "reg.example/ml/vllm@sha256:" + "a" * 64, "/models/Qwen3.8-27B-FP8", "--host", "0.0.0.0",
                         "--port", "8000", *flags, "--shutdown-timeout", "30"]
    assert line.health == "http://127.0.0.1:8000/health"
    assert "--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":2}'" in line.command


@pytest.mark.pure
def test_strategy_environment_drafter_gpus_and_port_reach_the_command(model, tmp_path):
    kn = load_knowledge()
    line = serve.serve_line("img:tag", labels("vllm", "0.33.0"), kn, "DFlash2", model, port=9000, gpus="0,1",
                            bind="0.0.0.0")
    assert ["-e", "VLLM_USE_V2_MODEL_RUNNER=1"] == line.argv[line.argv.index("-e"):line.argv.index("-e") + 2]
    assert ["--gpus", "device=0,1"] == line.argv[3:5] and "0.0.0.0:9000:9000" in line.argv
    config = json.loads(line.argv[line.argv.index("--speculative-config") + 1])
    assert config == {"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2", "num_speculative_tokens": 7}
    assert any("z-lab/Qwen3.8-27B-DFlash2" in n for n in line.notes)
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    line = serve.serve_line("img:tag", labels("vllm", "0.33.0"), kn, "DFlash2", model, drafter=str(drafter), gpus="none")
    assert "--gpus" not in line.argv and f"{drafter}:/models/drafter:ro" in line.argv
    assert json.loads(line.argv[line.argv.index("--speculative-config") + 1])["model"] == "/models/drafter"
    # SGLang: its launch line names the model flag; its MTP draft model is the model itself
    line = serve.serve_line("img:tag", labels("sglang", "0.5.23"), kn, "MTP2", model)
    args = line.argv[line.argv.index("img:tag") + 1:]
    assert args[:2] == ["--model-path", "/models/Qwen3.8-27B-FP8"]
    assert args[args.index("--speculative-draft-model-path") + 1] == "/models/Qwen3.8-27B-FP8"
    assert "--enable-metrics" in args and line.health.endswith("/health_generate")
    # healthy once its warm-up has run (/health; its /v1/models answers before), the check's timeout above the
    # engine's own 20 s wait there; no drain flag: docker stop waits the drain and a margin all the same
    check = line.argv[line.argv.index("--health-cmd") + 1]
    assert "http://127.0.0.1:8000/health'" in check and "timeout=25" in check
    assert line.argv[line.argv.index("--health-timeout") + 1] == "25s" and "--shutdown-timeout" not in args
    assert line.argv[line.argv.index("--stop-timeout") + 1] == "45"


@pytest.mark.pure
def test_a_strategy_the_image_was_not_built_for_is_refused(model):
    kn = load_knowledge()
    with pytest.raises(UserError, match="built and smoke-tested for MTP2"):
        serve.serve_line("img:tag", labels("vllm", "0.33.0", "MTP2"), kn, "MTP7", model)
    with pytest.raises(UserError, match="cannot run on vllm 0.6.3.post1"):
        serve.serve_line("img:tag", labels("vllm", "0.6.3.post1", ""), kn, "MTP2", model)
    with pytest.raises(UserError, match="not an image builder made"):
        serve.serve_line("img:tag", {}, kn, "MTP2", model)
    with pytest.raises(UserError, match="is not a directory"):
        serve.serve_line("img:tag", labels("vllm", "0.33.0"), kn, "MTP2", model / "missing")


@pytest.mark.pure
def test_the_arguments_continue_the_images_entrypoint_for_every_shipped_cell():
    """The image's ENTRYPOINT (render) + serve's arguments = the engine's launch line, for every cell."""
    m = load(REPO / "matrix.toml")
    for plan in plan_cells(select(m, Selection(profiles=("all",))), None):
        launch = list(plan.cell.engine_recipe.launch)
        entry, rest = launchline.split(launch)
        assert entry == render.entrypoint(plan.cell) and entry + rest == launch


def test_serve_refuses_bad_input_before_docker(tmp_path, model):
    for args, message in ((["img:tag", "--strategy", "MTP9", "--model", str(model)], "is not a strategy"),
                          (["img:tag", "--strategy", "MTP2", "--model", str(model), "--port", "0"], "--port"),
                          (["img:tag", "--strategy", "MTP2", "--model", str(model), "--gpus", "two"], "--gpus"),
                          (["Bad Image", "--strategy", "MTP2", "--model", str(model)], "IMAGE")):
        res = subprocess.run([sys.executable, "-m", "builder.cli", "serve", *args], capture_output=True, text=True,
                             cwd=tmp_path)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)


@pytest.mark.pure
def test_a_hostile_drafter_changes_no_key_of_the_speculative_config_in_docker_or_kubernetes(model):
    """Issue 46 item 4: `--drafter 'org/a","num_speculative_tokens":99,"method":"ngram'` turned vLLM's DFlash2 into
    ngram with 99 tokens, in the docker line and the Kubernetes manifest alike. Now it is the model's name, whole."""
    from builder.deploy.serve import kube

    kn, hostile = load_knowledge(), 'org/a","num_speculative_tokens":99,"method":"ngram'
    want = {"method": "dflash", "model": hostile, "num_speculative_tokens": 7}
    line = serve.serve_line("img:tag", labels("vllm", "0.33.0"), kn, "DFlash2", model, drafter=hostile, gpus="none")
    assert json.loads(line.argv[line.argv.index("--speculative-config") + 1]) == want
    import yaml

    docs = yaml.safe_load_all(kube.to_yaml(kube.manifests("reg.example/ml/vllm@sha256:" + "a" * 64,
                                                           labels("vllm", "0.33.0"), kn, "DFlash2",
                                                           "pvc:models/Qwen3.8-27B-FP8", kube.KubeOptions(),
                                                           drafter=hostile)))
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--speculative-config") + 1]) == want
