"""Real services for the remote wheel cache tests, started as containers through testcontainers on
127.0.0.1 only: an OCI registry (Debian's docker-registry, optionally with htpasswd auth) and a PEP 503 index
(pypiserver from PyPI, optionally with upload auth). Their images are built locally FROM the local Debian base
(tests/fixtures/services/*): there is no Docker Hub here."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

# before testcontainers reads its configuration: no Ryuk reaper image (cannot be pulled; we remove what we
# start), and talk to the daemon's socket, reaching published ports on 127.0.0.1 (not the bridge's 172.x)
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TC_HOST", "127.0.0.1")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")

from testcontainers.core.container import DockerContainer  # noqa: E402

SERVICES = Path(__file__).resolve().parent / "fixtures" / "services"
REGISTRY_IMAGE = "builder-test/registry:local"
INDEX_IMAGE = "builder-test/pypiserver:local"
REDIS_IMAGE = "builder-test/redis:local"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def build_image(tag: str, folder: Path) -> str:
    """docker buildx build of a service image (layer-cached after the first time)."""
    argv = ["docker", "buildx", "build", "--load", "-t", tag, str(folder)]
    if HOST_CA.is_file():
        argv[3:3] = ["--secret", f"id=ca,src={HOST_CA}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        pytest.fail(f"building {tag} from {folder} failed:\n{tail}", pytrace=False)
    return tag


class Service(NamedTuple):
    host: str  # 127.0.0.1:PORT
    container: DockerContainer
    user: str | None = None
    password: str | None = None

    def kill(self) -> None:
        self.container.get_wrapped_container().kill()


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@contextlib.contextmanager
def started(image: str, port: int, ready_path: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, DockerContainer]]:
    """Run `image` with `port` published on 127.0.0.1 (a free port), wait until GET ready_path answers."""
    c = DockerContainer(image)
    for k, v in (env or {}).items():
        c.with_env(k, v)
    c.ports[f"{port}/tcp"] = ("127.0.0.1", None)  # loopback only
    c.start()
    try:
        host = f"127.0.0.1:{c.get_exposed_port(port)}"
        deadline = time.monotonic() + 60
        while _status(f"http://{host}{ready_path}") not in (200, 401):
            if time.monotonic() > deadline:
                logs = b"".join(c.get_logs()).decode(errors="replace")[-2000:]
                pytest.fail(f"{image} did not answer on {host}{ready_path}:\n{logs}", pytrace=False)
            time.sleep(0.2)
        yield host, c
    finally:
        c.stop()


@contextlib.contextmanager
def registry(user: str | None = None, password: str | None = None) -> Iterator[Service]:
    env = {"REGISTRY_USER": user, "REGISTRY_PASSWORD": password} if user else {}
    with started(REGISTRY_IMAGE, 5000, "/v2/", env) as (host, c):
        yield Service(host, c, user, password)


@contextlib.contextmanager
def index(user: str | None = None, password: str | None = None, overwrite: bool = False) -> Iterator[Service]:
    env = {"INDEX_USER": user, "INDEX_PASSWORD": password} if user else {}
    if overwrite:
        env["INDEX_OVERWRITE"] = "1"
    with started(INDEX_IMAGE, 8080, "/simple/", env) as (host, c):
        yield Service(host, c, user, password)


def _redis_ping(host: str, password: str | None) -> bool:
    import socket

    addr, port = host.rsplit(":", 1)
    try:
        with socket.create_connection((addr, int(port)), timeout=2) as s:
            if password:
                s.sendall(f"AUTH {password}\r\n".encode())
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis(password: str | None = None) -> Iterator[Service]:
    """Debian's redis-server on 127.0.0.1 (a free port), optionally with AUTH: the shared compile cache."""
    c = DockerContainer(build_image(REDIS_IMAGE, SERVICES / "redis"))
    if password:
        c.with_env("REDIS_PASSWORD", password)
    c.ports["6379/tcp"] = ("127.0.0.1", None)  # loopback only
    c.start()
    try:
        host = f"127.0.0.1:{c.get_exposed_port(6379)}"
        deadline = time.monotonic() + 60
        while not _redis_ping(host, password):
            if time.monotonic() > deadline:
                logs = b"".join(c.get_logs()).decode(errors="replace")[-2000:]
                pytest.fail(f"redis did not answer on {host}:\n{logs}", pytrace=False)
            time.sleep(0.2)
        yield Service(host, c, None, password)
    finally:
        c.stop()
