"""profiles.<name>.source = { <package> = "auto" } end to end on the real daemon: a real pypiserver publishes the
fixture's wheel (its kernel library built here by the real nvcc), `builder lock` pins it, `plan` predicts the
route and `build` decides it — after downloading the pinned file and auditing it (builder/audit.py), or from the
file's own metadata — then runs the chosen route under that route's cache key. Each choice and its reason is in the
build's output, the image's labels (builder/image/labels.py) and, for a published cell, images.json."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import services
from tests.helpers import HOST_CA, saxpy_so
from tests.helpers import builder_cli as builder
from tests.helpers import cuda_ext_auto_matrix as matrix
from tests.helpers import cuda_ext_wheel as wheel
from tests.helpers import upload_wheel as upload

CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90-auto"


@pytest.fixture(scope="module")
def index_image(local_bases):
    return services.build_image(services.INDEX_IMAGE, services.SERVICES / "pypiserver")


@pytest.fixture(scope="module")
def registry_image(local_bases):
    return services.build_image(services.REGISTRY_IMAGE, services.SERVICES / "registry")


@pytest.fixture(scope="module")
def published(nvcc, tmp_path_factory):
    """The fixture's wheel in four variants: as built (sm_80 + sm_90), pinning a torch, linked against CUDA 12's
    runtime (the real library with its DT_NEEDED name libcudart.so.13 changed to .so.12), and for CPython 3.12."""
    tmp = tmp_path_factory.mktemp("published")
    lib = saxpy_so(nvcc, tmp / "libsaxpy.so", (80, 90))
    assert lib.count(b"libcudart.so.13") >= 1  # -cudart shared: the library needs CUDA 13's runtime
    return {
        "good": wheel(tmp / "good", lib),
        "torch": wheel(tmp / "torch", lib, requires=("torch==2.14.0",)),
        "cuda12": wheel(tmp / "cuda12", lib.replace(b"libcudart.so.13", b"libcudart.so.12")),
        "py312": wheel(tmp / "py312", lib, tag="cp312-cp312-linux_x86_64"),
    }


def build(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    ca = ["--ca-bundle", str(HOST_CA)] if HOST_CA.is_file() else []
    return builder("build", "--matrix", str(tmp / "matrix.toml"), "--wheelhouse", str(tmp / "wheelhouse"),
                   "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"),
                   "--no-remote", "--no-smoke", "--json", *ca, *extra, cwd=tmp)


def route_of(res: subprocess.CompletedProcess[str]) -> dict:
    report = json.loads(res.stdout)
    (cell,) = report["cells"] if "cells" in report else report
    (step,) = [s for s in cell["steps"] if s["step"] == "route"]
    return step


def labels(ref: str) -> dict[str, str]:
    out = subprocess.run(["docker", "image", "inspect", ref, "--format", "{{json .Config.Labels}}"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def lock(tmp: Path, host: str) -> None:
    res = builder("lock", "--matrix", str(tmp / "matrix.toml"), "--index", f"http://{host}/simple/", cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr


def plan(tmp: Path, *extra: str) -> dict:
    res = builder("plan", "--matrix", str(tmp / "matrix.toml"), "--wheelhouse", str(tmp / "wheelhouse"), "--json",
                  *extra, cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    (cell,) = json.loads(res.stdout)["cells"]
    (pkg,) = cell["packages"]
    return pkg


def entries(tmp: Path) -> dict[str, str]:
    """The wheelhouse's cuda-ext entries: key → the wheel's file name."""
    return {p.parent.name: p.name for p in (tmp / "wheelhouse").glob("cuda-ext/*/*.whl")}


# slow: an index, two plans and a compile; the default tier takes an index wheel in
# tests/docker/builds/test_index_source_build.py
@pytest.mark.slow
def test_auto_takes_the_index_wheel_when_its_audit_and_pins_fit_and_compiles_otherwise(
        index_image, published, local_bases, tmp_path, docker_engine, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the download cache of this test only
    matrix(tmp_path)
    ref = f"127.0.0.1:5000/builder-test/cuda-ext:{CELL.removeprefix('cuda-ext-')}"
    ref_100 = ref.replace("sm80.90", "sm90.100")
    try:
        with services.index(overwrite=True) as idx:
            upload(idx.host, published["good"])
            lock(tmp_path, idx.host)
            # plan: tags and metadata are known; the engine data does not know this file's device code
            pkg = plan(tmp_path)
            assert pkg["action"] == "fetch" and pkg["route"]["chosen"] == "index" and not pkg["route"]["fact"]
            assert "unknown before the download" in pkg["route"]["reason"]
            assert "build's audit decides" in pkg["route"]["reason"]
            keys = pkg["route"]["keys"]
            assert set(keys) == {"index", "build"} and keys["index"] != keys["build"]

            # 1. the audited wheel covers sm_80 + sm_90 and needs CUDA 13's runtime: nothing is compiled
            res = build(tmp_path)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            step = route_of(res)
            assert step["status"] == "ok" and step["artifacts"]["chosen"] == "index" and step["artifacts"]["fact"]
            assert "the audit of the downloaded wheel passes for sm_80, sm_90" in step["reason"]
            assert "its binaries need libcudart.so.13, the cell's CUDA 13.0.88" in step["reason"]
            assert step["artifacts"]["key"] == keys["index"]
            log = (tmp_path / "logs" / f"{CELL}.log").read_text()
            assert "route cuda-ext==1.0.0: auto → index (decided)" in log and "--target wheels-cuda-ext" not in log
            got = labels(ref)
            assert got["io.builder.package.cuda-ext.route"] == "index"
            assert got["io.builder.package.cuda-ext.route-reason"] == step["reason"]
            assert got["io.builder.package.cuda-ext.source"].startswith("index:cuda_ext-1.0.0-cp311-cp311-linux_x86_64.whl")
            assert got["io.builder.package.cuda-ext.cache-key"] == keys["index"]
            assert entries(tmp_path) == {keys["index"]: published["good"].name}

            # 2. an arch the wheel lacks: the audit fails for sm_100, so the package is compiled, under the other key
            pkg = plan(tmp_path, "--arch", "90,100")
            assert pkg["route"]["chosen"] == "index" and not pkg["route"]["fact"]  # unknown before the download
            res = build(tmp_path, "--arch", "90,100")
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            step = route_of(res)
            assert step["artifacts"]["chosen"] == "build" and step["artifacts"]["fact"]
            assert step["reason"].startswith("build (decided): the audit of the downloaded wheel fails for sm_90, sm_100: "
                                              "libsaxpy.so lacks sm_100"), step["reason"]
            got = labels(ref_100)
            assert got["io.builder.package.cuda-ext.route"] == "build"
            assert got["io.builder.package.cuda-ext.source"].startswith("local:pkg@sha256:")
            assert got["io.builder.package.cuda-ext.sass"] == "sm_90,sm_100"  # what its own audit found
            build_100 = step["artifacts"]["key"]
            assert build_100 == step["artifacts"]["keys"]["build"] != step["artifacts"]["keys"]["index"] == keys["index"]
            assert set(entries(tmp_path)) == {keys["index"], build_100}

    finally:
        for name in (ref, ref_100):
            subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)


@pytest.mark.slow
def test_auto_compiles_when_torch_cuda_or_python_differ_and_images_json_records_the_route(
        index_image, registry_image, published, local_bases, tmp_path, docker_engine, monkeypatch):
    """Slow (one compile, four runtime images, a publish: ~4 min on 2 cores): each pin that differs makes build
    compile, with its reason in the output and the labels; a published auto cell's images.json entry says its route."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    matrix(tmp_path)
    ref = f"127.0.0.1:5000/builder-test/cuda-ext:{CELL.removeprefix('cuda-ext-')}"
    try:
        with services.index(overwrite=True) as idx, services.registry() as reg:
            upload(idx.host, published["good"])
            lock(tmp_path, idx.host)
            keys = plan(tmp_path)["route"]["keys"]
            ca = ["--ca-bundle", str(HOST_CA)] if HOST_CA.is_file() else []
            res = builder("publish", "--matrix", str(tmp_path / "matrix.toml"), "--registry", f"{reg.host}/team",
                          "--images-json", str(tmp_path / "images.json"), "--wheelhouse", str(tmp_path / "wheelhouse"),
                          "--pins-dir", str(tmp_path / "pins"), "--work-dir", str(tmp_path / "work"), "--log-dir",
                          str(tmp_path / "logs"), "--no-remote", "--quiet", *ca, cwd=tmp_path)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            entry = json.loads((tmp_path / "images.json").read_text())["images"]
            (image,) = entry.values()
            route = image["wheels"]["cuda-ext"]["route"]
            assert route["chosen"] == "index" and route["fact"] and route["key"] == keys["index"]
            assert image["wheels"]["cuda-ext"]["key"] == keys["index"]
            assert "the audit of the downloaded wheel passes for sm_80, sm_90" in route["reason"]

            # 3. a torch pin the cell does not have: ruled out by the file's metadata, no download
            upload(idx.host, published["torch"])
            lock(tmp_path, idx.host)
            pkg = plan(tmp_path)
            assert pkg["action"] == "build" and pkg["route"]["chosen"] == "build"
            assert "it pins torch==2.14.0, the cell has no torch" in pkg["route"]["reason"]
            assert pkg["cache_key"] == keys["build"]
            res = build(tmp_path)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            step = route_of(res)
            assert step["reason"] == ("build (decided): it pins torch==2.14.0, the cell has no torch (its metadata, "
                                      "as the index serves it)")
            assert labels(ref)["io.builder.package.cuda-ext.route"] == "build"
            assert labels(ref)["io.builder.package.cuda-ext.cache-key"] == keys["build"]

            # 4. linked against CUDA 12's runtime: only the download tells; compiled, the compiled wheel reused
            upload(idx.host, published["cuda12"])
            lock(tmp_path, idx.host)
            assert plan(tmp_path)["route"]["chosen"] == "index"  # predicted, unknown before the download
            res = build(tmp_path)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            step = route_of(res)
            assert step["artifacts"]["chosen"] == "build"
            assert "its binaries need libcudart.so.12, the cell has CUDA 13.0.88" in step["reason"]
            assert "reuse cuda-ext==1.0.0" in (tmp_path / "logs" / f"{CELL}.log").read_text()
            got = labels(ref)
            assert got["io.builder.package.cuda-ext.route"] == "build"
            assert "libcudart.so.12" in got["io.builder.package.cuda-ext.route-reason"]

        # 5. a release whose only wheel is for another Python: compiled, known from the file list alone
        with services.index(overwrite=True) as idx:
            upload(idx.host, published["py312"])
            lock(tmp_path, idx.host)
            pkg = plan(tmp_path)
            assert pkg["route"]["chosen"] == "build" and pkg["route"]["fact"]
            assert "no wheel of cuda-ext 1.0.0 on the index installs on Python 3.11 / bookworm" in pkg["route"]["reason"]
            res = build(tmp_path)
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            assert "cp312-cp312-linux_x86_64.whl" in route_of(res)["reason"]
            assert labels(ref)["io.builder.package.cuda-ext.route"] == "build"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", ref], capture_output=True)
