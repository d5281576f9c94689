"""The containers of a run outlive no builder: `python -m builder.deploy.runtime.watchdog LABEL`, started by the
docker launcher before its first container, in a session of its own (a Ctrl-C to builder's terminal does not reach
it), with a pipe from builder on its standard input. builder says `done` on it when it removed its containers
itself; a pipe that closes without that word means builder's process ended without cleaning up (SIGKILL, an OOM
kill): the watchdog then removes every container carrying LABEL, at once. The next run's reaping
(engine.DockerLauncher.reap_orphans) stays as the net under this one (a watchdog killed with builder's cgroup).
"""

from __future__ import annotations

import sys

DONE = "done"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or "=" not in argv[1]:
        print("usage: python -m builder.deploy.runtime.watchdog KEY=VALUE (the run's container label)", file=sys.stderr)
        return 2
    if sys.stdin.readline().strip() == DONE:
        return 0
    from .client import docker_client  # only now: a run that ends well never pays for the SDK here

    client = docker_client()  # the daemon builder's launcher reached (DOCKER_HOST is inherited)
    for c in client.containers.list(all=True, filters={"label": argv[1]}):
        try:
            c.remove(force=True)
        except Exception:  # noqa: BLE001 - removed meanwhile
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
