"""A package taken from an index instead of compiled, end to end on the real daemon: a real pypiserver (PEP 503
HTML pages, as many private mirrors serve) publishes the fixture's wheel, built here by the real nvcc for sm_80
and sm_90; `builder lock` pins it by sha256, `builder build` downloads it, the audit decides, the wheel cache
keeps it and the runtime image installs it. The audit refuses it for an arch it lacks, and bytes the index
swaps under the same file name are refused before anything is cached or tagged."""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from builder.imageref import ImageRef

from tests import services
from tests.helpers import CUDA_EXT as FIXTURE
from tests.helpers import HOST_CA, real_vllm_index_matrix, saxpy_so
from tests.helpers import builder_cli as builder
from tests.helpers import cuda_ext_wheel as wheel
from tests.helpers import upload_wheel as upload

WHEEL = "cuda_ext-1.0.0-cp311-cp311-linux_x86_64.whl"
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90-index"


@pytest.fixture(scope="module")
def index_image(local_bases):
    return services.build_image(services.INDEX_IMAGE, services.SERVICES / "pypiserver")


@pytest.fixture(scope="module")
def wheels(nvcc, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("published")
    good = wheel(tmp / "good", saxpy_so(nvcc, tmp / "libsaxpy.so", (80, 90)))
    evil = wheel(tmp / "evil", saxpy_so(nvcc, tmp / "libsaxpy-evil.so", (80,)))
    return good, evil


def matrix(tmp: Path) -> Path:
    (tmp / "engines.toml").write_text((FIXTURE / "engines.toml").read_text())
    text = (FIXTURE / "matrix.toml").read_text().replace(
        'engines = { cuda-ext = "1.0.0" }', 'engines = { cuda-ext = "1.0.0" }\nsource = { cuda-ext = "index" }')
    assert "source = {" in text
    (tmp / "matrix.toml").write_text(text)
    return tmp / "matrix.toml"


def build(tmp: Path, *extra: str, wheelhouse: str = "wheelhouse") -> subprocess.CompletedProcess[str]:
    ca = ["--ca-bundle", str(HOST_CA)] if HOST_CA.is_file() else []
    return builder("build", "--matrix", str(tmp / "matrix.toml"), "--wheelhouse", str(tmp / wheelhouse),
                   "--work-dir", str(tmp / "work"), "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"),
                   "--no-remote", "--quiet", *ca, *extra, cwd=tmp)


def entries(wheelhouse: Path) -> list[Path]:
    return sorted(wheelhouse.glob("cuda-ext/*/*.whl")) if wheelhouse.is_dir() else []


