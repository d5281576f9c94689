"""A second Docker engine beside the first (tests and benchmarks): a dockerd of its own — data root, exec root,
pidfile, socket, managed containerd — on **its own bridge** (never --bridge=none: on start-up that deletes the link
named docker0 and takes the first engine's network down), optionally with NAT for its builds and
cgroup v1 CPU and memory limits that stand for a machine's cores and RAM.

With limits, the dockerd process puts itself into its cgroups before it execs (so its containerd and shims inherit
them), and `--cgroup-parent` puts BuildKit's RUN containers below the same cgroups. Everything made is removed on
exit, also when the start fails: the engine's processes (all of its cgroups' pids), its mounts, its NAT rules, its
bridge, its cgroups and its directory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

PREFIX = Path(os.environ.get("BUILDER_DOCKER_PREFIX", "/opt/builder-docker"))
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Engine:
    host: str  # unix:///.../docker.sock
    root: Path  # its data, exec root, socket, log
    proc: subprocess.Popen
    cgroups: tuple[Path, ...] = ()  # its cpu and memory cgroups, when limited

    def kill(self) -> None:
        """SIGKILL its dockerd (a build host that dies): its builds lose their BuildKit at once."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def sh(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)


def _free_subnet() -> ipaddress.IPv4Network:
    used = sh(["ip", "-4", "-o", "addr"]).stdout + sh(["ip", "-4", "route"]).stdout
    for _ in range(100):
        second, third = random.randint(100, 250), random.randint(0, 255)
        if f"10.{second}.{third}." not in used:
            return ipaddress.ip_network(f"10.{second}.{third}.0/24")
    raise RuntimeError("no free 10.x.y.0/24 for the second engine's bridge")


def _nat_rules(bridge: str, net: ipaddress.IPv4Network) -> list[list[str]]:
    # its own NAT: the engine manages no iptables rules (those would fight the first engine's)
    return [["-t", "nat", "POSTROUTING", "-s", str(net), "!", "-o", bridge, "-j", "MASQUERADE"],
            ["FORWARD", "-i", bridge, "-j", "ACCEPT"],
            ["FORWARD", "-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]]


def _iptables(op: str, rule: list[str]) -> None:
    table = rule[:2] if rule[0] == "-t" else []
    chain = rule[len(table)]
    sh(["iptables", *table, op, chain, *rule[len(table) + 1:]], check=op != "-D")


def _cgroup_pids(cgroup: Path) -> list[int]:
    return [int(p) for d in [cgroup, *cgroup.rglob("*")] if (d / "cgroup.procs").is_file()
            for p in (d / "cgroup.procs").read_text().split()]


def _remove_cgroup(cgroup: Path) -> None:
    """Kill whatever is left in it (containerd, shims after a killed dockerd), then remove it, children first."""
    if not cgroup.exists():
        return
    for _ in range(50):
        pids = _cgroup_pids(cgroup)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for d in sorted([cgroup, *(p for p in cgroup.rglob("*") if p.is_dir())], key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def second_engine(root: Path | None = None, *, nat: bool = False, cpus: float | None = None,
                  memory_bytes: int | None = None) -> Iterator[Engine]:
    """Start a second dockerd (containerd image store) and yield it as an Engine. `nat`: its containers (a build's
    RUN steps) reach the network; `cpus` / `memory_bytes`: cgroup v1 limits
    of the whole engine (needs /sys/fs/cgroup/cpu and /sys/fs/cgroup/memory)."""
    dockerd = PREFIX / "bin" / "dockerd"
    if not dockerd.exists():
        raise RuntimeError(f"{dockerd} missing: run scripts/setup-docker.sh")
    own_root = root is None
    root = root or Path(tempfile.mkdtemp(prefix="bld2-", dir="/tmp"))  # short: a socket path has at most 107 bytes
    tag = uuid.uuid4().hex[:8]
    bridge, net = f"bld{tag}", _free_subnet()
    rules = _nat_rules(bridge, net) if nat else []
    cgroups: list[Path] = []
    proc = None
    sh(["ip", "link", "add", "name", bridge, "type", "bridge"])
    try:
        sh(["ip", "addr", "add", f"{next(net.hosts())}/{net.prefixlen}", "dev", bridge])
        sh(["ip", "link", "set", bridge, "up"])
        for rule in rules:
            _iptables("-I", rule)
        limits = []
        if cpus is not None:
            limits += [("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(cpus * 100000))})]
        if memory_bytes is not None:
            limits += [("memory", {"memory.limit_in_bytes": str(memory_bytes)})]
        for controller, values in limits:
            cgroup = CGROUP_ROOT / controller / f"builder-engine-{tag}"
            cgroup.mkdir()
            cgroups.append(cgroup)
            for name, value in values.items():
                (cgroup / name).write_text(value)
        procs = [str(c / "cgroup.procs") for c in cgroups]

        def enter_cgroups() -> None:  # in the child, before exec: dockerd, then its containerd, start inside them
            os.setsid()
            for path in procs:
                with open(path, "w") as fh:
                    fh.write(str(os.getpid()))

        (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}')
        host = f"unix://{root / 'docker.sock'}"
        argv = [str(dockerd), "--config-file", str(root / "daemon.json"), "--data-root", str(root / "data"),
                "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"), "-H", host,
                "--bridge", bridge, "--iptables=false", "--ip6tables=false"]
        if cgroups:
            argv += ["--cgroup-parent", f"/builder-engine-{tag}"]  # its containers, BuildKit's RUNs too, below it
        proc = subprocess.Popen(argv, stdout=(root / "dockerd.log").open("wb"), stderr=subprocess.STDOUT,
                                preexec_fn=enter_cgroups,
                                env={**os.environ, "PATH": f"{PREFIX / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
        deadline = time.monotonic() + 90
        while sh(["docker", "-H", host, "info"], check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the second dockerd did not start:\n" + (root / "dockerd.log").read_text()[-2000:])
            time.sleep(0.5)
        yield Engine(host, root, proc, cgroups=tuple(cgroups))
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for cgroup in cgroups:
            _remove_cgroup(cgroup)
        sh(["umount", "-R", str(root / "data")], check=False)
        for rule in rules:
            _iptables("-D", rule)
        sh(["ip", "link", "del", bridge], check=False)
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


def load_images(engine: Engine, *images: str) -> None:
    """Copy images from the first engine into this one (no registry: docker save | docker load)."""
    save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
    load = sh(["docker", "-H", engine.host, "load"], check=False, stdin=save.stdout)
    save.wait()
    if load.returncode != 0 or save.returncode != 0:
        raise RuntimeError(f"loading {', '.join(images)} into {engine.host} failed: {load.stderr.strip()}")
