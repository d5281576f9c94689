"""More than one build machine: a second Docker engine, started here on its own socket, data root, exec root and
bridge (a separate build host as far as buildx is concerned), builds the fixture cell with `--builder`; its
BuildKit layers go to a registry (`--layer-cache`) and its wheel to the registry's wheel cache. The first
engine then builds the same cell from an empty wheelhouse: with the layer cache alone its compile step is CACHED
(nothing is compiled again) and the image digest is the second engine's; with the wheel cache alone the wheel is
pulled and no compile stage runs at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from tests import engines
from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"

pytestmark = pytest.mark.slow  # a second engine, the CUDA bases loaded into it, a cold build there: ~4 minutes


class Engine(NamedTuple):
    context: str  # a docker context: `builder build --builder <context>` builds there
    host: str  # unix:///.../docker.sock
    env: dict[str, str]  # DOCKER_CONFIG holding the context (nothing written to the user's ~/.docker)


@pytest.fixture(scope="module")
def second_engine(docker_engine, local_bases):
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        pytest.fail("the second engine needs ip and iptables (scripts/setup-docker.sh installs docker.io, which brings them)")
    with engines.second_engine(nat=True) as engine:  # its builds reach PyPI through its own NAT
        engines.load_images(engine, local_bases["cuda_devel"], local_bases["cuda_base"])
        config = engine.root / "docker-config"
        config.mkdir()
        env = {"DOCKER_CONFIG": str(config)}
        context = f"bld2-{uuid.uuid4().hex[:8]}"
        subprocess.run(["docker", "context", "create", context, "--docker", f"host={engine.host}"],
                       env={**os.environ, **env}, check=True, capture_output=True)
        yield Engine(context, engine.host, env)


def builder(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=1800)


def test_a_second_engine_builds_and_the_first_reuses_its_layers_and_wheel(second_engine, registry, tmp_path):
    ns = f"mh-{uuid.uuid4().hex[:8]}"
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURE, fixture)
    # a source no engine has built before: whatever is CACHED on the first engine came from the registry
    with (fixture / "pkg" / "csrc" / "saxpy.cu").open("a") as fh:
        fh.write(f"// {ns}\n")
    text = (fixture / "matrix.toml").read_text()
    (fixture / "matrix.toml").write_text(text.replace("127.0.0.1:5000/builder-test", f"127.0.0.1:5000/{ns}"))
    layer_cache, wheels = f"{registry}/{ns}/buildcache", f"registry:{registry}/{ns}/wheels"

    def build(name: str, *extra: str, env=None) -> tuple[subprocess.CompletedProcess[str], dict, str]:
        res = builder("build", "--matrix", "matrix.toml", "--wheelhouse", str(tmp_path / f"wh-{name}"),
                      "--work-dir", str(tmp_path / f"work-{name}"), "--log-dir", str(tmp_path / f"logs-{name}"),
                      "--pins-dir", str(tmp_path / "pins"), "--ca-bundle", str(HOST_CA), "--quiet", "--json", *extra,
                      cwd=fixture, env={"SOURCE_DATE_EPOCH": "1700000000", **(env or {})})
        assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
        (cell,) = json.loads(res.stdout)
        return res, cell, (tmp_path / f"logs-{name}" / f"{CELL}.log").read_text()

    try:
        # 1. the second engine compiles; layers and wheel go to the registry
        _, far, log = build("far", "--builder", second_engine.context, "--layer-cache", layer_cache,
                            "--cache-remote", wheels, env=second_engine.env)
        assert f"docker --context {second_engine.context} buildx build" in log
        assert far["built"] == ["cuda-ext==1.0.0"] and "nvcc" in log
        assert f"--cache-to type=registry,ref={layer_cache}:{CELL}-wheels-cuda-ext,mode=max" in log
        far_steps = {s["step"]: s for s in far["steps"]}
        far_wheel = far_steps["compile"]["artifacts"]["wheels"]
        # the cell's first build resolved its runtime pins; every build after it installs them hash-locked (the
        # image the first build makes differs in pip's metadata only): build once more there, from its cache
        _, far, log = build("far", "--builder", second_engine.context, "--layer-cache", layer_cache,
                            "--cache-remote", wheels, env=second_engine.env)
        assert "hash-locked by" in log and far["reused"] == ["cuda-ext==1.0.0"]
        tags = json.loads(subprocess.run(["curl", "-sf", f"http://{registry}/v2/{ns}/buildcache/tags/list"],
                                         capture_output=True, text=True, check=True).stdout)["tags"]
        assert sorted(tags) == [f"{CELL}-runtime", f"{CELL}-wheels-cuda-ext"]

        # 2. the first engine, empty wheelhouse, no wheel cache: the compile comes from the registry's layers
        _, near, log = build("layers", "--layer-cache", layer_cache, "--no-remote")
        assert near["built"] == ["cuda-ext==1.0.0"]  # the wheel stage ran ...
        compile_step = next(b for b in log.split("\n\n") if "pip wheel" in b.splitlines()[0] and "RUN" in b)
        assert "CACHED" in compile_step, compile_step[:2000]  # ... from the second engine's layers: no nvcc here
        assert {s["step"]: s for s in near["steps"]}["compile"]["artifacts"]["wheels"] == far_wheel
        assert near["digest"] == far["digest"]  # one image, byte for byte, from either machine

        # 3. the first engine, empty wheelhouse, the registry's wheel cache: nothing compiled, no wheel stage at all
        res, pulled, log = build("wheels", "--cache-remote", wheels)
        steps = {s["step"]: s for s in pulled["steps"]}
        assert steps["compile"]["artifacts"]["reused"] is True and pulled["built"] == []
        assert "--target wheels-cuda-ext" not in log
        assert steps["compile"]["artifacts"]["wheels"] == far_wheel
        assert pulled["digest"] == far["digest"]
    finally:
        names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", f"127.0.0.1:5000/{ns}/*"],
                               capture_output=True, text=True).stdout.split()
        if names:
            subprocess.run(["docker", "image", "rm", *names], capture_output=True)


def test_a_second_engine_compiles_and_the_first_hits_its_objects_in_the_shared_compile_cache(second_engine, tmp_path):
    """The shared compile cache is real: Redis (Debian's redis-server, with AUTH) started by testcontainers. The
    second engine compiles a source no cache has seen (its local object cache is cold: a fresh engine); the first
    engine then compiles the same package from an empty wheelhouse with a cold local object cache of its own, and
    every cacheable nvcc step is a hit, served by Redis. The password reaches the RUN only as a BuildKit secret."""
    from tests.services import redis

    ns = f"cc-{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    fixture = tmp_path / "fixture"
    shutil.copytree(FIXTURE, fixture)
    with (fixture / "pkg" / "csrc" / "saxpy.cu").open("a") as fh:
        fh.write(f"// {ns}\n")
    with redis(password) as service:
        text = (fixture / "matrix.toml").read_text().replace("127.0.0.1:5000/builder-test", f"127.0.0.1:5000/{ns}")
        (fixture / "matrix.toml").write_text(text + f'\n[defaults.cache]\ncompile = "redis://{service.host}"\n')

        def build(name: str, *extra: str, env=None) -> tuple[dict, str, str]:
            res = builder("build", "--matrix", "matrix.toml", "--wheelhouse", str(tmp_path / f"wh-{name}"),
                          "--work-dir", str(tmp_path / f"work-{name}"), "--log-dir", str(tmp_path / f"logs-{name}"),
                          "--pins-dir", str(tmp_path / f"pins-{name}"), "--ca-bundle", str(HOST_CA), "--no-smoke",
                          "--quiet", "--json", *extra, cwd=fixture,
                          env={"BUILDER_COMPILE_CACHE_PASSWORD": password, "BUILDER_SCCACHE_NAMESPACE": f"{ns}-{name}",
                               **(env or {})})
            assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
            (cell,) = json.loads(res.stdout)
            dockerfile = (tmp_path / f"work-{name}" / CELL / "Dockerfile").read_text()
            return cell, (tmp_path / f"logs-{name}" / f"{CELL}.log").read_text(), dockerfile + res.stdout + res.stderr

        try:
            far, far_log, far_text = build("far", "--builder", second_engine.context, env=second_engine.env)
            near, near_log, near_text = build("near")
            first = {s["step"]: s for s in far["steps"]}["compile"]["artifacts"]
            second = {s["step"]: s for s in near["steps"]}["compile"]["artifacts"]
            assert first["reused"] is False and second["reused"] is False  # both engines ran the compile
            cold, warm = first["compile"]["sccache"], second["compile"]["sccache"]
            # disk first, Redis second; the local disk level of the first engine is cold (its own namespace), so
            # its hits can only come from Redis
            assert cold["location"].startswith("Multi-level") and warm["location"].startswith("Multi-level"), (cold, warm)
            # one .cu for sm_80 and sm_90: cudafe++, cicc and ptxas per arch, the host compile
            assert cold["hits"] == 0 and cold["misses"] >= 5, cold
            assert warm["misses"] == 0 and warm["hits"] == cold["misses"], warm
            assert warm["hits_by_step"].get("cubin [ptxas]") == 2 and warm["hits_by_step"].get("ptx [cicc]") == 2, warm
            assert first["compile"]["compile_cache"] == f"redis://{service.host}"
            assert f"sccache {warm['hits']}/{warm['hits']} hits" in near_log
            # the same wheel from either machine
            assert first["wheels"] == second["wheels"]
            # the seal is relaxed only because a shared backend is configured, and the password is in no file,
            # no log line, no layer
            assert "RUN --network=host --mount=type=cache,target=/root/.cache/sccache" in far_text
            for text in (far_log, near_log, far_text, near_text):
                assert password not in text
            history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", near["image"]],
                                     capture_output=True, text=True, check=True).stdout
            assert password not in history
            assert not list((tmp_path / "work-near" / CELL).glob("sccache.secret"))  # removed after the compile
            keys = service.container.exec(["redis-cli", "-a", password, "--no-auth-warning", "DBSIZE"]).output.decode()
            assert int(keys.strip()) >= cold["misses"], keys
        finally:
            names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                                    f"127.0.0.1:5000/{ns}/*"], capture_output=True, text=True).stdout.split()
            if names:
                subprocess.run(["docker", "image", "rm", *names], capture_output=True)
