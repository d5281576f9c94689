"""The object cache's configuration: [defaults.cache] compile / dist parsed (bad values exit 2), the secret files
builder writes for BuildKit, what the compile RUN gets (sealed without a shared backend, the host's network with
one), and the figures read from sccache's own JSON. The shared backend itself is exercised for real in
tests/docker/builds/test_multihost.py (Redis via testcontainers, two engines) and benchmarks/compile_cache.py."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from builder import compile_cache as cc
from builder import matrix as M
from builder import plan as P
from builder import render as R
from builder import resolve
from builder.errors import UserError

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

# `sccache --show-stats --stats-format=json` of sccache 0.16.0 after nvcc compiled one .cu for sm_80 + sm_90 and
# then for sm_80 + sm_90 + sm_100 (recorded on this project's build host)
STATS = json.loads('{"stats":{"compile_requests":2,"requests_unsupported_compiler":0,"requests_not_compile":0,'
                   '"requests_not_cacheable":0,"requests_executed":16,"cache_errors":{"counts":{},"adv_counts":{}},'
                   '"cache_hits":{"counts":{"CUBIN":2,"CUDA (Device code)":1,"PTX":2},"adv_counts":{"ptx [cicc]":2,'
                   '"cuda [cudafe++]":1,"cubin [ptxas]":2}},"cache_misses":{"counts":{"CUDA":2,"CUDA (Device code)":1,'
                   '"PTX":3,"CUBIN":3},"adv_counts":{"cuda [cudafe++]":1,"cuda [nvcc]":2,"ptx [cicc]":3,'
                   '"cubin [ptxas]":3}},"cache_timeouts":0,"cache_read_errors":0,"non_cacheable_compilations":2,'
                   '"forced_recaches":0,"cache_write_errors":0,"cache_writes":9,"cache_write_duration":{"secs":0,'
                   '"nanos":1939519},"cache_read_hit_duration":{"secs":0,"nanos":321183},"compilations":11,'
                   '"compiler_write_duration":{"secs":5,"nanos":747294673},"compile_fails":0,"not_cached":{},'
                   '"dist_compiles":{},"dist_errors":0,"multi_level":null},"cache_location":"Local disk: \\"/c\\"",'
                   '"cache_size":180325,"max_cache_size":10737418240,"use_preprocessor_cache_mode":true,'
                   '"version":"0.16.0","basedirs":[]}')


@pytest.mark.pure
@pytest.mark.parametrize("url, kind, env", [
    ("redis://127.0.0.1:6379", "redis", {"SCCACHE_REDIS_ENDPOINT": "redis://127.0.0.1:6379"}),
    ("redis://cache:6379/3", "redis", {"SCCACHE_REDIS_ENDPOINT": "redis://cache:6379", "SCCACHE_REDIS_DB": "3"}),
    ("memcached://cache:11211", "memcached", {"SCCACHE_MEMCACHED_ENDPOINT": "tcp://cache:11211"}),
    ("webdav+https://dav.example/sccache/", "webdav", {"SCCACHE_WEBDAV_ENDPOINT": "https://dav.example/sccache/"}),
    ("s3://bucket/objects", "s3", {"SCCACHE_BUCKET": "bucket", "SCCACHE_S3_KEY_PREFIX": "objects"}),
])
def test_each_backend_becomes_sccache_settings_behind_the_local_disk(url, kind, env):
    c = cc.parse(url, "defaults.cache.compile")
    assert c.kind == kind
    assert c.settings() == {"SCCACHE_MULTILEVEL_CHAIN": f"disk,{kind}", **env}


@pytest.mark.pure
@pytest.mark.parametrize("value, says", [
    ("ftp://cache", "unknown backend 'ftp'"),
    ("redis://user:secret@cache:6379", "no credentials in the URL"),
    ("redis://cache:99999", "port"),
    ("redis://cache:6379/db", "database number"),
    ("redis://", "names no host"),
    (42, "expected a URL string"),
    ("redis://cache:6379?x=1", "no ?query"),
])
def test_a_bad_compile_backend_is_refused_naming_it(value, says):
    with pytest.raises(UserError, match="defaults.cache.compile") as err:
        cc.parse(value, "defaults.cache.compile")
    assert says in str(err.value)


def test_a_bad_backend_in_matrix_toml_is_exit_2_before_anything_runs(tmp_path):
    shutil_copy(tmp_path)
    (tmp_path / "matrix.toml").write_text((tmp_path / "matrix.toml").read_text()
                                          + '\n[defaults.cache]\ncompile = "redis://u:pw@cache:6379"\n')
    res = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--matrix", str(tmp_path / "matrix.toml")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "defaults.cache.compile" in res.stderr and "pw" not in res.stderr


def shutil_copy(tmp: Path) -> None:
    import shutil

    shutil.copytree(FIXTURE, tmp, dirs_exist_ok=True)


def test_the_secret_file_holds_settings_and_credentials_readable_by_its_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_COMPILE_CACHE_PASSWORD", "p'w \"$x")
    path = cc.parse("redis://127.0.0.1:6379", "x").write_secret(tmp_path / "s" / "sccache.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # the RUN sources it with `set -a; . FILE`: the shell must read back exactly what was written
    out = subprocess.run(["sh", "-c", f'set -a; . "{path}"; printf %s "$SCCACHE_REDIS_PASSWORD"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == "p'w \"$x"
    monkeypatch.setenv("BUILDER_COMPILE_CACHE_USER", "bob")
    monkeypatch.delenv("BUILDER_COMPILE_CACHE_PASSWORD")
    with pytest.raises(UserError, match="BUILDER_COMPILE_CACHE_PASSWORD"):
        cc.parse("webdav+http://dav:8080/", "x").credentials()


@pytest.mark.pure
def test_dist_needs_a_scheduler_url_and_writes_a_token_config(tmp_path, monkeypatch):
    assert cc.parse_dist("http://scheduler:10600", "d") == "http://scheduler:10600"
    for bad in ("scheduler:10600", "http://scheduler:10600/api", "http://tok@scheduler:10600"):
        with pytest.raises(UserError, match="d:"):
            cc.parse_dist(bad, "d")
    monkeypatch.delenv("BUILDER_SCCACHE_DIST_TOKEN", raising=False)
    with pytest.raises(UserError, match="BUILDER_SCCACHE_DIST_TOKEN"):
        cc.write_dist_config("http://scheduler:10600", tmp_path / "c.toml")
    monkeypatch.setenv("BUILDER_SCCACHE_DIST_TOKEN", "t0k")
    import tomllib

    conf = tomllib.loads(cc.write_dist_config("http://scheduler:10600", tmp_path / "c.toml").read_text())
    assert conf["dist"]["scheduler_url"] == "http://scheduler:10600" and conf["dist"]["auth"]["token"] == "t0k"


@pytest.mark.pure
def test_stats_give_hits_misses_per_step_and_compiler_seconds():
    s = cc.summarize(STATS)
    assert (s["hits"], s["misses"]) == (5, 9)
    assert s["hits_by_step"] == {"ptx [cicc]": 2, "cuda [cudafe++]": 1, "cubin [ptxas]": 2}
    assert s["compiler_seconds"] == 5.7 and s["hit_ratio"] == round(5 / 14, 4)
    assert cc.describe(s) == "sccache 5/14 hits"


def _fixture_plan():
    m = M.load(FIXTURE / "matrix.toml")
    (cell,) = resolve.select(m, M.Selection())
    return P.plan_cells([cell], None)[0]


@pytest.mark.pure
def test_the_compile_run_is_sealed_unless_a_shared_backend_is_configured():
    plan = _fixture_plan()
    sealed, shared = R.render(plan, "https://pypi.org/simple"), R.render(plan, "https://pypi.org/simple", True)
    run = "RUN {} --mount=type=cache,target=/root/.cache/sccache,id=builder-sccache-${{SCCACHE_NAMESPACE}}"
    assert run.format("--network=none") in sealed and "--network=host" not in sealed
    assert run.format("--network=host") in shared and "--network=none --mount=type=cache,target=/root/.cache/sccache" not in shared
    # where objects are kept is not part of the wheel's key
    assert P.cache_key(plan.cell, plan.cell.packages[0]) == plan.keys[plan.cell.packages[0].name]


def test_dry_run_hands_the_backend_over_as_a_secret_and_allows_the_host_network(tmp_path):
    shutil_copy(tmp_path)
    base = [sys.executable, "-m", "builder.cli", "build", "--matrix", str(tmp_path / "matrix.toml"),
            "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "w"), "--dry-run"]
    plain = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "id=sccache" not in plain.stdout and "network.host" not in plain.stdout
    (tmp_path / "matrix.toml").write_text((tmp_path / "matrix.toml").read_text()
                                          + '\n[defaults.cache]\ncompile = "redis://127.0.0.1:6379"\n')
    shared = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path)
    assert shared.returncode == 0, shared.stderr
    (wheel,) = [line for line in shared.stdout.splitlines() if "--target wheels-cuda-ext" in line]
    assert "--secret id=sccache,src=" in wheel and "--allow network.host" in wheel


@pytest.mark.pure
def test_plan_estimates_count_the_object_cache(tmp_path):
    """An earlier compile that hit is brought back to its cold time; a compile with the same inputs but one more
    arch is expected to hit the shared archs' steps (the estimate says so, as the prediction it is)."""
    from builder.cache import file_records
    from builder.cache.local import Wheelhouse
    from builder.estimate import estimate

    wh = Wheelhouse(tmp_path / "wh")
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    whl.write_bytes(b"x")
    inputs = {"format": 1, "package": "vllm", "source": "sdist:abc", "torch": "2.14.0", "built_archs": [80, 90],
              "knobs": [["TORCH_CUDA_ARCH_LIST", "8.0;9.0"]]}
    wh.store("vllm", "a" * 64, [whl], {
        "version": "0.33.0", "files": file_records([whl]), "audit": {"ok": True}, "built_by": {"at": "2026-11-20"},
        "key_inputs": inputs,
        "compile": {"seconds": 100.0, "objects": 10, "threads": 2, "archs": 2, "cores": 2,
                    "sccache": {"hits": 30, "misses": 10, "compiler_seconds": 40.0}}})
    # warm earlier compile: 100 s + 30 hits x 4 s per miss = 220 s cold; same threads and archs, other sources
    other = {**inputs, "source": "sdist:def"}
    e = estimate(wh, "vllm", "0.33.0", 2, 2, (80, 90), other)
    assert e.seconds == pytest.approx(220) and "(3m40s cold: 30 object cache hits)" in e.why
    # same inputs but for the archs, one more arch: sm_80 and sm_90 expected to hit, sm_100's third counted
    plus = {**inputs, "built_archs": [80, 90, 100], "knobs": [["TORCH_CUDA_ARCH_LIST", "8.0;9.0;10.0"]]}
    e = estimate(wh, "vllm", "0.33.0", 3, 2, (80, 90, 100), plus)
    assert e.seconds == pytest.approx(220 * 3 / 2 / 3) and "expects object cache hits for sm_80, sm_90" in e.why


