"""The engine's own JIT modules (engine data jit_modules): what each shipped engine version builds at its first

The Docker half of tests/unit/render/test_jit_modules.py: its docstring says the rest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import real_vllm_index_matrix
from tests.support.jit_modules import FIXTURE, JIT_MATRIX, rendered

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# -- docker ------------------------------------------------------------------------------------------------
def builder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd)


def jit_result(report: Path) -> dict:
    (rep,) = json.loads(report.read_text())
    return next(r for r in rep["results"] if r["layer"] == "JIT")


@pytest.mark.slow  # a cell build with the JIT modules compiled in it (~2 min); the links derived from the modules and the prebuilt rendering stay in the default tier
def test_the_jit_layer_builds_the_engines_module_fails_without_the_links_and_a_prebuilt_image_compiles_none(
        local_bases, docker_engine, tmp_path):
    """One cell build, three verdicts. The jit = "prebuilt" image is the first-request runtime plus the modules
    its generators built at image-build time (which links them against the runtime's unversioned links); smoked as
    the first-request cell (no cache_dir: the probe builds in an empty workspace), it is that runtime at its first
    request. What prebuilding costs (the image's size, the build's seconds) is benchmarks/jit_modules.py's figure."""
    from builder.deploy.smoke import Model, SmokeOptions, smoke_image

    m = load(JIT_MATRIX)
    local, prebuilt = (select(m, Selection(profiles=(p,)))[0] for p in ("local", "prebuilt"))
    t0 = time.monotonic()
    res = builder("build", "--matrix", str(JIT_MATRIX), "--profile", "prebuilt", "--wheelhouse", str(tmp_path / "wheelhouse"),
                  "--work-dir", str(tmp_path / "work"), "--log-dir", str(tmp_path / "logs"), "--pins-dir",
                  str(tmp_path / "pins"), "--quiet", *(("--ca-bundle", str(HOST_CA)) if HOST_CA.is_file() else ()),
                  cwd=tmp_path)
    seconds = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    pre = jit_result(tmp_path / "work" / prebuilt.id / "smoke" / "smoke.json")
    assert pre["status"] == "pass" and "prebuilt, nothing compiled" in pre["reason"], pre
    assert pre["figures"]["cuda-ext-nvrtc@sm_80+sm_90"]["built"] == 0, pre

    def jit_of(ref: str, name: str):
        opts = SmokeOptions(strategies=(), model=Model(target=tmp_path), layers=("JIT",), log_dir=tmp_path / name)
        (got,) = [r for r in smoke_image(local, ref, opts).results if r.layer == "JIT"]
        return got

    first = jit_of(prebuilt.ref, "first-request")
    assert first.status == "pass", first
    for arch in ("sm_80", "sm_90"):
        fig = first.figures[f"cuda-ext-nvrtc@{arch}"]
        assert fig["built"] >= 1 and "libnvrtc.so.13" in fig["needed"] and "libcuda.so.1" in fig["needed"], fig

    # the runtime as it was: every unversioned library link but libcudart.so's removed
    today = f"builder-test/jit-modules-no-links:{local.tag}"
    dockerfile = (f"FROM {prebuilt.ref}\nRUN find /opt/cuda-jit/lib/ -maxdepth 1 -type l -name 'lib*.so' "
                  "! -name libcudart.so -print -delete\n")
    done = subprocess.run(["docker", "buildx", "build", "--load", "-t", today, "-"], input=dockerfile, text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr
    try:
        failed = jit_of(today, "no-links")
        assert failed.status == "fail", failed
        assert "cannot find -lnvrtc" in failed.reason, failed.reason
        assert "cuda-ext-nvrtc@sm_80" in failed.reason and "cuda-ext-nvrtc@sm_90" in failed.reason
    finally:
        subprocess.run(["docker", "image", "rm", "-f", today], capture_output=True)
    print(f"\nJIT layer at the first request: {first.seconds:.1f}s ({first.reason})\nwithout the links: "
          f"{failed.reason.splitlines()[0]}\njit = prebuilt: the layer {pre['seconds']:.1f}s ({pre['reason']}); "
          f"the cell built in {seconds:.0f}s")


# -- slow: the real vLLM 0.33.0 index image -----------------------------------------------------------------
REAL = real_vllm_index_matrix("127.0.0.1:5000/builder-test-jit")


@pytest.mark.slow
@pytest.mark.network
def test_flashinfers_own_modules_build_in_the_real_vllm_0_33_image_and_fail_there_without_the_links(
        local_bases, tmp_path, docker_engine):
    """Slow (a ~15 GB image, ~15+ min on 2 cores, then the modules' compiles): vLLM 0.33.0 from the index in a
    runtime image; the JIT layer builds FlashInfer 0.7.2.post1's fp8_blockscale_gemm_sm90 (sm_90) and sampling
    (sm_80, sm_90) through FlashInfer's own generators, no GPU, and passes; the same image with the unversioned CUDA
    library links removed fails it with the linker's `cannot find -lnvrtc`."""
    from builder.deploy.smoke import Model, SmokeOptions, smoke_image

    (tmp_path / "matrix.toml").write_text(REAL)
    m = tmp_path / "matrix.toml"
    res = builder("lock", "--matrix", str(m), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    (cell,) = select(load(m), Selection(profiles=("all",)))
    names = [b["name"] for b in cell.jit_builds]
    assert names == ["flashinfer-fp8-blockscale-gemm-sm90", "flashinfer-sampling"], names
    today = f"builder-test/jit-modules-no-links:{cell.tag}"
    try:
        res = builder("build", "--matrix", str(m), "--wheelhouse", str(tmp_path / "wheelhouse"), "--work-dir",
                      str(tmp_path / "work"), "--log-dir", str(tmp_path / "logs"), "--pins-dir", str(tmp_path / "pins"),
                      "--no-smoke", "--quiet", *(("--ca-bundle", str(HOST_CA)) if HOST_CA.is_file() else ()),
                      cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        opts = SmokeOptions(strategies=(), model=Model(target=tmp_path), layers=("JIT",), log_dir=tmp_path / "smoke")
        (passed,) = [r for r in smoke_image(cell, cell.ref, opts).results if r.layer == "JIT"]
        assert passed.status == "pass", passed.reason
        fp8 = passed.figures["flashinfer-fp8-blockscale-gemm-sm90@sm_90"]
        assert fp8["built"] >= 1 and fp8["library_bytes"] > 100_000, fp8
        dockerfile = (f"FROM {cell.ref}\nRUN find /opt/cuda-jit/lib/ -maxdepth 1 -type l -name 'lib*.so' "
                      "! -name libcudart.so -print -delete\n")
        done = subprocess.run(["docker", "buildx", "build", "--load", "-t", today, "-"], input=dockerfile, text=True,
                              capture_output=True)
        assert done.returncode == 0, done.stderr
        (failed,) = [r for r in smoke_image(cell, today, opts).results if r.layer == "JIT"]
        assert failed.status == "fail" and "cannot find -lnvrtc" in failed.reason, failed.reason
        assert "flashinfer-fp8-blockscale-gemm-sm90@sm_90" in failed.reason
        print(f"\nJIT layer in {cell.ref}: {passed.seconds:.1f}s ({passed.reason})\n"
              + "\n".join(f"  {k}: {v}" for k, v in passed.figures.items())
              + f"\nwithout the links ({failed.seconds:.1f}s): {failed.reason}")
    finally:
        subprocess.run(["docker", "image", "rm", "-f", today], capture_output=True)
        listed = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", cell.image],
                                capture_output=True, text=True).stdout.split()
        for name in [n for n in listed if n.startswith(cell.ref)]:
            subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)


# -- docker: a prebuilt cache for any user, on any host ------------------------------------------------------
NVCC_DOUBLE = ("#!/bin/sh\n# test double for nvcc (no CUDA compile is the subject here): it writes the file -o names\n"
               'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then : > "$2"; shift; fi; shift; done\n')


def test_a_prebuilt_jit_cache_serves_a_non_root_user_and_names_one_directory_for_every_host(local_bases, tmp_path):
    """The rendered prebuild (its ENV and RUN, as the prebuilt cell's runtime stage has them) run in an image on the
    local CUDA base, then the module's first use as a non-root user (--user 1000:1000).

    Stand-ins, and why: FlashInfer itself needs torch's CUDA build (GBs) and cannot be installed in a fast test image
    here, so the framework is the fixture's generator (tests/fixtures/cuda-ext/pkg/cuda_ext/jit.py), which names its
    directory and takes its lock as FlashInfer 0.7.2.post1 does (jit/env.py _get_workspace_dir_name: the sorted arch set
    joined by "_"; jit/core.py build_and_load: filelock's O_RDWR open of cached_ops/tmp/<module>.lock at every first
    use); nvcc is a test double that writes its output file (what is tested is the cache's layout and permissions).
    Verdicts: the non-root first use builds nothing and succeeds; the image's pinned arch list makes the host's GPU mix
    irrelevant (one directory, 80_90); without the stage's chmod the same first use is FlashInfer's PermissionError."""
    m = load(JIT_MATRIX)
    (cell,) = select(m, Selection(profiles=("prebuilt",)))
    text = rendered(m, cell)
    env = re.search(r"^ENV CUDA_EXT_JIT_ARCH_LIST=.*$", text, re.M).group(0)
    run = re.search(r"^RUN CUDA_EXT_JIT_ARCH_LIST=.*?chmod -R a\+rwX /opt/jit-cache$", text, re.M | re.S).group(0)
    ctx = tmp_path / "ctx"
    (ctx / "pkg").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(FIXTURE / "pkg" / "cuda_ext"), str(ctx / "pkg")], check=True)
    (ctx / "nvcc").write_text(NVCC_DOUBLE)
    head = (f"FROM {local_bases['cuda_base']}\nCOPY pkg /opt/pkg\nCOPY --chmod=755 nvcc /opt/nvcc-double/bin/nvcc\n"
            "RUN ln -sf /usr/bin/python3 /usr/local/bin/python\nENV PYTHONPATH=/opt/pkg CUDA_HOME=/opt/nvcc-double\n")
    use = ("import json, os, cuda_ext.jit as j; s = j.gen_nvrtc_module(); before = os.stat(s.jit_library_path).st_mtime_ns;"
           " s.build(); print(json.dumps({'dirs': sorted(os.listdir(os.environ['CUDA_EXT_JIT_HOME'] + '/cached_ops')),"
           " 'same': os.stat(s.jit_library_path).st_mtime_ns == before, 'uid': os.getuid()}))")
    tags = {}
    for name, body in (("open", run), ("root-only", run.replace(" \\\n && chmod -R a+rwX /opt/jit-cache", ""))):
        assert name == "open" or body != run
        (ctx / "Dockerfile").write_text(head + env + "\n" + body + "\n")
        tags[name] = f"builder-test/jit-cache-users:{name}"
        done = subprocess.run(["docker", "buildx", "build", "--load", "-t", tags[name], str(ctx)], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    try:
        ok = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", tags["open"], "python3",
                             "-c", use], capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr[-2000:]
        got = json.loads(ok.stdout.strip().splitlines()[-1])
        assert got == {"dirs": ["80_90"], "same": True, "uid": 1000}, got
        # the image as it was (the cache root-owned, lock files 0644): the first use of a non-root user fails
        denied = subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "1000:1000", tags["root-only"],
                                 "python3", "-c", use], capture_output=True, text=True, timeout=120)
        assert denied.returncode != 0 and "PermissionError" in denied.stderr and ".lock" in denied.stderr, denied.stderr
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
