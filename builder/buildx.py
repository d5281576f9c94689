"""The one place that spells `docker buildx build` command lines (BuildKit; docker-py has none)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from .errors import CommandError


@dataclass(frozen=True)
class BuildxCall:
    dockerfile: Path
    context: Path
    target: str
    build_args: tuple[tuple[str, str], ...] = ()
    contexts: tuple[tuple[str, str], ...] = ()  # named build contexts: name → dir / docker-image://...
    secrets: tuple[tuple[str, str], ...] = ()  # id → file
    output: str | None = None  # e.g. "type=local,dest=DIR"
    tags: tuple[str, ...] = ()
    load: bool = False
    metadata_file: Path | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)

    def argv(self, docker: str = "docker") -> list[str]:
        argv = [docker, "buildx", "build", "--progress=plain", "-f", str(self.dockerfile), "--target", self.target]
        for k, v in self.build_args:
            argv += ["--build-arg", f"{k}={v}"]
        for k, v in self.contexts:
            argv += ["--build-context", f"{k}={v}"]
        for k, v in self.secrets:
            argv += ["--secret", f"id={k},src={v}"]
        if self.output:
            argv += ["--output", self.output]
        for t in self.tags:
            argv += ["--tag", t]
        if self.load:
            argv.append("--load")
        if self.metadata_file:
            argv += ["--metadata-file", str(self.metadata_file)]
        argv += list(self.extra)
        argv.append(str(self.context))
        return argv


def run_streaming(argv: list[str], log: TextIO, echo: Callable[[str], None] | None, env: dict | None = None) -> float:
    """Run a command, writing every output line to the log (and to echo, live). Returns seconds taken.

    Raises CommandError with the output tail when the command fails.
    """
    t0 = time.monotonic()
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    tail: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        tail.append(line.rstrip("\n"))
        del tail[:-40]
        if echo:
            echo(line.rstrip("\n"))
    rc = proc.wait()
    log.flush()
    if rc != 0:
        raise CommandError(argv, rc, "\n".join(tail))
    return time.monotonic() - t0


def docker_available(docker: str = "docker") -> str | None:
    """None when `docker buildx` answers, else why not."""
    try:
        out = subprocess.run([docker, "buildx", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{docker} buildx: {exc}"
    if out.returncode != 0:
        return (out.stderr or out.stdout).strip() or f"{docker} buildx version exited {out.returncode}"
    info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return (info.stderr or info.stdout).strip() or "docker daemon not reachable"
    return None


def stderr_echo(prefix: str) -> Callable[[str], None]:
    def echo(line: str) -> None:
        sys.stderr.write(f"{prefix} {line}\n")

    return echo
