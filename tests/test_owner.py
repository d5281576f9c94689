"""What a run killed outright leaves is cleaned (builder/owner.py): its children die with it (PR_SET_PDEATHSIG,
shown on a real child of builder's docker.py runner and of the process launcher), and the names and containers it
left in the daemon carry an owner that a later run finds dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from builder import owner
from builder.image import labels

from .helpers import REPO


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 10) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("runner", ["docker.run", "docker.popen", "process-launcher"])
def test_a_child_dies_with_builder_killed_outright(tmp_path, runner):
    """builder's process SIGKILLed (no handler runs): the command it started is sent SIGTERM by the kernel."""
    pidfile = tmp_path / "child.pid"
    child = f"import os; open({str(pidfile)!r}, 'w').write(str(os.getpid())); import time; time.sleep(300)"
    starts = {
        "docker.run": f"from builder import docker; docker.run([{sys.executable!r}, '-c', {child!r}])",
        "docker.popen": f"from builder import docker; docker.popen([{sys.executable!r}, '-c', {child!r}]).wait()",
        "process-launcher": textwrap.dedent(f"""
            import subprocess
            from builder.owner import die_with_parent
            subprocess.Popen([{sys.executable!r}, '-c', {child!r}], start_new_session=True,
                             preexec_fn=die_with_parent).wait()"""),
    }
    parent = subprocess.Popen([sys.executable, "-c", starts[runner]], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.1)
        pid = int(pidfile.read_text())
        assert _alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait_gone(pid), f"{runner}: the child {pid} outlived builder"
    finally:
        parent.kill()


def unused_pid() -> int:
    """A pid no process has now."""
    pid = int(open("/proc/sys/kernel/pid_max").read()) - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


@pytest.mark.pure
def test_owners_and_run_names():
    me = owner.owner()
    assert owner.alive(me)
    assert not owner.alive(f"{me.split('@')[0]}@otherboot")  # another boot: gone
    assert owner.alive("garbage")  # never removed on a guess
    assert not owner.alive(f"{unused_pid()}@{owner.boot_id()}")
    suffix = owner.run_suffix("0a1b2c3d")
    assert suffix.startswith("run-0a1b2c3d-p") and owner.run_suffix_owner(f"1.0-cu130-{suffix}") == me
    assert owner.run_suffix_owner("1.0-cu130-run-0a1b2c3d") is None  # an older run name records no owner


def test_the_next_run_drops_what_a_killed_run_left(local_bases, docker_engine, tmp_path):
    """A run name and a smoke container whose owner is gone are removed by the next run's image step and smoke
    launcher; those of a live owner (this test process) are kept."""
    from types import SimpleNamespace

    from builder.deploy.runtime.engine import DockerLauncher
    from builder.steps.image import drop_orphaned_run_names

    dead = unused_pid()
    gone = f"{dead}@{owner.boot_id()}"
    image = f"127.0.0.1:5000/builder-test-own{uuid.uuid4().hex[:8]}/x"
    orphan_tag = f"1.0-run-0a1b2c3d-p{dead}b{owner.boot_id()}"
    live_tag = f"1.0-{owner.run_suffix('4e5f6a7b')}"
    names = [f"{image}:1.0", f"{image}:{orphan_tag}", f"{image}:{live_tag}"]
    for n in names:
        subprocess.run(["docker", "tag", local_bases["debian"], n], check=True)
    said: list[str] = []
    ctx = SimpleNamespace(cell=SimpleNamespace(image=image, tag="1.0"), opts=SimpleNamespace(docker="docker"),
                          note=said.append)
    containers = {}
    try:
        drop_orphaned_run_names(ctx)
        tags = subprocess.run(["docker", "image", "ls", "--format", "{{.Tag}}", image], capture_output=True,
                              text=True, check=True).stdout.split()
        assert sorted(tags) == sorted(["1.0", live_tag]), tags
        assert said == [f"dropped {image}:{orphan_tag}, left by a run that was killed (pid {gone})"]
        for who, spec in (("orphan", gone), ("live", owner.owner())):
            name = f"builder-smoke-own{uuid.uuid4().hex[:8]}"
            subprocess.run(["docker", "create", "--name", name, "--label", "io.builder.smoke=1", "--label",
                            f"{labels.OWNER}={spec}", local_bases["debian"], "true"], check=True,
                           capture_output=True)
            containers[who] = name
        DockerLauncher(local_bases["debian"]).close()  # a smoke run's launcher: it reaps as it starts
        left = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                              check=True).stdout.split()
        assert containers["orphan"] not in left and containers["live"] in left
    finally:
        for n in names:
            subprocess.run(["docker", "image", "rm", n], capture_output=True)
        for name in containers.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
