"""scripts/farm for real: sccache-dist's scheduler and build servers, each server in its own network namespace and
cgroups, nvcc's steps compiled on them through an sccache client; admission by RAM (a server whose memory holds
no job is not started, the others take its work; the memory cgroups' OOM counters); and nothing left behind after
a stop or a SIGKILL of `start` half-way. Needs root, bubblewrap, sccache 0.16 and nvcc (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import FARM, REPO, farm
from tests.helpers import SCCACHE_BIN as BIN

sys.path.insert(0, str(REPO / "benchmarks"))
from compile_cache import kernel_source  # noqa: E402



@pytest.fixture(autouse=True)
def needs_root_and_bwrap():
    if os.geteuid() != 0 or not shutil.which("bwrap") or not (BIN / "sccache-dist").is_file():
        pytest.fail("these tests start sccache-dist build servers: root, bubblewrap (scripts/setup-docker.sh installs "
                    "it) and sccache==0.16.0 in the test environment")


def leftovers(state: Path, farm_id: str | None = None) -> list[str]:
    """What a farm at `state` could leave: its state dir, netns, links, cgroups, data dir, processes."""
    farm_id = farm_id or json.loads((state / "state.json").read_text())["id"]
    out = [str(state)] if state.exists() else []
    out += [n for n in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout.split()
            if farm_id in n]
    out += [n for n in os.listdir("/sys/class/net") if farm_id in n]
    out += [str(p) for p in Path("/sys/fs/cgroup").glob("*/**/builder-farm-" + farm_id)]
    out += [str(p) for p in Path("/var/tmp").glob(f"builder-farm-{farm_id}")]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(state) in cmd and "sccache" in cmd:
            out.append(f"process {pid}: {cmd}")
    return out


def compile_through(state: Path, work: Path, nvcc: Path, sources: int, instances: int = 1, unroll: int = 8,
                    jobs: int = 4) -> tuple[list[int], dict]:
    """`sources` CUDA units (sm_80 + sm_90) through an sccache client of the farm: exit codes, sccache's stats."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SCCACHE_CONF": str(state / "client.conf"), "SCCACHE_DIR": str(work / "cache"),
           "SCCACHE_SERVER_UDS": str(work / "sccache.sock"), "SCCACHE_IDLE_TIMEOUT": "0",
           "SCCACHE_DIST_CLIENT_CACHE": str(work / "toolchains")}
    files = []
    for i in range(sources):
        src = work / f"k{i}.cu"
        src.write_text(kernel_source(i, instances, unroll=unroll) + f"// {work.name} {time.time()}\n")
        files.append(src)
    subprocess.run([str(BIN / "sccache"), "--start-server"], env=env, check=True, capture_output=True)
    try:
        def one(src: Path) -> int:
            return subprocess.run([str(BIN / "sccache"), str(nvcc), "-O2", "-c", "-o", str(src.with_suffix(".o")),
                                   "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                                   str(src)], env=env, capture_output=True).returncode

        with ThreadPoolExecutor(jobs) as pool:
            codes = list(pool.map(one, files))
        stats = json.loads(subprocess.run([str(BIN / "sccache"), "--show-stats", "--stats-format=json"], env=env,
                                          check=True, capture_output=True, text=True).stdout)["stats"]
    finally:
        subprocess.run([str(BIN / "sccache"), "--stop-server"], env=env, capture_output=True)
    return codes, stats


def test_three_servers_in_their_own_namespaces_and_cgroups_compile_nvcc_steps_and_stop_leaves_nothing(tmp_path, nvcc):
    state = tmp_path / "farm"
    started = farm("start", "--servers", "3", "--cpus", "0.5", "--memory", "1g", "--gb-per-job", "0.29",
                   "--state", str(state))
    farm_id = json.loads((state / "state.json").read_text())["id"]
    try:
        assert started.stdout.strip().startswith("http://10.213.")
        st = json.loads(farm("status", "--state", str(state)).stdout)
        assert st["running"] and st["dist_status"]["num_servers"] == 3 and st["dist_status"]["num_cpus"] == 3
        assert st["toolchain_gb"] == 0.3  # held back from each server's memory before jobs are counted
        namespaces = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
        root_listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
        assert ":10501" not in root_listening  # no server listens in the root namespace
        assert st["scheduler_url"].removeprefix("http://") in root_listening
        for srv in st["servers"]:
            # 1 GiB x 0.9 - 0.3 GB of toolchain holds 2 jobs of 0.29 GB: the server sees 1 CPU, on which sccache-dist runs 2 jobs at once
            assert srv["netns"] in namespaces and srv["alive"] and (srv["cores_seen"], srv["slots"]) == (1, 2)
            inside = subprocess.run(["ip", "netns", "exec", srv["netns"], "ss", "-Hltn"], capture_output=True,
                                    text=True).stdout
            assert inside.split()[3] == srv["public_addr"], inside
            cg = {k: Path(v) for k, v in srv["cgroups"].items()}
            assert (cg["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert int((cg["memory"] / "memory.limit_in_bytes").read_text()) == 1 << 30
            assert str(srv["pid"]) in (cg["memory"] / "cgroup.procs").read_text().split()
        assert oct((state / "client.conf").stat().st_mode & 0o777) == "0o600"
        token = (state / "client.conf").read_text().split('token = "')[1][:48]
        assert token not in started.stdout + started.stderr + json.dumps(st)

        codes, stats = compile_through(state, tmp_path / "work", nvcc, sources=6)
        assert codes == [0] * 6
        per_server = stats.get("dist_compiles") or {}
        assert len([n for n in per_server.values() if n > 0]) >= 2, stats
        assert set(per_server) <= {s["public_addr"] for s in st["servers"]}
    finally:
        farm("stop", "--state", str(state))
    assert leftovers(state, farm_id) == []


def test_a_server_whose_memory_holds_fewer_than_two_jobs_is_not_started_and_the_others_take_its_work(tmp_path, nvcc):
    state = tmp_path / "farm"
    started = farm("start", "--servers", "3", "--cpus", "0.5", "--memory", "1g,1g,700m", "--gb-per-job", "0.29",
                   "--state", str(state))
    farm_id = json.loads((state / "state.json").read_text())["id"]
    try:
        assert ("server2: 0.68 GiB x 0.9 - 0.3 GB toolchain holds 1 job(s) of 0.29 GB (--gb-per-job), fewer than the 2 "
                "sccache-dist runs "
                "on a 1-CPU server: not started") in started.stderr
        st = json.loads(farm("status", "--state", str(state)).stdout)
        assert [s["name"] for s in st["servers"]] == ["server0", "server1"]
        assert [s["name"] for s in st["not_started"]] == ["server2"] and st["dist_status"]["num_servers"] == 2
        codes, stats = compile_through(state, tmp_path / "work", nvcc, sources=4)
        assert codes == [0] * 4 and set(stats["dist_compiles"]) <= {s["public_addr"] for s in st["servers"]}
        assert sum(stats["dist_compiles"].values()) > 0
    finally:
        farm("stop", "--state", str(state))
    assert leftovers(state, farm_id) == []
    refused = farm("start", "--servers", "2", "--cpus", "1", "--memory", "256m", "--gb-per-job", "0.29",
                   "--state", str(state), check=False)
    assert refused.returncode == 2 and "no server's memory holds the 2 jobs of 0.29 GB" in refused.stderr
    assert not state.exists()


@pytest.mark.slow  # two farms and about 70 s of compiles on 2 cores
def test_slots_by_ram_keep_the_oom_counter_at_zero_and_over_admission_is_killed(tmp_path, nvcc):
    """One server of 2 CPUs' quota. Admitted by RAM (1400 MiB x 0.9 less the 0.3 GB toolchain, 0.45 GB per job: 2
    jobs, so it sees 1 CPU, on which sccache-dist runs 2 jobs at once) the heavier units compile on it two at a time,
    the rest locally, and its memory cgroup records no OOM kill. Over-admitted (320 MiB, 0.14 GB per job and no
    toolchain term: 2 jobs) the same units meet the limit: the cgroup's oom_kill counter rises (and sccache reports
    the killed job as a failed compile, not a local fallback: what admission by RAM prevents)."""
    results = {}
    for key, memory, gb, toolchain in (("admitted", "1400m", "0.45", "0.3"), ("over", "320m", "0.14", "0")):
        state = tmp_path / key
        farm("start", "--servers", "1", "--cpus", "2", "--memory", memory, "--gb-per-job", gb, "--toolchain-gb",
             toolchain, "--state", str(state))
        try:
            codes, stats = compile_through(state, tmp_path / f"work-{key}", nvcc, sources=4, instances=40, unroll=32)
            st = json.loads(farm("status", "--state", str(state)).stdout)
            results[key] = (st["servers"][0]["slots"], st["servers"][0]["counters"], codes, stats["dist_compiles"])
        finally:
            farm("stop", "--state", str(state))
    slots, counters, codes, dist = results["admitted"]
    assert slots == 2 and counters["oom_kill"] == 0 and codes == [0] * 4 and sum(dist.values()) > 0, results
    slots, counters, codes, dist = results["over"]
    assert slots == 2 and counters["oom_kill"] >= 1, results


def test_a_start_killed_half_way_is_cleaned_by_stop_and_by_the_next_start(tmp_path):
    state = tmp_path / "farm"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for then in ("stop", "start"):
        proc = subprocess.Popen([sys.executable, str(FARM), "start", "--servers", "3", "--cpus", "0.5", "--memory",
                                 "1g", "--gb-per-job", "0.29", "--state", str(state)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # kill it once a server's namespace is made (bridge and scheduler before)
            try:
                made = json.loads((state / "state.json").read_text())["made"]
            except (OSError, ValueError, KeyError):
                made = []
            if any(m["kind"] == "netns" for m in made):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        farm_id = json.loads((state / "state.json").read_text())["id"]
        assert leftovers(state, farm_id), "the kill came too late: nothing half-made to clean"
        if then == "stop":
            farm("stop", "--state", str(state))
        else:
            again = farm("start", "--servers", "1", "--cpus", "0.5", "--memory", "1g", "--gb-per-job", "0.29",
                         "--state", str(state))
            assert "removed what an earlier farm left" in again.stderr
            refused = farm("start", "--servers", "1", "--cpus", "0.5", "--memory", "1g", "--gb-per-job", "0.29",
                           "--state", str(state), check=False)
            assert refused.returncode == 2 and "a farm already runs at" in refused.stderr
            farm("stop", "--state", str(state))
        assert leftovers(state, farm_id) == []


def test_not_root_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, str(FARM),
                           "start", "--servers", "1", "--cpus", "1", "--memory", "1g", "--gb-per-job", "0.29",
                           "--state", str(tmp_path / "farm")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and proc.stderr.strip() == ("farm: error: must run as root (network namespaces, "
                                                            "cgroups, and sccache-dist's build servers need it)")


def test_the_recorded_vllm_units_ran_through_farms_of_one_to_three_within_memory():
    """vLLM 0.33.0's units of the rehearsal sample (two light, its 8.4 GB-per-thread CUTLASS sm90 GEMM) compiled
    through farms of 1, 2 and 3 servers by benchmarks/farm_units.py --sdist vllm (docs/evidence/2026-12-06-farm-
    vllm-units.md), read back: every object audited for its archs, no server over its limit or OOM-killed by its own
    cgroup's counters, the heavy unit's steps on a server where one had room, and the rerun taken from the cache.
    Before it, a farm of 10 GiB servers was refused: one 8.5 GB job is not the two a 1-CPU server runs."""
    rec = json.loads((REPO / "tests/fixtures/farm/2026-12-06-vllm-units.json").read_text())
    assert rec["package"] == "vllm" and "scaled_mm_sm90_fp8.cu" in rec["units_chosen"]
    runs = {(r["servers"], r["recache"]): r for r in rec["runs"]}
    assert set(runs) == {(1, True), (2, True), (3, True), (3, False)}
    for r in rec["runs"]:
        assert r["ok"] and all(u["returncode"] == 0 and u["audit"].startswith("ok") for u in r["units"])
        for s in r["servers_memory"]:
            assert s["oom_kills"] == 0 and s["failcnt"] == 0 and s["peak_gib"] <= s["limit_gib"]
    heavy = {k: next(u for u in r["units"] if u["source"] == "scaled_mm_sm90_fp8.cu") for k, r in runs.items()}
    assert heavy[(1, True)]["client_peak_mib"] > 8000  # one server, full of light steps: the GEMM's cicc ran here
    for k in ((2, True), (3, True)):  # with room, on a server: its peak there, not at the client
        assert heavy[k]["client_peak_mib"] < 1000 and max(s["peak_gib"] for s in runs[k]["servers_memory"]) > 8
        assert len(runs[k]["per_server_steps"]) == k[0]  # every server took steps
    again = runs[(3, False)]
    assert again["steps_hit"] >= 13 and again["wall_seconds"] * 4 < runs[(3, True)]["wall_seconds"]
    refused = (REPO / "tests/fixtures/farm/2026-12-06-vllm-units-10g-refused.err").read_text()
    assert "holds 1 job(s) of 8.5 GB" in refused and "nothing to start" in refused
