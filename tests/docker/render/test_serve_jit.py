"""What an engine compiles at its first request is in its runtime image, and smoke's JIT layer proves it without

The Docker half of tests/unit/render/test_serve_jit.py: its docstring says the rest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder import plan, render
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX
from tests.support.serve_jit import FIXTURE

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd)


def build(tmp: Path, matrix: Path, wheelhouse: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    tmp.mkdir(parents=True)
    res = builder("build", "--matrix", str(matrix), "--wheelhouse", str(wheelhouse), "--work-dir", str(tmp / "work"),
                  "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"), "--quiet",
                  *(("--ca-bundle", str(HOST_CA)) if HOST_CA.is_file() else ()), cwd=tmp)
    reports = list((tmp / "work").rglob("smoke.json"))
    assert len(reports) == 1, (reports, res.stdout[-2000:], res.stderr[-2000:])
    (rep,) = json.loads(reports[0].read_text())
    return res, next(r for r in rep["results"] if r["layer"] == "JIT")


@pytest.mark.slow  # two cell builds (~45 s); that every shipped runtime installs the headers and cc its first request needs stays in the default tier (rendered, above); the JIT layer itself runs in the default tier in test_smoke_docker.py
def test_the_jit_layer_fails_the_runtime_without_headers_and_passes_it_with_them(local_bases, docker_engine, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    unmet, got = build(tmp_path / "unmet", FIXTURE / "matrix-jit-unmet.toml", wheelhouse)
    assert unmet.returncode == 1, unmet.stdout + unmet.stderr
    assert got["status"] == "fail"
    assert "no Python.h in /usr/include/python3.11 (the Python headers: python3.11-dev)" in got["reason"]
    assert "no C compiler" in got["reason"]
    assert "JIT: python-c: no C extension can be built" in unmet.stdout  # the closing table names the failure
    met, got = build(tmp_path / "met", FIXTURE / "matrix-jit.toml", wheelhouse)
    assert met.returncode == 0, met.stdout + met.stderr
    assert got["status"] == "pass", got
    assert got["figures"]["python-c"]["include"] == "/usr/include/python3.11"
    print(f"\nJIT layer: {got['seconds']:.2f}s ({got['reason']})")
    # the engine runtimes' libcuda link stub, as rendered for vLLM 0.33.0, in that image (it has gcc and readelf):
    # a module linked -lcuda against it records NEEDED libcuda.so.1 (an empty stub would be dropped by the linker)
    m = load(MATRIX)
    (cell,) = [c for c in select(m, Selection(profiles=("all",))) if c.id.startswith("vllm-0.33.0-")]
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    stub = re.search(r"^RUN (mkdir -p /opt/builder/stubs.*?rm -f /tmp/libcuda-stub\.c[^\n]*)$", text, re.M | re.S).group(1)
    check = ("printf 'int cuInit(unsigned);\\nint f(void) { return cuInit(0); }\\n' > /tmp/t.c && "
             "gcc -shared -fPIC -o /tmp/t.so /tmp/t.c -L/opt/builder/stubs -l:libcuda.so.1 && readelf -d /tmp/t.so")
    ran = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash",
                          "127.0.0.1:5000/builder-test-jit/cuda-ext:1.0.0-cu130-py311-sm80.90", "-c",
                          stub + " && " + check], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "Shared library: [libcuda.so.1]" in ran.stdout
