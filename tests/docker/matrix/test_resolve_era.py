"""Resolution as of the engine's own era (engine data `resolve_as_of`): a cell's first build takes only files the

The Docker half of tests/unit/matrix/test_resolve_era.py: its docstring says the rest."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.support.resolve_era import HOST_CA

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
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


# slow: a full build against an index; the default tier resolves as of a date in tests/unit/matrix/test_resolve_era.py
@pytest.mark.slow
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