def image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def test_a_published_wheel_is_pinned_downloaded_audited_cached_and_installed(index_image, wheels, local_bases,
                                                                             tmp_path, docker_engine):
    good, evil = wheels
    m = matrix(tmp_path)
    with services.index(overwrite=True) as idx:
        upload(idx.host, good)
        res = builder("lock", "--matrix", str(m), "--index", f"http://{idx.host}/simple/", cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        lock = (tmp_path / "matrix.lock").read_text()
        assert f'filename = "{WHEEL}"' in lock and hashlib.sha256(good.read_bytes()).hexdigest() in lock

        plan = builder("plan", "--matrix", str(m), "--wheelhouse", str(tmp_path / "wheelhouse"), cwd=tmp_path)
        assert plan.returncode == 0 and "fetch  cuda-ext==1.0.0" in plan.stdout, plan.stdout + plan.stderr

        res = build(tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        log = (tmp_path / "logs" / f"{CELL}.log").read_text()
        assert f"download cuda-ext==1.0.0 from the index: http://{idx.host}/packages/{WHEEL}" in log
        assert "--target wheels-cuda-ext" not in log  # nothing compiled
        assert "audit cuda-ext==1.0.0" in log
        (cached,) = entries(tmp_path / "wheelhouse")
        assert cached.read_bytes() == good.read_bytes()
        ref = "127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80.90-index"
        installed = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", ref, "-c",
                                    "import cuda_ext, hashlib, pathlib; p = pathlib.Path(cuda_ext.__file__).parent; "
                                    "print(hashlib.sha256((p / 'libsaxpy.so').read_bytes()).hexdigest())"],
                                   capture_output=True, text=True)
        assert installed.returncode == 0, installed.stderr
        with zipfile.ZipFile(good) as zf:
            assert installed.stdout.strip() == hashlib.sha256(zf.read("cuda_ext/libsaxpy.so")).hexdigest()
        labels = subprocess.run(["docker", "image", "inspect", ref, "--format",
                                 '{{index .Config.Labels "io.builder.package.cuda-ext.source"}} '
                                 '{{index .Config.Labels "io.builder.package.cuda-ext.sass"}}'],
                                capture_output=True, text=True).stdout.split()
        # the SASS label is what the audit of the fetched wheel found (builder/image/labels.py)
        assert labels == [f"index:{WHEEL}@sha256:{hashlib.sha256(good.read_bytes()).hexdigest()}", "sm_80,sm_90"]

        # the audit decides: the same wheel for 90,100 lacks sm_100, so nothing is tagged and the entry stays
        res = build(tmp_path, "--arch", "90,100")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "audit failed for cuda-ext==1.0.0: the wheel misses requested archs" in res.stdout + res.stderr
        assert "sm_100" in (tmp_path / "logs" / "cuda-ext-1.0.0-cu130-py311-sm90.100-index.log").read_text()
        assert not image_exists("127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm90.100-index")
        assert entries(tmp_path / "wheelhouse") == [cached]

        # the index swaps other bytes in under the pinned name: refused, nothing cached or tagged, no .part left
        upload(idx.host, evil)
        res = build(tmp_path, "--arch", "80", wheelhouse="fresh")
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"{WHEEL}: the index served" in res.stdout + res.stderr and "matrix.lock pins" in res.stdout + res.stderr
        assert entries(tmp_path / "fresh") == []
        assert not [p for p in (tmp_path / "work").rglob("*.part*")]
        assert not image_exists("127.0.0.1:5000/builder-test/cuda-ext:1.0.0-cu130-py311-sm80-index")

    # the index is gone: the cached wheel is reused, never downloaded again
    res = build(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    log = (tmp_path / "logs" / f"{CELL}.log").read_text()
    assert "reuse cuda-ext==1.0.0" in log.split("download cuda-ext")[-1]


REAL = real_vllm_index_matrix("127.0.0.1:5000/builder-test")
REAL_CELL = "vllm-0.33.0-cu130-torch2.14.0-py311-sm80.90-index"


@pytest.mark.slow
@pytest.mark.network
def test_a_real_vllm_0_33_image_from_the_index_passes_smoke_l0_to_l2(local_bases, tmp_path, docker_engine):
    """Slow (a 0.3 GB wheel, a ~10 GB image): `builder lock` pins vLLM 0.33.0's wheel on the real PyPI, `build`
    downloads and audits it for sm_80/sm_90 and builds the runtime image (torch 2.14.0 and every dependency from
    PyPI, nvcc for the JIT), and smoke L0-L2 run in that image: labels and versions, every compiled extension,
    FlashInfer on, the audit of the installed packages, and vLLM's own parser resolving MTP2, MTP7 and DFlash2."""
    import json

    (tmp_path / "matrix.toml").write_text(REAL)
    m = str(tmp_path / "matrix.toml")
    res = builder("lock", "--matrix", m, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    ref = f"127.0.0.1:5000/builder-test/vllm:{REAL_CELL[len('vllm-'):]}"
    try:
        res = build(tmp_path, "--no-smoke", "--progress", "plain")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        log = (tmp_path / "logs" / f"{REAL_CELL}.log").read_text()
        assert "download vllm==0.33.0 from the index: https://files.pythonhosted.org/" in log
        # the audit passed because FA3, FlashMLA, ... are asked only for their own arch families (engine data)
        assert re.search(r"OK: \d+ binaries with device code cover sm_80, sm_90", log), log[-3000:]
        assert "ok (FlashAttention 3 (Hopper): for sm_90 only)" in log
        res = builder("smoke", REAL_CELL, "--matrix", m, "--layers", "L0,L1,JIT,L2", "--strategy", "all", "--launcher",
                      "docker", "--report-dir", str(tmp_path / "smoke"), "--json", cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
        report = json.loads(res.stdout)
        results = {(r["layer"], r["strategy"]): (r["status"], r["reason"]) for r in report["results"]}
        # JIT: Triton's launcher and a kernel for sm_80 and sm_90, FlashInfer's nvcc link, in the image, no GPU
        wanted = [("L0", None), ("L1", None), ("JIT", None), ("L2", "MTP2"), ("L2", "MTP7"), ("L2", "DFlash2")]
        assert set(wanted) <= set(results), results
        for key in wanted:
            assert results[key][0] == "pass", (key, results[key])
    finally:  # the cell's tag and the run's content name (<tag>-<digest prefix>): ~10 GB
        names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", ImageRef.parse(ref).name],
                               capture_output=True, text=True).stdout.split()
        for name in [n for n in names if n.startswith(ref)]:
            subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)


def _cell_of(matrix: Path):
    from builder.matrix import Selection, load
    from builder.resolve import select

    (cell,) = select(load(matrix), Selection(profiles=("all",)))
    return cell


def _jit_layer(cell, image: str, hide: dict[str, str] | None = None):
    """The smoke JIT layer (builder/deploy/smoke/layers.py) in a container of `image`; `hide`: host dir -> container
    path mounted over it (an empty directory hides what the image has there). Returns (result, seconds)."""
    from builder.deploy.smoke import layers
    from builder.deploy.runtime.engine import DockerLauncher

    launcher = DockerLauncher(image, mounts=dict(hide or {}))
    opts = layers.SmokeOptions(strategies=cell.strategies, model=layers.Model.resolve("tiny"))
    t0 = time.monotonic()
    try:
        result = layers.jit(cell, launcher, opts)
    finally:
        launcher.close()
    return result, time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.network
def test_real_vllm_index_cell_builds_three_times(local_bases, tmp_path, docker_engine):
    """Slow (a ~15 GB image, ~15 min for the first build on 2 cores): the first build resolves and records the
    runtime pins (the extras the closure asks for kept: nvidia-cudnn-frontend requires nvidia-cutlass-dsl[cu13],
    which a file written from pip freeze alone lost, and the second build then failed in 47 s), and labels the
    image with its content key. The second and third builds install exactly those pins: their content key is the
    first build's but for the pins, which the pins file says were read from that very image, so the tagged image
    is reused without a build or an OCI export: same digest, in seconds. Then the smoke JIT layer passes in that
    image (Triton's launcher and a kernel for sm_80 and sm_90, FlashInfer's nvcc -lcuda link) and fails with the
    Python include directory hidden inside the container."""
    import json

    (tmp_path / "matrix.toml").write_text(REAL)
    m = str(tmp_path / "matrix.toml")
    res = builder("lock", "--matrix", m, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    ref = f"127.0.0.1:5000/builder-test/vllm:{REAL_CELL[len('vllm-'):]}"
    log = tmp_path / "logs" / f"{REAL_CELL}.log"
    digests, seconds = [], []
    try:
        for i in range(3):
            t0 = time.monotonic()
            res = build(tmp_path, "--no-smoke", "--progress", "plain", "--json")
            seconds.append(round(time.monotonic() - t0, 1))
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
            digests.append(subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref],
                                          capture_output=True, text=True, check=True).stdout.strip())
            pins_text = next((tmp_path / "pins").glob(f"{REAL_CELL}.txt")).read_text()
            assert re.search(r"^nvidia-cutlass-dsl\[[^\]]*cu13[^\]]*\]==", pins_text, re.M), pins_text[:2000]
            (image_step,) = [r for c in json.loads(res.stdout) for r in c["steps"] if r["step"] == "image"]
            assert image_step["artifacts"]["reused"] is (i > 0), image_step
            if i == 0:
                key = image_step["artifacts"]["content_key"]
                assert f"(content key {key})" in pins_text and digests[0] in pins_text
            else:  # nothing built, nothing exported
                assert f"reuse {ref} (" in log.read_text() and "--target runtime " not in log.read_text()
                assert seconds[i] < 60, seconds
        print(f"\nthree builds of {REAL_CELL}: {seconds} s, digests {digests}")
        assert digests[0] == digests[1] == digests[2]

        cell = _cell_of(tmp_path / "matrix.toml")
        passed, took = _jit_layer(cell, ref)
        assert passed.status == "pass", passed.reason
        print(f"JIT layer in {ref}: {took:.1f} s ({passed.reason})")
        hidden = tmp_path / "empty-include"
        hidden.mkdir()
        failed, _ = _jit_layer(cell, ref, {str(hidden): "/usr/include/python3.11"})
        assert failed.status == "fail", failed.reason
        assert "no Python.h in /usr/include/python3.11" in failed.reason, failed.reason
        print(f"JIT layer with the Python headers hidden: {failed.reason}")
    finally:
        names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", ImageRef.parse(ref).name],
                               capture_output=True, text=True).stdout.split()
        for name in [n for n in names if n.startswith(ref)]:
            subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)
