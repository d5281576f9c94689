"""Slow: L2 against the real engines. `vllm==0.33.0` and `sglang==0.5.23` are installed from the index into
their own virtual environments (9-11 GB each: the CUDA build of torch and its libraries; kept in
$BUILDER_ENGINE_VENVS, default ~/.cache/builder/engine-venvs, and reused), and smoke's L2 runs their own
argument parsers on this CPU host through the process launcher: every strategy of the shipped cells resolves to
its intended config, and the flags popular recipes use — `--enable-mtp7`, `--enable-dflash2`,
`--mtp2-chunk-size` — and an SGLang `DFLASH2` must fail.

BUILDER_SMOKE_VLLM_PYTHON / BUILDER_SMOKE_SGLANG_PYTHON: use an environment that already has the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder import matrix as matrix_mod
from builder import resolve
from builder.engines import Strategy
from builder.deploy.smoke import Model, SmokeOptions, layers, tinymodel
from builder.deploy.runtime.engine import ProcessLauncher

from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.network]

VENVS = Path(os.environ.get("BUILDER_ENGINE_VENVS", Path.home() / ".cache" / "builder" / "engine-venvs"))


def engine_python(name: str, version: str) -> str:
    """A virtual environment with exactly `name==version` from the index (created once, then reused), or the
    interpreter BUILDER_SMOKE_<NAME>_PYTHON names (an environment that already has it)."""
    given = os.environ.get(f"BUILDER_SMOKE_{name.upper()}_PYTHON")
    if given:
        found = subprocess.run([given, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert found.stdout.strip() == version, f"{given} has {name} {found.stdout.strip() or found.stderr[-300:]}, not {version}"
        return given
    root = VENVS / f"{name}-{version}"
    python = root / "bin" / "python"
    marker = root / ".builder-installed"
    if not marker.is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
        res = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"{name}=={version}"],
                             capture_output=True, text=True, timeout=5400)
        assert res.returncode == 0, f"pip install {name}=={version} failed:\n{res.stderr[-4000:]}"
        marker.write_text(f"{name}=={version}\n")
    return str(python)


def cell_of(engine: str):
    m = matrix_mod.load(REPO / "matrix.toml")
    return next(c for c in resolve.select(m, matrix_mod.Selection(engines=(engine,))) if c.profile.name == "cu130")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tinymodel.ensure(tmp_path_factory.mktemp("models"))


def run_l2(engine: str, version: str, tiny, tmp_path, strategies: list[Strategy]) -> dict:
    cell = cell_of(engine)
    assert cell.version == version
    launcher = ProcessLauncher(python=engine_python(engine, version), gpus=False,
                               extra_env={"PYTHONDONTWRITEBYTECODE": "1"})
    opts = SmokeOptions(strategies=(), model=Model(tiny.target, tiny.drafter, tiny=True), log_dir=tmp_path)
    return {r.strategy: r for r in layers.l2(cell, launcher, opts, strategies)}


def test_vllm_0330_parser_resolves_every_strategy_and_refuses_the_recipe_flags(tiny, tmp_path):
    eng = cell_of("vllm").engine_recipe
    bogus = [Strategy("--enable-mtp7", None, "-", ("--enable-mtp7",)),
             Strategy("--enable-dflash2", None, "-", ("--enable-dflash2",)),
             Strategy("--mtp2-chunk-size", None, "-", ("--mtp2-chunk-size", "2"))]
    # the engine data's drain flag, which serve adds to the launch line (builder/deploy/serve/fit.py Shutdown)
    assert eng.shutdown_flag == "--shutdown-timeout"
    drain = Strategy("drain", None, "-", (eng.shutdown_flag, "30"), expect=(("shutdown_timeout", 30),))
    # the sleep flag snapshot take adds (engine data smoke.sleep)
    sleep = Strategy("sleep", None, "-", (eng.smoke["sleep"]["flag"],), expect=(("enable_sleep_mode", True),))
    res = run_l2("vllm", "0.33.0", tiny, tmp_path,
                 [eng.strategy(n) for n in ("MTP2", "MTP7", "DFlash2")] + bogus + [drain, sleep])
    for name in ("MTP2", "MTP7", "DFlash2", "drain", "sleep"):
        assert res[name].status == "pass", res[name].reason
    assert res["drain"].figures["resolved"] == {"shutdown_timeout": 30}
    assert res["MTP7"].figures["resolved"] == {"speculative_config.method": "mtp", "speculative_config.num_speculative_tokens": 7}
    assert res["DFlash2"].figures["resolved"]["speculative_config.model"] == str(tiny.drafter.resolve())
    for b in bogus:
        r = res[b.name]
        assert r.status == "fail" and "unrecognized arguments" in r.reason and b.flags[0] in r.reason, r.reason


def test_sglang_0523_parser_and_name_resolution_and_dflash2_is_no_algorithm(tiny, tmp_path):
    eng = cell_of("sglang").engine_recipe
    dflash2 = Strategy("DFLASH2", None, "-", ("--speculative-algorithm", "DFLASH2", "--speculative-draft-model-path",
                                               "{drafter}", "--speculative-num-draft-tokens", "8"),
                       expect=(("speculative_algorithm@resolved", "DFLASH"),))
    mtp = Strategy("MTP", None, "-", ("--speculative-algorithm", "MTP", "--speculative-draft-model-path", "{model}"),
                   expect=(("speculative_algorithm@resolved", "EAGLE"),))
    flag = Strategy("--enable-dflash2", None, "-", ("--enable-dflash2",))
    # the sleep flag snapshot take adds: SGLang's memory saver (engine data smoke.sleep)
    sleep = Strategy("sleep", None, "-", (eng.smoke["sleep"]["flag"],), expect=(("enable_memory_saver", True),))
    res = run_l2("sglang", "0.5.23", tiny, tmp_path,
                 [eng.strategy(n) for n in ("MTP2", "MTP7", "DFlash2")] + [dflash2, mtp, flag, sleep])
    for name in ("MTP2", "MTP7", "DFlash2", "sleep"):
        assert res[name].status == "pass", res[name].reason
    got = res["MTP7"].figures["resolved"]
    assert (got["speculative_algorithm@resolved"], got["speculative_num_steps"], got["speculative_eagle_topk"],
            got["speculative_num_draft_tokens"]) == ("EAGLE", 7, 1, 8)
    assert res["DFlash2"].figures["resolved"]["speculative_num_draft_tokens"] == 8
    # its parser lets DFLASH2 through; SGLang's own name resolution does not
    assert res["DFLASH2"].status == "fail" and "Unknown speculative algorithm name: DFLASH2" in res["DFLASH2"].reason
    assert res["DFLASH2"].reason.startswith("the engine's own name resolution refuses")  # parsing alone let it through
    assert res["MTP"].status == "fail" and "MTP" in res["MTP"].reason
    assert res["--enable-dflash2"].status == "fail" and "unrecognized arguments: --enable-dflash2" in res["--enable-dflash2"].reason


def test_vllm_and_its_transformers_read_the_27b_shape_as_written(tmp_path):
    """--model shape:27b (builder/deploy/smoke/shapemodel.py) read by the real vLLM 0.33.0 and the transformers it
    installs: the architecture, the published numbers and a tokenizer as long as the vocabulary."""
    from builder.deploy.smoke import shapemodel

    target = shapemodel.ensure(shapemodel.shape_of("shape:27b"), tmp_path)
    code = """
import sys
from vllm.transformers_utils.config import get_config
import transformers
cfg = get_config(sys.argv[1], trust_remote_code=False)
text = cfg.get_text_config()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
print(cfg.architectures[0], type(cfg).__name__, text.hidden_size, text.num_hidden_layers, text.linear_num_value_heads,
      text.vocab_size, cfg.vision_config.depth, len(tok), tok.convert_tokens_to_ids("<|im_end|>"))
"""
    res = subprocess.run([engine_python("vllm", "0.33.0"), "-c", code, str(target)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["Qwen3_5ForConditionalGeneration", "Qwen3_5Config", "5120", "64", "48", "248320",
                                  "27", "248320", "248046"], res.stdout