def test_under_sccache_nvcc_objects_are_reproducible_without_objtemp_and_lost_with_it(nvcc, tmp_path):
    """Why with-sccache takes -objtemp out of NVCC_APPEND_FLAGS: with it, sccache 0.16's split of nvcc exits 0
    and leaves no object; without it, two cold compiles (fresh caches) give identical objects, which is what
    -objtemp is there for when nvcc runs alone (tests/docker/image/test_repro.py)."""
    import hashlib
    import os
    import shutil

    sccache = shutil.which("sccache") or str(Path(sys.executable).parent / "sccache")
    src = FIXTURE / "pkg" / "csrc" / "saxpy.cu"

    def cold_compile(name: str, flags: str | None) -> Path:
        d = tmp_path / name
        d.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "NVCC_APPEND_FLAGS"}
        env.update(SCCACHE_DIR=str(d / "cache"), SCCACHE_SERVER_UDS=str(d / "s.sock"), SCCACHE_IDLE_TIMEOUT="0")
        if flags:
            env["NVCC_APPEND_FLAGS"] = flags
        subprocess.run([sccache, "--start-server"], env=env, check=True, capture_output=True)
        try:
            (d / "obj").mkdir()
            subprocess.run([sccache, str(nvcc), "-O2", "-c", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
                            "-gencode", "arch=compute_90,code=sm_90", "-o", str(d / "obj" / "saxpy.o"), str(src)],
                           cwd=d, env=env, check=True, capture_output=True)
        finally:
            subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
        return d / "obj" / "saxpy.o"

    a, b = cold_compile("a", None), cold_compile("b", None)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert not cold_compile("objtemp", "-objtemp").exists()  # exit 0, no object: why with-sccache drops it


