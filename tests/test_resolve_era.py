"""Resolution as of the engine's own era (engine data `resolve_as_of`): a cell's first build takes only files the
index uploaded before that time (pip --uploaded-prior-to, PEP 700 upload-time) and records them hash-locked; the
build requirements are installed with the build tools' pins as constraints, so none of those is replaced.

The fixture (tests/fixtures/cuda-ext, `packaging>=23`) is built for real against PyPI: as of 2024-06-01 the newest
packaging is 24.0 (24.1 was uploaded 2024-06-09, today's is 26.x). The slow test at the end resolves vLLM
0.6.3.post1's runtime requirements as of its own release and runs the real vLLM with them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from builder import matrix as matrix_mod
from builder import resolve
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.deploy.smoke import Model, SmokeOptions, layers, tinymodel
from builder.deploy.runtime.engine import ProcessLauncher

from .helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"


def fixture_copy(tmp: Path, rule: str) -> Path:
    """The fixture matrix with `rule` (TOML lines) added to the cuda-ext rule of its engine data."""
    root = tmp / "fixture"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    data = root / "engines.toml"
    text = data.read_text()
    marker = 'launch = ["python", "-m", "cuda_ext"]\n'
    data.write_text(text.replace(marker, marker + rule + "\n", 1))
    return root / "matrix.toml"


def build(matrix: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder.cli", "build", "--matrix", str(matrix), "--wheelhouse", str(tmp / "wh"),
         "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"),
         "--ca-bundle", str(HOST_CA), "--arch", "80,90", "--no-remote", "--quiet"],
        capture_output=True, text=True, cwd=tmp)


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


@pytest.mark.network  # the fixture's dependencies come from PyPI inside the build
def test_first_build_resolves_as_of_the_date_and_records_it_hash_locked(local_bases, tmp_path):
    """The runtime's dependencies and the compile's build requirements are resolved as of the date and recorded
    hash-locked. The compile's build requirements (here the fixture's own plus `six>=1.10`, which no build tool pins) are
    resolved as of the date and recorded from pip's installation report, each with the sha256 of the file pip
    took; a later compile (the wheel cache emptied) installs exactly those files (--require-hashes --no-deps) and
    checks with no index that every build requirement is met. A recorded hash that is not the file's stops it."""
    m = fixture_copy(tmp_path, 'resolve_as_of = "2024-06-01T00:00:00Z"\nbuild_requirements_list = ["six>=1.10"]')
    res = build(m, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    runtime = (tmp_path / "pins" / f"{CELL}.txt").read_text()
    # the newest packaging uploaded before 2024-06-01 (today's resolve takes 26.x), with its files' hashes
    assert re.search(r"^packaging==24\.0 --hash=sha256:[0-9a-f]{64}", runtime, re.M), runtime
    assert "--uploaded-prior-to 2024-06-01T00:00:00Z" in (tmp_path / "logs" / f"{CELL}.log").read_text()
    recorded = tmp_path / "pins" / f"{CELL}.build-cuda-ext.txt"
    text = recorded.read_text()
    # six 1.16.0 was the newest before 2024-06-01 (1.17.0: 2024-12); the hash is its wheel's, the file pip took
    assert re.findall(r"^([a-z0-9-]+==\S+) --hash=sha256:[0-9a-f]{64}$", text, re.M) == ["six==1.16.0"], text
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert "--report /wheels/.build-requirements.json" in log and f"in {recorded}, each with its sha256" in log
    assert not list((tmp_path / "wh").glob("cuda-ext/*/.build-requirements.json"))  # only wheels are cached

    shutil.rmtree(tmp_path / "wh")  # the next build compiles again: from the recorded pins
    recorded.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, text))
    res = build(m, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert f"build requirements of cuda-ext hash-locked by {recorded}" in log
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in log, log[-3000:]
    assert not list((tmp_path / "wh").glob("cuda-ext/*/*.whl"))

    # a comment of this run only (pip ignores it) keeps BuildKit from answering this compile from an earlier run
    recorded.write_text(text + f"# test run {uuid.uuid4().hex}\n")
    res = build(m, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert "pip install --no-deps --require-hashes --force-reinstall -r /opt/build-context/build-pins/cuda-ext.txt" in log
    assert re.search(r"Requirement already satisfied: six>=1\.10 in .*\(1\.16\.0\)", log), log[-3000:]
    assert "Collecting six==1.16.0 (from -r /opt/build-context/build-pins/cuda-ext.txt" in log
    assert recorded.read_text().startswith(text)  # used, not rewritten


@pytest.mark.network
def test_build_requirements_cannot_replace_a_build_tool_pin(local_bases, tmp_path):
    """The build tools pin packaging==25.0: a build requirement asking for a newer one fails the compile, naming
    the conflict, instead of upgrading the toolchain under the pins (vLLM 0.33.0's setuptools-scm did)."""
    res = build(fixture_copy(tmp_path, 'build_requirements_list = ["packaging>=26"]'), tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert "--constraint /usr/local/lib/build-tools.txt" in log
    assert re.search(r"packaging>=26.*\n(.*\n)*.*packaging==25\.0|ResolutionImpossible|conflicting dependencies", log), log[-3000:]
    assert not list((tmp_path / "wh").glob("cuda-ext/*/*.whl"))


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
