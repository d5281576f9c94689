"""builder bench through the docker SDK against the stand-in server image (a TEST DOUBLE built here from the
local Debian base, tests/fixtures/smoke/Dockerfile): a strategy the image's labels do not list is refused before a
container starts; and (slow: vLLM's client needs vLLM) the whole run in containers, each removed afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builder import render

from tests.helpers import REPO
from tests.helpers import build_stand_in, client_python, smoke_leftovers, stand_in_cell, stand_in_digest

pytestmark = pytest.mark.docker
MATRIX = REPO / "tests" / "fixtures" / "smoke" / "matrix.toml"


def _image(local_bases, strategies: str | None, suffix: str) -> str:
    cell = stand_in_cell()
    labels = [(k, strategies if strategies and k == "io.builder.strategies" else v)
              for k, v in render.labels(cell, {p.name: "test-double" for p in cell.packages})]
    tag = f"builder-test/bench-stand-in:{stand_in_digest()}{suffix}"
    build_stand_in(tag, labels, local_bases["debian"])
    return tag


@pytest.fixture(scope="session")
def stand_in(local_bases) -> str:
    """The stand-in image, labelled like builder labels the cell's runtime image (MTP2, MTP7)."""
    return _image(local_bases, None, "")


@pytest.fixture(scope="session")
def mtp2_only_image(local_bases) -> str:
    return _image(local_bases, "MTP2", "-mtp2-only")


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", "bench", *args, "--matrix", str(MATRIX)],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_a_strategy_the_image_was_not_built_for_is_refused_before_a_container_starts(mtp2_only_image, tmp_path):
    r = bench(mtp2_only_image, "--strategy", "none,MTP7", "--gpus", "none", "--out-dir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert f"--strategy MTP7: {mtp2_only_image} was built and smoke-tested for MTP2" in r.stderr
    assert smoke_leftovers(mtp2_only_image) == []


@pytest.mark.slow
def test_bench_in_containers_records_the_digest_and_removes_every_container(stand_in, tmp_path):
    r = bench(stand_in, "--strategy", "none,MTP2", "--gpus", "none", "--workload", "quick",
              "--client-python", client_python(), "--out-dir", str(tmp_path), "--boot-timeout", "60",
              "--env", "STAND_IN_TTFT_MS=60", "--env", "STAND_IN_ITL_MS=5", "--env", "STAND_IN_ACCEPT=1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("*/bench.json")).read_text())
    assert doc["environment"]["digest"].startswith("sha256:") or "@sha256:" in doc["environment"]["digest"]
    rows = {row["strategy"]: row for row in doc["rows"]}
    assert 55 <= rows["none"]["ttft_ms_p50"] <= 90 and rows["MTP2"]["spec_acceptance_rate"] == 0.5
    assert rows["MTP2"]["lossless"] == "ok"
    assert smoke_leftovers(stand_in) == []
