"""On a real GPU: `builder smoke` boots the tiny FP8 model (Qwen3.5 architecture, one MTP layer, dummy weights)
under MTP2 and MTP7 and sees speculative decoding run — L0 to L3 through the process launcher, the way the H200
test host runs it (no Docker there: vLLM 0.26.0 and SGLang 0.5.17, the releases that pin the host's torch 2.11.0,
are installed from wheels for the host's python3; see docs/gpu-hosts.md).

BUILDER_SMOKE_PYTHON: the interpreter whose environment has vLLM (default python3).
BUILDER_SMOKE_ENGINE_ARGS / BUILDER_SMOKE_ENV (NAME=VALUE,...): extra engine flags and environment; the defaults
are what the minimal wheel set (no FlashInfer, no DeepGEMM) needs.
BUILDER_SMOKE_SGLANG_PYTHON: the interpreter whose environment has SGLang 0.5.17 (default python3).
BUILDER_SMOKE_SGLANG_ENGINE_ARGS / BUILDER_SMOKE_SGLANG_ENV: the same for SGLang; the defaults are what its
minimal wheel set (sglang-kernel without FlashAttention 3, no DeepGEMM) needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from builder.deploy.runtime import gpus

from tests.helpers import REPO

_HOST = gpus.read()
HAVE_GPU, NO_GPU, _ARCH = _HOST.present, _HOST.why_none, _HOST.arch
CELL = "vllm-0.26.0-cu130-torch2.11.0-py312-sm90"
SGLANG_CELL = "sglang-0.5.17-cu130-torch2.11.0-py312-sm90"
SGLANG_ENGINE_ARGS = ("--attention-backend triton --sampling-backend pytorch --fp8-gemm-backend triton "
                      "--mm-attention-backend triton_attn --mm-feature-transport cpu")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU and NO_GPU.startswith("this host has no NVIDIA GPU"), reason=f"skipped because {NO_GPU}"),
]


def engine_python(variable: str, dist: str, version: str) -> str:
    """The interpreter $variable names (default python3); the test fails, never skips, when it lacks the engine."""
    if not HAVE_GPU:  # nvidia-smi is there but fails: a broken driver is no reason to skip
        pytest.fail(f"nvidia-smi is on PATH but does not work: {NO_GPU}")
    python = os.environ.get(variable, "python3")
    found = subprocess.run([python, "-c", f"from importlib.metadata import version; print(version({dist!r}))"],
                           capture_output=True, text=True)
    if found.returncode != 0 or found.stdout.strip() != version:
        pytest.fail(f"{python} has no {dist} {version} ({(found.stdout + found.stderr).strip()[-300:]}): install it "
                    f"as docs/gpu-hosts.md says, or point {variable} at an environment that has it")
    return python


def smoke_l0_to_l3(cell: str, python: str, engine_args: str, env_pairs: str, tmp_path) -> list[dict]:
    """`builder smoke` of the tiny model under MTP2 and MTP7 through the process launcher: every result, each
    asserted to pass."""
    env_args = [arg for pair in filter(None, env_pairs.split(",")) for arg in ("--env", pair)]
    res = subprocess.run(
        [sys.executable, "-m", "builder.cli", "smoke", cell, "--matrix", str(REPO / "tests/fixtures/gpu-host/matrix.toml"),
         "--launcher", "process", "--python", python, "--model", "tiny", "--strategy", "MTP2,MTP7",
         "--engine-args", engine_args, *env_args, "--boot-timeout", "600", "--report-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=1800)
    print(res.stderr[-5000:])
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-5000:]
    results = json.loads(res.stdout)["results"]
    assert all(r["status"] == "pass" for r in results), results
    return results


def figures(results: list[dict], layer: str, strategy: str) -> dict:
    return next(r for r in results if r["layer"] == layer and r["strategy"] == strategy)["figures"]


def test_l0_to_l3_boot_the_tiny_fp8_model_under_mtp2_and_mtp7(tmp_path):
    python = engine_python("BUILDER_SMOKE_PYTHON", "vllm", "0.26.0")
    results = smoke_l0_to_l3(CELL, python,
                             os.environ.get("BUILDER_SMOKE_ENGINE_ARGS", "--enforce-eager --gdn-prefill-backend triton"),
                             os.environ.get("BUILDER_SMOKE_ENV", "VLLM_USE_DEEP_GEMM=0,VLLM_USE_FLASHINFER_SAMPLER=0"),
                             tmp_path)
    for name, k in (("MTP2", 2), ("MTP7", 7)):
        f = figures(results, "L3", name)
        print(name, json.dumps(f))
        assert f["drafts"] > 0 and f["draft_tokens"] == k * f["drafts"], f  # speculative decoding ran, K per draft
        assert f["output_tokens"] == 64 and f["output_text"].strip() and f["ttft_s"] is not None


def test_sglang_l0_to_l3_boot_the_tiny_fp8_model_under_mtp2_and_mtp7(tmp_path):
    python = engine_python("BUILDER_SMOKE_SGLANG_PYTHON", "sglang", "0.5.17")
    results = smoke_l0_to_l3(SGLANG_CELL, python,
                             os.environ.get("BUILDER_SMOKE_SGLANG_ENGINE_ARGS", SGLANG_ENGINE_ARGS),
                             os.environ.get("BUILDER_SMOKE_SGLANG_ENV", "SGLANG_ENABLE_JIT_DEEPGEMM=0"), tmp_path)
    for name, steps in (("MTP2", 2), ("MTP7", 7)):
        l2 = figures(results, "L2", name)["resolved"]
        assert (l2["speculative_algorithm"], l2["speculative_num_steps"], l2["speculative_eagle_topk"],
                l2["speculative_num_draft_tokens"]) == ("EAGLE", steps, 1, steps + 1), l2
        f = figures(results, "L3", name)
        print(name, json.dumps(f))
        # speculative decoding ran: verify calls rose (SGLang counts no draft tokens; L3 also checked that its
        # server info echoes EAGLE with these steps / topk / draft tokens) and the accept length moved
        assert f["drafts"] > 0 and f["accept_length"] >= 1.0, f
        assert f["output_tokens"] == 64 and f["output_text"].strip() and f["ttft_s"] is not None
