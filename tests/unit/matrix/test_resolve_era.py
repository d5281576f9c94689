"""Resolution as of the engine's own era (engine data `resolve_as_of`): a cell's first build takes only files the
index uploaded before that time (pip --uploaded-prior-to, PEP 700 upload-time) and records them hash-locked; the
build requirements are installed with the build tools' pins as constraints, so none of those is replaced.

The fixture (tests/fixtures/cuda-ext, `packaging>=23`) is built for real against PyPI: as of 2024-06-01 the newest
packaging is 24.0 (24.1 was uploaded 2024-06-09, today's is 26.x). The slow test at the end resolves vLLM
0.6.3.post1's runtime requirements as of its own release and runs the real vLLM with them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from builder import matrix as matrix_mod
from builder import resolve
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.deploy.smoke import Model, SmokeOptions, layers, tinymodel
from builder.deploy.runtime.engine import ProcessLauncher

from tests.helpers import REPO
from tests.support.resolve_era import HOST_CA


@pytest.mark.pure
def test_resolve_as_of_is_engine_data_and_checked(tmp_path):
    kn = load_knowledge()
    assert kn.recipe("vllm", "0.6.3.post1").resolve_as_of == "2024-10-17T18:04:43Z"
    assert kn.recipe("vllm", "0.6.3.post1").resolve_as_of_exempt == ("pyairports==0.0.1",)
    assert kn.recipe("vllm", "0.33.0").resolve_as_of == "2026-11-02T10:13:43Z"
    assert kn.recipe("vllm", "0.6.2").resolve_as_of == ""  # no date: today's index
    bad = tmp_path / "bad.toml"
    bad.write_text('[packages.x]\npypi = "x"\nkind = "engine"\ntemplate = "pip-wheel"\ntorch_pin = "none"\n'
                   'mem_gb_per_nvcc_thread = 1.0\n[[packages.x.rules]]\nversions = ">=1"\n'
                   'resolve_as_of = "2024-13-01T00:00:00Z"\n')
    with pytest.raises(UserError, match="resolve_as_of.*UTC time"):
        load_knowledge((str(bad),))


# ---- the real vLLM 0.6.3.post1, resolved as of its own release ------------------------------------------------
VLLM = "0.6.3.post1"
TORCH = "2.4.0"
CLEAN_PIP = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
    "PIP_CONFIG_FILE": os.devnull, "PIP_CERT": os.environ.get("PIP_CERT", str(HOST_CA)),
    "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.slow
@pytest.mark.network
def test_vllm_0_6_3_post1_resolved_as_of_its_release_imports_and_parses(tmp_path):
    """What a cu121 cell's first build resolves, shown where it can run here (no CUDA 12 base or nvcc): the real
    vllm 0.6.3.post1 wheel (cp38-abi3) and torch 2.4.0 from PyPI, every other requirement taken as of the
    engine data's resolve_as_of (and its exempt pins) with the build tools' pip, in a Python 3.11 venv; then vllm
    imports and smoke's L2 runs the cell's strategies through vLLM's own parser (process launcher): the data says
    0.6.3.post1 runs none of them, and its parser indeed has no --speculative-config."""
    kn = load_knowledge()
    recipe = kn.recipe("vllm", VLLM)
    pip_pin = next(t for t in kn.build_tools() if t.startswith("pip=="))
    venv = tmp_path / "venv"
    subprocess.run([shutil.which("python3.11") or sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    index = ["--index-url", "https://pypi.org/simple"]
    pip = [py, "-m", "pip", "--no-input"]
    subprocess.run([*pip, "install", "-q", *index, pip_pin], check=True, env=CLEAN_PIP)
    exempt = tmp_path / "exempt"
    subprocess.run([*pip, "download", "-q", *index, "--no-deps", "--dest", str(exempt), *recipe.resolve_as_of_exempt],
                   check=True, env=CLEAN_PIP)
    report = tmp_path / "report.json"
    subprocess.run([*pip, "install", "-q", *index, "--no-compile", "--uploaded-prior-to", recipe.resolve_as_of,
                    "--find-links", str(exempt), "--report", str(report), f"vllm=={VLLM}", f"torch=={TORCH}"],
                   check=True, env=CLEAN_PIP)
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    print("resolved as of", recipe.resolve_as_of, json.dumps(got, sort_keys=True))
    assert got["vllm"] == VLLM and got["torch"] == TORCH
    assert got["transformers"] == "4.45.2"  # the newest transformers uploaded before 2024-10-17T18:04:43Z
    env = CLEAN_PIP | {"VLLM_TARGET_DEVICE": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
    # today's PyPI gives transformers 5.x, which finds torch 2.4.0 too old: is_torch_available() is False there
    out = subprocess.run([py, "-c", "import vllm, transformers; print(vllm.__version__, transformers.__version__,"
                          " transformers.is_torch_available())"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.split()[-3:] == [VLLM, "4.45.2", "True"], out.stdout + out.stderr[-3000:]

    m = matrix_mod.load(REPO / "matrix.toml")
    cell = next(c for c in resolve.select(m, matrix_mod.Selection(engines=("vllm",), profiles=("cu121",))))
    assert cell.version == VLLM
    tiny = tinymodel.ensure(tmp_path / "models")
    launcher = ProcessLauncher(python=py, gpus=False, extra_env={"PYTHONDONTWRITEBYTECODE": "1"})
    opts = SmokeOptions(strategies=(), model=Model(tiny.target, tiny.drafter, tiny=True), log_dir=tmp_path)
    names = ("MTP2", "MTP7", "DFlash2")
    assert all(VLLM not in cell.engine_recipe.strategy(n).versions for n in names)  # the data's refusal
    for r in layers.l2(cell, launcher, opts, [cell.engine_recipe.strategy(n) for n in names]):
        assert r.status == "fail" and "unrecognized arguments: --speculative-config" in r.reason, (r.strategy, r.reason)
