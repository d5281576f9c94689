"""More than one build machine: a second Docker engine, started here on its own socket, data root, exec root and
bridge (a separate build host as far as buildx is concerned), builds the fixture cell with `--builder`; its
BuildKit layers go to a registry (`--layer-cache`) and its wheel to the registry's wheel cache. The first
engine then builds the same cell from an empty wheelhouse: with the layer cache alone its compile step is CACHED
(nothing is compiled again) and the image digest is the second engine's; with the wheel cache alone the wheel is
pulled and no compile stage runs at all."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.helpers import REPO, stop_process

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
PREFIX = Path(os.environ.get("BUILDER_DOCKER_PREFIX", "/opt/builder-docker"))

pytestmark = pytest.mark.slow  # a second engine, the CUDA bases loaded into it, a cold build there: ~4 minutes


class Engine(NamedTuple):
    context: str  # a docker context: `builder build --builder <context>` builds there
    host: str  # unix:///.../docker.sock
    env: dict[str, str]  # DOCKER_CONFIG holding the context (nothing written to the user's ~/.docker)


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def _free_subnet() -> ipaddress.IPv4Network:
    used = sh(["ip", "-4", "route"]).stdout
    for _ in range(50):
        net = ipaddress.ip_network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if str(net.network_address)[:-1] not in used:
            return net
    pytest.fail("no free 10.x.y.0/24 for the second engine's bridge")


@pytest.fixture(scope="module")
def second_engine(docker_engine, local_bases):
    if shutil.which("ip") is None or shutil.which("iptables") is None:
        pytest.fail("the second engine needs ip and iptables (scripts/setup-docker.sh installs docker.io, which brings them)")
    dockerd = PREFIX / "bin" / "dockerd"
    if not dockerd.exists():
        pytest.fail(f"{dockerd} missing: run scripts/setup-docker.sh")
    root = Path(tempfile.mkdtemp(prefix="bld2-", dir="/tmp"))  # short: a unix socket path has at most 107 bytes
    tag = uuid.uuid4().hex[:8]
    bridge, net = f"bld{tag}", _free_subnet()
    gateway = f"{next(net.hosts())}/{net.prefixlen}"
    # its own bridge, never --bridge=none (that deletes docker0 and takes the first engine's network down), and
    # its own NAT, since it manages no iptables rules (those would fight the first engine's)
    rules = [["-t", "nat", "POSTROUTING", "-s", str(net), "!", "-o", bridge, "-j", "MASQUERADE"],
             ["FORWARD", "-i", bridge, "-j", "ACCEPT"],
             ["FORWARD", "-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]]

    def iptables(op: str, rule: list[str]) -> None:
        table = rule[:2] if rule[0] == "-t" else []
        chain = rule[len(table)]
        sh(["iptables", *table, op, chain, *rule[len(table) + 1:]], check=op != "-D")

    sh(["ip", "link", "add", "name", bridge, "type", "bridge"], check=True)
    proc = None
    try:
        sh(["ip", "addr", "add", gateway, "dev", bridge], check=True)
        sh(["ip", "link", "set", bridge, "up"], check=True)
        for rule in rules:
            iptables("-I", rule)
        (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}')
        sock = root / "docker.sock"
        env_path = f"{PREFIX / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        log = (root / "dockerd.log").open("wb")
        proc = subprocess.Popen([str(dockerd), "--config-file", str(root / "daemon.json"), "--data-root", str(root / "data"),
                                 "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
                                 "-H", f"unix://{sock}", "--bridge", bridge, "--iptables=false", "--ip6tables=false"],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": env_path},
                                start_new_session=True)
        host = f"unix://{sock}"
        deadline = time.monotonic() + 90
        while sh(["docker", "-H", host, "info", "--format", "{{.ServerVersion}}"]).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the second dockerd did not start:\n" + (root / "dockerd.log").read_text()[-3000:])
            time.sleep(0.5)
        config = root / "docker-config"
        config.mkdir()
        env = {"DOCKER_CONFIG": str(config)}
        context = f"bld2-{tag}"
        sh(["docker", "context", "create", context, "--docker", f"host={host}"], env={**os.environ, **env}, check=True)
        save = subprocess.Popen(["docker", "save", local_bases["cuda_devel"], local_bases["cuda_base"]],
                                stdout=subprocess.PIPE)
        load = sh(["docker", "-H", host, "load"], stdin=save.stdout)
        save.wait()
        assert load.returncode == 0, load.stderr
        yield Engine(context, host, env)
    finally:
        if proc is not None:
            stop_process(proc, 60)
        sh(["umount", "-R", str(root / "data")])
        for rule in rules:
            iptables("-D", rule)
        sh(["ip", "link", "del", bridge])
        shutil.rmtree(root, ignore_errors=True)


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