def test_plan_estimates_count_the_sccache_dist_servers_cores(tmp_path):
    """[defaults.cache] dist_cores: the compile spreads over the servers' cores besides the local threads; an
    earlier compile that was spread is counted with the cores it had. Said as the prediction it is."""
    from builder.cache import file_records
    from builder.cache.local import Wheelhouse
    from builder.estimate import estimate

    wh = Wheelhouse(tmp_path / "wh")
    whl = tmp_path / "demo-1.0-py3-none-any.whl"
    whl.write_bytes(b"x")
    inputs = {"format": 1, "package": "vllm", "source": "sdist:abc", "built_archs": [80, 90]}
    wh.store("vllm", "a" * 64, [whl], {
        "version": "0.33.0", "files": file_records([whl]), "audit": {"ok": True}, "built_by": {"at": "2026-11-20"},
        "key_inputs": inputs, "compile": {"seconds": 600.0, "objects": 10, "threads": 2, "archs": 2, "cores": 2}})
    local = estimate(wh, "vllm", "0.33.0", 2, 2, (80, 90), {**inputs, "source": "sdist:def"})
    spread = estimate(wh, "vllm", "0.33.0", 2, 2, (80, 90), {**inputs, "source": "sdist:def"}, dist_cores=30)
    assert local.seconds == pytest.approx(600) and spread.seconds == pytest.approx(600 * 2 / 32)
    assert "scaled to 2 threads and 30 server cores (sccache-dist; a prediction" in spread.why
    # an earlier compile that ran with 30 server cores took 60 s: 32 threads' worth, so 960 s on 2 local threads
    wh.store("vllm", "b" * 64, [whl], {
        "version": "0.33.0", "files": file_records([whl]), "audit": {"ok": True}, "built_by": {"at": "2026-11-21"},
        "key_inputs": inputs, "compile": {"seconds": 60.0, "objects": 10, "threads": 2, "archs": 2, "cores": 2,
                                          "compile_dist": "http://127.0.0.1:10600", "dist_cores": 30}})
    e = estimate(wh, "vllm", "0.33.0", 2, 2, (80, 90), {**inputs, "source": "sdist:def"})
    assert e.seconds == pytest.approx(60 * 32 / 2) and "with 2 nvcc threads and 30 sccache-dist server cores" in e.why


