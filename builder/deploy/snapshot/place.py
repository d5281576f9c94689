"""Where the engine runs while it is snapshotted or restored: a container (docker) or this host (process). Both run
a command there (`run`), start the engine detached in its own session with its output in a log file (`spawn`), and
end whatever they started (`close`)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from dataclasses import dataclass, field

from ... import docker as docker_mod
from ...errors import UserError

# What CRIU needs of a container, checked on kernel 6.18 with CRIU 4.1.1 (tests/docker/deploy/test_snapshot.py):
# SYS_ADMIN and CHECKPOINT_RESTORE (namespaces, /proc/PID/map_files, set_tid), SYS_PTRACE (seizing the tree),
# NET_ADMIN (TCP repair mode for the sockets), SYS_TIME (a restore writes the time namespace's clock offsets),
# and no seccomp or AppArmor filter (ptrace, process_vm, clone3 with set_tid). Less fails: without SYS_TIME the
# restore stops at "timens: Unable to set a monotonic clock offset: Operation not permitted".
CAPS = ("SYS_ADMIN", "CHECKPOINT_RESTORE", "SYS_PTRACE", "NET_ADMIN", "SYS_TIME")
SECURITY = ("seccomp=unconfined", "apparmor=unconfined")
MOUNT = "/snapshot"  # the snapshot directory, in the container
# children that end at once until one's pid is at least argv[1] (or the pids wrapped: then they are all free again)
PAST_PY = ("import os,sys\n"
           "n=int(sys.argv[1])\n"
           "for _ in range(1<<22):\n"
           " p=os.fork()\n"
           " if p==0: os._exit(0)\n"
           " os.waitpid(p,0)\n"
           " if p>=n or p<os.getpid(): break\n")


@dataclass
class Container:
    image: str
    directory: str  # this host's snapshot directory, mounted at MOUNT
    port: int  # the engine's port, published on 127.0.0.1:host_port
    host_port: int
    cid: str = ""
    local: bool = False

    @property
    def where(self) -> str:
        return f"in a container of {self.image}"

    def start(self) -> "Container":
        argv = ["docker", "run", "-d", "--init", "--label", "io.builder.snapshot=1",
                *(f"--cap-add={c}" for c in CAPS), *(f"--security-opt={s}" for s in SECURITY),
                "-p", f"127.0.0.1:{self.host_port}:{self.port}", "-v", f"{os.path.abspath(self.directory)}:{MOUNT}",
                "--entrypoint", "sleep", self.image, "infinity"]
        proc = docker_mod.run(argv, timeout=120, check=False)
        if proc.returncode != 0:
            raise UserError(f"{self.image}: the container did not start: {proc.stderr.strip()[-300:]}")
        self.cid = proc.stdout.strip()
        return self

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        proc = docker_mod.run(["docker", "exec", self.cid, *argv], timeout=timeout, check=False)
        return proc.returncode, proc.stdout + proc.stderr

    def spawn(self, argv: list[str], env: dict[str, str], log: str) -> int:
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        code, out = self.run(["sh", "-c", f"{'env ' + line if line else ''} setsid {shlex.join(argv)} </dev/null "
                                          f">{shlex.quote(log)} 2>&1 & echo $!"], timeout=60)
        if code != 0 or not out.strip().isdigit():
            raise UserError(f"the engine did not start {self.where}: {out.strip()[-300:]}")
        return int(out.strip())

    def alive(self, pid: int) -> bool:
        return self.run(["sh", "-c", f"kill -0 {pid}"], timeout=30)[0] == 0

    def inside(self, directory) -> str:
        """The snapshot directory as the container sees it (mounted there)."""
        return MOUNT

    def restore(self, argv: list[str], above: int = 0) -> tuple[int, str]:
        """CRIU's restore in this container: a fresh PID namespace, whose own processes (its init, `sleep`) have the
        pids they had in the take's container. CRIU gives each restored process and thread its id back, so no process
        of this container may hold one of them: the criu process (a `docker exec`: the next free pid) did, and the
        restore stopped at "Can't fork for 21: File exists" (the stand-in's resource tracker). So pids are used up
        first (short-lived children) until the next one is past the tree's highest id, `above`: criu and its helpers
        are numbered above the tree. (/proc/sys/kernel/ns_last_pid is read-only in a container.)"""
        if above:
            rc, out = self.run(["python3", "-c", PAST_PY, str(above)], timeout=120)
            if rc != 0:
                return rc, f"cannot move the container's pids past the snapshot's {above}: {out.strip()[-200:]}"
        return self.run(argv, timeout=1800)

    def close(self) -> None:
        if self.cid:
            docker_mod.remove_container(self.cid)
            self.cid = ""


@dataclass
class Process:
    """This host (a GPU host without Docker): commands run here; a restore runs in a new PID namespace whose init
    (`unshare --pid --fork --mount-proc`) keeps it, and ending that init ends everything restored in it."""

    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    local: bool = True
    started: list = field(default_factory=list)
    ns_init: int = 0  # after a restore: the init of its PID namespace, where later commands run (nsenter)

    where = "on this host"

    @property
    def host_port(self) -> int:
        return self.port

    def run(self, argv: list[str], timeout: float = 600) -> tuple[int, str]:
        if self.ns_init:
            argv = ["nsenter", "-t", str(self.ns_init), "-p", "-m", *argv]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env})
        except FileNotFoundError:
            return 127, f"{argv[0]}: not found"
        return proc.returncode, proc.stdout + proc.stderr

    def spawn(self, argv: list[str], env: dict[str, str], log: str) -> int:
        out = open(log, "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **self.env, **env}, start_new_session=True)
        self.started.append(proc)
        return proc.pid

    def inside(self, directory) -> str:
        """The snapshot directory as this host sees it."""
        return str(Path(directory).resolve())

    def alive(self, pid: int) -> bool:
        """Whether the engine started here still runs (an ended child is a zombie until reaped: kill -0 would
        still find it)."""
        return any(p.pid == pid and p.poll() is None for p in self.started)

    def restore(self, argv: list[str], above: int = 0) -> tuple[int, str]:
        """CRIU's restore in a new PID namespace (and a mount namespace with its own /proc); its init stays (a
        shell, then `sleep infinity`) and holds what was restored: close() ends it, and the namespace with it.
        `above` is not needed here: before the restore the namespace holds its init (pid 1) and criu (pid 2), no id
        of a tree taken on a host."""
        import time

        line = f"{shlex.join(argv)} && exec sleep infinity"
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", line],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.started.append(proc)
        pidfile = argv[argv.index("--pidfile") + 1]
        while not os.path.exists(pidfile):
            if proc.poll() is not None:
                return proc.returncode or 1, proc.stdout.read()
            time.sleep(0.05)
        kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        self.ns_init = int(kids[0]) if kids else proc.pid  # unshare --fork: its child is the namespace's init
        return 0, ""

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.started.clear()
