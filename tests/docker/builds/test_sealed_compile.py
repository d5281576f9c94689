"""The compile step runs without a network: a download no earlier stage made fails there, loudly and named.

The fixture package (tests/fixtures/cuda-ext) is copied and given one dependency its build downloads with CMake's
FetchContent — a file the build host itself can fetch — that no fetch plan lists. Built through the real
templates on the real Docker engine, the compile RUN (`--network=none`) stops at that download, and the build
system's own error names the dependency."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# a small file on PyPI's file host: reachable from this machine, so only the seal can make the download fail
DEP_URL = ("https://files.pythonhosted.org/packages/71/39/171f1c67cd00715f190ba0b100d606d440a28c93c7714febeca8b79af85e/"
           "six-1.16.0.tar.gz")
DEP_SHA256 = "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"

FETCH_SCRIPT = f"""\
cmake_minimum_required(VERSION 3.30)
include(FetchContent)
FetchContent_Populate(undeclared-dep
    URL {DEP_URL}
    URL_HASH SHA256={DEP_SHA256}
    SOURCE_DIR ${{CMAKE_CURRENT_LIST_DIR}}/_deps/undeclared-dep-src
    BINARY_DIR ${{CMAKE_CURRENT_LIST_DIR}}/_deps/undeclared-dep-build
    SUBBUILD_DIR ${{CMAKE_CURRENT_LIST_DIR}}/_deps/undeclared-dep-subbuild)
"""


def _package(tmp: Path) -> Path:
    pkg = tmp / "pkg"
    shutil.copytree(FIXTURE / "pkg", pkg)
    (pkg / "fetch_dep.cmake").write_text(FETCH_SCRIPT)
    pyproject = pkg / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('requires = ["setuptools>=61", "wheel"]',
                                                       'requires = ["setuptools>=61", "wheel", "cmake==3.31.6"]'))
    setup = pkg / "setup.py"
    text = setup.read_text()
    hook = "        super().run()\n"
    assert hook in text
    setup.write_text(text.replace(hook, hook + '        subprocess.run(["cmake", "-P", str(HERE / "fetch_dep.cmake")], check=True)\n', 1))
    (tmp / "engines.toml").write_text((FIXTURE / "engines.toml").read_text().split("\n# The same package described")[0])
    (tmp / "matrix.toml").write_text((FIXTURE / "matrix.toml").read_text())
    return tmp / "matrix.toml"


# slow: a CMake + nvcc toolchain build of its own (about 90 s on 2 cores); the rendered --network=none on every
# compile RUN is held by the golden files and tests/unit/builds/test_compile_cache.py in the default suite
@pytest.mark.slow
def test_a_build_that_downloads_what_no_stage_fetched_fails_at_compile_naming_it(local_bases, tmp_path, docker_engine):
    assert requests.head(DEP_URL, timeout=30, verify=str(HOST_CA) if HOST_CA.is_file() else True).status_code == 200
    matrix = _package(tmp_path)
    argv = [sys.executable, "-m", "builder.cli", "build", "--matrix", str(matrix), "--arch", "80",
            "--wheelhouse", str(tmp_path / "wheelhouse"), "--work-dir", str(tmp_path / "work"),
            "--log-dir", str(tmp_path / "logs"), "--pins-dir", str(tmp_path / "pins"), "--quiet", "--no-smoke"]
    if HOST_CA.is_file():
        argv += ["--ca-bundle", str(HOST_CA)]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    (log,) = (tmp_path / "logs").glob("*.log")
    text = log.read_text(errors="replace")
    # the sealed RUN is the one that failed, and CMake names what it could not download, and from where
    (dockerfile,) = (tmp_path / "work").rglob("Dockerfile")
    compile_run = dockerfile.read_text().split("pip wheel --verbose", 1)[0].rsplit("\nRUN ", 1)[1]
    assert compile_run.startswith("--network=none "), compile_run
    assert "undeclared-dep" in text and "files.pythonhosted.org" in text, text[-4000:]
    assert any(s in text for s in ("Could not resolve host", "Couldn't resolve host", "resolve host name")), text[-4000:]
    assert not list((tmp_path / "wheelhouse").glob("cuda-ext/*/*.whl")), "nothing may be cached from a failed compile"