@pytest.mark.parametrize("table,message", [
    ('dist_cores = 8', "defaults.cache.dist_cores: says the cores of sccache-dist's build servers, but no dist scheduler is set"),
    ('dist = "http://127.0.0.1:10600"\ndist_cores = 0', "defaults.cache.dist_cores: expected the build servers' cores as a whole number from 1, got 0"),
    ('dist = "http://127.0.0.1:10600"\ndist_cores = true', "defaults.cache.dist_cores: expected an integer, got a boolean True"),
])
def test_bad_dist_cores_are_exit_2(tmp_path, table, message):
    from tests.helpers import run_cli, write_matrix

    path = write_matrix(tmp_path, (REPO / "matrix.toml").read_text().replace("[defaults.mirrors]",
                                                                            f"[defaults.cache]\n{table}\n\n[defaults.mirrors]"))
    res = run_cli("plan", "--matrix", str(path))
    assert res.exit_code == 2 and message in res.output, res.output


def test_plan_passes_the_servers_cores_to_its_estimates(tmp_path):
    """`builder plan` reads [defaults.cache] dist_cores and its estimate for vLLM says the servers' share."""
    import json

    from builder.cache import file_records
    from builder.cache.local import Wheelhouse

    from tests.helpers import run_cli, write_matrix

    path = write_matrix(tmp_path, (REPO / "matrix.toml").read_text().replace(
        "[defaults.mirrors]", '[defaults.cache]\ndist = "http://127.0.0.1:10600"\ndist_cores = 12\n\n[defaults.mirrors]'))
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl"
    whl.write_bytes(b"x")
    Wheelhouse(tmp_path / "wheelhouse").store("vllm", "c" * 64, [whl], {
        "version": "0.33.0", "files": file_records([whl]), "audit": {"ok": True}, "built_by": {"at": "2026-11-20"},
        "key_inputs": {}, "compile": {"seconds": 3600.0, "objects": 500, "threads": 4, "archs": 2, "cores": 4}})
    res = run_cli("plan", "--matrix", str(path), "--engine", "vllm", "--json")
    assert res.exit_code == 0, res.output
    (cell,) = json.loads(res.output[res.output.index("{"):])["cells"]
    vllm = next(p for p in cell["packages"] if p["name"] == "vllm")
    assert "and 12 server cores (sccache-dist; a prediction" in vllm["estimate"]["from"], vllm["estimate"]
