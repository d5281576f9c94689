"""The docker SDK's client, made here only: the launchers' (engine.py) and the watchdog's (watchdog.py)."""

from __future__ import annotations

from ...errors import EnvironmentProblem


def docker_client():
    try:
        import docker as docker_sdk
    except ImportError:
        raise EnvironmentProblem("the `docker` Python package is missing: pip install docker "
                                 "(it is a dependency of builder; reinstall builder)") from None
    try:
        client = docker_sdk.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - docker.errors.DockerException and requests' errors
        raise EnvironmentProblem(f"the Docker daemon is not reachable: {exc}\n"
                                 "fix: run scripts/setup-docker.sh (as root); `builder doctor` says more") from None
    return client
