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

import pytest

from builder import owner

from tests.helpers import REPO
from tests.support.owner import unused_pid


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
