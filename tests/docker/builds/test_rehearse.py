"""`builder rehearse` on the fixture package: its real CUDA kernel (csrc/saxpy.cu) captured from its own build

The Docker half of tests/unit/builds/test_rehearse.py: its docstring says the rest."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def fixture_copy(tmp_path: Path, engines_edit=None, source_edit=None) -> Path:
    """The fixture's matrix, engine data and package in tmp_path, optionally edited."""
    root = tmp_path / "fx"
    shutil.copytree(FIXTURE / "pkg", root / "pkg")
    shutil.copy(FIXTURE / "matrix.toml", root / "matrix.toml")
    engines = (FIXTURE / "engines.toml").read_text()
    (root / "engines.toml").write_text(engines_edit(engines) if engines_edit else engines)
    if source_edit:
        cu = root / "pkg" / "csrc" / "saxpy.cu"
        cu.write_text(source_edit(cu.read_text()))
    return root / "matrix.toml"


def rehearse_cli(matrix: Path, tmp_path: Path, *extra: str):
    # the CA bundle as every build test passes it: behind a TLS-intercepting proxy the build stage's pip needs it
    # whenever BuildKit has no cached toolchain stage (a fresh machine)
    return run_cli("rehearse", "--matrix", str(matrix), "--work-dir", str(tmp_path / "work"),
                   "--log-dir", str(tmp_path / "logs"), "--wheelhouse", str(tmp_path / "wh"),
                   "--ca-bundle", str(HOST_CA), *extra)


def _images(prefix: str = "builder-rehearse") -> set[str]:
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
    return {ln for ln in out.stdout.splitlines() if ln.startswith(prefix)}


