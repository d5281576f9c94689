"""What a run killed outright leaves is cleaned (builder/owner.py): its children die with it (PR_SET_PDEATHSIG,

The Docker half of tests/unit/builds/test_owner.py: its docstring says the rest."""

from __future__ import annotations

import subprocess
import uuid

from builder import owner
from builder.image import labels

from tests.support.owner import unused_pid


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
