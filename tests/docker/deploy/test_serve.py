"""`builder serve IMAGE --strategy S --model PATH`: the exact `docker run` for a published image — GPUs, the model

The Docker half of tests/unit/deploy/test_serve.py: its docstring says the rest."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tests.support import serve as support

# fixtures shared with the other half, found by pytest under these names
model = support.model


@pytest.fixture(scope="module")
def fake_engine_image(docker_engine, local_bases, tmp_path_factory):
    """An image labelled as builder's vLLM 0.33.0 whose entrypoint prints what it was given: the args, the
    strategy's environment, and the mounted model."""
    ctx = tmp_path_factory.mktemp("fake-engine")
    (ctx / "Dockerfile").write_text(
        f"FROM {local_bases['debian']}\n"
        "RUN printf '%s\\n' '#!/bin/sh' 'echo \"ARGS: $*\"' 'echo \"ENV: VLLM_USE_V2_MODEL_RUNNER=${VLLM_USE_V2_MODEL_RUNNER:-unset}\"'"
        " 'cat \"$1/config.json\"' > /usr/local/bin/vllm && chmod 0755 /usr/local/bin/vllm\n"
        'LABEL io.builder.engine="vllm" io.builder.engine.version="0.33.0" io.builder.strategies="MTP2,MTP7,DFlash2"\n'
        'ENTRYPOINT ["vllm"]\n')
    tag = f"builder-test/fake-vllm:{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "buildx", "build", "--load", "-t", tag, str(ctx)], check=True, capture_output=True)
    yield tag
    subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)


def test_serve_prints_and_runs_the_command_for_a_local_image(fake_engine_image, model, tmp_path):
    res = subprocess.run([sys.executable, "-m", "builder.cli", "serve", fake_engine_image, "--strategy", "dflash2",
                          "--model", str(model), "--gpus", "none", "--port", "8123", "--run"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    printed = res.stdout.splitlines()[0]
    # the image read, pinned (issue 34): a local image by its repo digest (NAME@sha256:...), else its ID; never the tag
    inspect = json.loads(subprocess.run(["docker", "image", "inspect", fake_engine_image], capture_output=True, text=True,
                                        check=True).stdout)[0]
    image_id = (inspect.get("RepoDigests") or [inspect["Id"]])[0]
    assert printed.startswith(f"docker run --rm --shm-size 16g -p 127.0.0.1:8123:8123 -v {model}:/models/Qwen3.8-27B-FP8:ro "
                              f"-e VLLM_USE_V2_MODEL_RUNNER=1 --stop-timeout 45 --health-cmd ")
    # no boot label: DFlash2's measured cold boot in the engine data (1260 s, FlashInfer's top-k JIT) + margin
    assert f"--health-start-period 2520s {image_id} /models/Qwen3.8-27B-FP8 " in printed
    assert f"# {fake_engine_image} read as {image_id}" in res.stderr
    assert "# ready when http://127.0.0.1:8123/health answers 200" in res.stderr
    # what the container's entrypoint received: the model, where to listen, the strategy's flags and env
    assert "ARGS: /models/Qwen3.8-27B-FP8 --host 0.0.0.0 --port 8123 --speculative-config" in res.stdout
    assert " --shutdown-timeout 30" in res.stdout  # vLLM >= 0.18 drains for that long; docker stop waits 45 s
    assert '"method":"dflash"' in res.stdout and "ENV: VLLM_USE_V2_MODEL_RUNNER=1" in res.stdout
    assert '{"model_type": "qwen3_5"}' in res.stdout  # the model directory is mounted