def test_the_fixture_kernel_is_compiled_measured_audited_and_projected(local_bases, docker_engine, tmp_path):
    before = _images()
    res = rehearse_cli(FIXTURE / "matrix.toml", tmp_path, "--json")
    assert res.exit_code == 0, res.output
    (pkg,) = json.loads(res.stdout)
    assert (pkg["package"], pkg["gcc"].split(".")[:2]) == ("cuda-ext", ["12", "2"])  # bookworm's gcc, run there
    (unit,) = pkg["units"]
    # its own command from its setup.py: the one saxpy.cu compile (the link is no translation unit)
    assert unit["source"].endswith("/csrc/saxpy.cu") and unit["binary"] == "cuda-ext"
    assert unit["sass"] == ["sm_80", "sm_90"] and unit["kernel_arch_units"] == 2
    assert unit["returncode"] == 0 and 0.2 < unit["seconds"] < 300
    # nvcc's tree (cudafe++, cicc, ptxas) is tens of MiB at least; a sampler that saw nothing reads 0
    assert 30 <= unit["peak_mib"] < 4096, unit
    # the object's own fatbin holds exactly the plan's SASS
    assert unit["object_sass"] == unit["planned_sass"] == ["sm_80", "sm_90"] and unit["audit_ok"], unit
    assert unit["object_cache"] == {"hits": 0, "misses": unit["object_cache"]["misses"]}
    assert unit["object_cache"]["misses"] >= 1
    proj = pkg["projection"]
    assert proj["tus"] == 1 and proj["kernel_arch_units"] == 2
    assert proj["projected_seconds"] > 0 and proj["gb_per_nvcc_thread"] > 0
    # the measured memory per thread (well under the engine data's 1 GB) gives the host's cores as threads
    assert proj["chosen"]["max_jobs"] >= 1 and "GB per nvcc thread" in proj["chosen"]["why"]
    assert proj["today"]["gb_per_nvcc_thread"] == 1.0
    assert pkg["objects_to"] == "the build's local object cache"
    # measured cold every time: a second rehearsal compiles again (sccache recompiles and stores it again)
    again = rehearse_cli(FIXTURE / "matrix.toml", tmp_path, "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)[0]["units"][0]["object_cache"]["hits"] == 0
    assert _images() == before  # its images are removed


# slow: a rehearsal and a build; the default tier rehearses in
# test_the_fixture_kernel_is_compiled_measured_audited_and_projected
@pytest.mark.slow
def test_the_build_compiles_the_rehearsed_units_from_the_object_cache(local_bases, docker_engine, tmp_path,
                                                                       monkeypatch):
    # an object cache of this test only (BuildKit cache mount builder-sccache-<namespace>), empty before
    monkeypatch.setenv("BUILDER_SCCACHE_NAMESPACE", f"rehearse-{uuid.uuid4().hex[:12]}")
    res = rehearse_cli(FIXTURE / "matrix.toml", tmp_path, "--json")
    assert res.exit_code == 0, res.output
    (unit,) = json.loads(res.stdout)[0]["units"]
    steps = unit["object_cache"]["misses"]  # nvcc's steps sccache cached: cudafe++, cicc and ptxas per arch, ...
    built = subprocess.run([sys.executable, "-m", "builder.cli", "build", "--matrix", str(FIXTURE / "matrix.toml"),
                            "--wheelhouse", str(tmp_path / "wh"), "--work-dir", str(tmp_path / "bwork"),
                            "--log-dir", str(tmp_path / "blogs"), "--pins-dir", str(tmp_path / "pins"),
                            "--ca-bundle", str(HOST_CA), "--no-smoke",
                            "--quiet"], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # every cacheable step of the build's compile was a hit: the rehearsal's objects
    assert f"sccache {steps}/{steps} hits" in built.stdout, built.stdout


# slow: a second rehearsal; the default tier prints the table in
# test_the_fixture_kernel_is_compiled_measured_audited_and_projected
@pytest.mark.slow
def test_the_table_prints_the_unit_and_the_projection(local_bases, docker_engine, tmp_path, monkeypatch, caplog):
    """... and under `builder --debug` every docker command the rehearsal starts is logged, exactly as it runs."""
    started = []

    class Spy(subprocess.Popen):
        def __init__(self, args, *a, **kw):
            started.append(list(args) if isinstance(args, (list, tuple)) else [args])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    caplog.set_level(logging.DEBUG, logger="builder.commands")
    res = run_cli("--debug", "rehearse", "--matrix", str(FIXTURE / "matrix.toml"), "--work-dir", str(tmp_path / "work"),
                  "--log-dir", str(tmp_path / "logs"), "--wheelhouse", str(tmp_path / "wh"), "--ca-bundle", str(HOST_CA))
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.stdout.splitlines() if "saxpy.cu" in ln)
    assert "sm_80 sm_90" in row and "ok (sm_80 sm_90)" in row
    assert "projected compile on this host:" in res.stdout and "today's rule: 1 GB per nvcc thread" in res.stdout
    logged = {r.getMessage() for r in caplog.records if r.name == "builder.commands"}
    ran = [argv for argv in started if argv[0] == "docker"]
    assert [argv for argv in ran if f"$ {shlex.join(argv)}" not in logged] == []
    verbs = {" ".join(argv[1:3]) if argv[1] in ("buildx", "image") else argv[1] for argv in ran}
    assert {"buildx build", "run", "commit", "rm", "image rm"} <= verbs, verbs


def test_nvcc_killed_for_memory_names_its_peak_and_the_max_jobs_that_fits(local_bases, docker_engine, tmp_path):
    # a real kernel OOM kill: the unit's container may use 40 MiB, which nvcc's cicc exceeds
    res = rehearse_cli(FIXTURE / "matrix.toml", tmp_path, "--memory", "40m")
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert "nvcc was killed for memory compiling" in line and "saxpy.cu" in line and "limit 40 MiB" in line, line
    peak = re.search(r"reached (\d+) MiB \(peak of its resident memory\) at 1 nvcc thread\(s\)", line)
    assert peak and 10 <= int(peak.group(1)) <= 64, line  # it grew up to the limit (page cache counts there too)
    assert re.search(r"fits MAX_JOBS=\d+ NVCC_THREADS=1 \(\d+ nvcc threads by memory\)", line), line


def test_a_gcc_below_the_engines_floor_names_what_to_install(local_bases, docker_engine, tmp_path):
    matrix = fixture_copy(tmp_path, engines_edit=lambda t: t.replace(
        'min_cuda = "12.0"\narch_knobs = [{ env = "CUDA_EXT_ARCHS"', 'min_cuda = "12.0"\nmin_gcc = "13"\n'
        'arch_knobs = [{ env = "CUDA_EXT_ARCHS"', 1))
    assert 'min_gcc = "13"' in (matrix.parent / "engines.toml").read_text()
    res = rehearse_cli(matrix, tmp_path)
    assert res.exit_code == 2, res.output
    assert "cuda-ext 1.0.0 needs GCC >= 13 and the build stage's gcc is 12.2" in res.output, res.output
    assert "install gcc-13 g++-13" in res.output and 'os = "trixie"' in res.output


def test_a_missing_header_names_what_provides_it(local_bases, docker_engine, tmp_path):
    matrix = fixture_copy(tmp_path, source_edit=lambda t: "#include <cudnn.h>\n" + t)
    res = rehearse_cli(matrix, tmp_path)
    assert res.exit_code == 2, res.output
    assert "saxpy.cu includes cudnn.h, which the build stage lacks: install cuDNN's headers" in res.output, res.output


def test_a_unit_pattern_that_matches_nothing_is_refused(local_bases, docker_engine, tmp_path):
    res = rehearse_cli(FIXTURE / "matrix.toml", tmp_path, "--unit", "no_such_kernel.cu")
    assert res.exit_code == 2 and "--unit 'no_such_kernel.cu': no CUDA translation unit" in res.output, res.output


def test_units_compile_through_the_farm_the_matrix_names_as_the_build_would(local_bases, docker_engine, tmp_path,
                                                                           monkeypatch):
    """[defaults.cache] dist set, as for `builder build`: the fixture's unit compiles in its container through a real
    farm (scripts/farm: two sccache-dist servers in their own network namespaces), its nvcc steps on the servers;
    `--parallel 2` compiles the chosen units at once. The client configuration holds the farm's token: it is
    written for the rehearsal only and removed after it. Needs root and bubblewrap (scripts/setup-docker.sh)."""
    import tomllib

    from tests.helpers import farm

    if os.geteuid() != 0 or not shutil.which("bwrap"):
        pytest.fail("this test starts sccache-dist build servers (scripts/farm): root and bubblewrap")
    state = tmp_path / "farm"
    farm("start", "--servers", "2", "--cpus", "0.5", "--memory", "1g", "--gb-per-job", "0.29", "--state", str(state))
    try:
        url = json.loads(farm("status", "--state", str(state)).stdout)["scheduler_url"]
        token = tomllib.loads((state / "client.conf").read_text())["dist"]["auth"]["token"]
        monkeypatch.setenv("BUILDER_SCCACHE_DIST_TOKEN", token)
        matrix = fixture_copy(tmp_path)
        matrix.write_text(matrix.read_text() + f'\n[defaults.cache]\ndist = "{url}"\n')
        res = rehearse_cli(matrix, tmp_path, "--parallel", "2", "--json")
    finally:
        farm("stop", "--state", str(state), check=False)
    assert res.exit_code == 0, res.output
    (pkg,) = json.loads(res.stdout)
    assert pkg["compile"]["jobs"] == 2 and pkg["compile"]["dist"] == url and pkg["compile"]["wall_seconds"] > 0
    (unit,) = pkg["units"]
    assert unit["audit_ok"] and unit["object_sass"] == ["sm_80", "sm_90"], unit
    servers = unit["object_cache"].get("distributed") or {}
    subnet = url.split("//")[1].rsplit(".", 1)[0] + "."  # the farm's /24: its servers' addresses
    assert servers and all(s.startswith(subnet) for s in servers) and sum(servers.values()) >= 2, unit
    work = tmp_path / "work" / "rehearse"
    assert not list(work.rglob("sccache-dist.conf"))
    assert not [p for p in work.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
