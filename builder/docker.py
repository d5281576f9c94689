"""Every external command builder runs — docker, docker buildx, skopeo, git — goes through this module, which
logs the exact argv (logger ``builder.commands``; `builder --debug` prints it) before running it.

Build lines are spelled here too (docker-py has no BuildKit, so builds go through the buildx CLI).
A tool that is not installed is an environment problem (exit 3), not a failed cell.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from .errors import CommandError, EnvironmentProblem

log = logging.getLogger("builder.commands")

SETUP_FIX = "run scripts/setup-docker.sh (as root) to install and start Docker with buildx; `builder doctor` says more"


def _logged(argv: list[str]) -> list[str]:
    log.debug("$ %s", shlex.join(argv))
    return argv


def _missing(argv: list[str]) -> EnvironmentProblem:
    return EnvironmentProblem(f"{argv[0]}: command not found (needed for: {shlex.join(argv[:3])} ...)\nfix: {SETUP_FIX}")


def run(argv: list[str], *, timeout: float | None = None, check: bool = True,
        env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing its output. With check, a non-zero exit raises CommandError."""
    try:
        proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **env} if env else None)
    except FileNotFoundError:
        raise _missing(argv) from None
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, 124, f"timed out after {timeout:g}s\n{exc.output or ''}") from None
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stdout + proc.stderr)
    return proc


def probe(argv: list[str], timeout: float = 20.0) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) and never an exception, for checks: 127 when the tool is missing,
    124 on timeout, 126 when it cannot be started."""
    try:
        proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{shlex.join(argv)}: timed out after {timeout:g}s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


def popen(argv: list[str], **kwargs) -> subprocess.Popen:
    """Start a command whose output the caller streams (e.g. `docker export`)."""
    try:
        return subprocess.Popen(_logged(argv), **kwargs)
    except FileNotFoundError:
        raise _missing(argv) from None


def stream(argv: list[str], logfile: TextIO, echo: Callable[[str], None] | None, env: dict | None = None) -> float:
    """Run a command, writing its argv and every output line to the log (and to echo, live).

    Returns the seconds taken; raises CommandError with the output tail when it fails. If builder is
    interrupted, the child (and the BuildKit solve it drives) is stopped too, not left running.
    """
    t0 = time.monotonic()
    logfile.write(f"$ {shlex.join(argv)}\n")
    logfile.flush()
    tail: list[str] = []
    proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                 env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            logfile.write(line)
            tail.append(line.rstrip("\n"))
            del tail[:-40]
            if echo:
                echo(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGINT)  # buildx cancels its build on SIGINT
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    logfile.flush()
    if rc != 0:
        raise CommandError(argv, rc, "\n".join(tail))
    return time.monotonic() - t0


# -- docker buildx build --------------------------------------------------------------------------------
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


def require_buildx(docker: str = "docker") -> None:
    """Raise EnvironmentProblem (exit 3) unless the daemon answers and `docker buildx` works."""
    code, out, err = probe([docker, "buildx", "version"], timeout=30)
    if code != 0:
        why = (err or out).strip() or f"{docker} buildx version exited {code}"
        raise EnvironmentProblem(f"docker buildx is not usable: {why}\nfix: {SETUP_FIX}")
    require_daemon(docker)


def require_daemon(docker: str = "docker") -> None:
    code, out, err = probe([docker, "info", "--format", "{{.ServerVersion}}"], timeout=30)
    if code != 0:
        why = (err or out).strip() or f"{docker} info exited {code}"
        raise EnvironmentProblem(f"the Docker daemon is not reachable: {why.splitlines()[-1]}\nfix: {SETUP_FIX}")


# -- images ---------------------------------------------------------------------------------------------
def image_exists(ref: str, docker: str = "docker") -> bool:
    """Whether the local image store has `ref` (never pulls). The daemon must answer: EnvironmentProblem else."""
    code, out, err = probe([docker, "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    if code == 0:
        return True
    require_daemon(docker)  # "no such image" only counts when the daemon answered
    return False


def run_in_image(image: str, entrypoint: str, *args: str, docker: str = "docker") -> str:
    """stdout of a throwaway container of `image` with no network."""
    return run([docker, "run", "--rm", "--network", "none", "--entrypoint", entrypoint, image, *args]).stdout


def create_container(image: str, docker: str = "docker") -> str:
    """A stopped container of a local image (never pulled); returns its id."""
    argv = [docker, "create", "--pull", "never", "--entrypoint", "", image, "true"]
    out = run(argv).stdout.strip().splitlines()
    if not out:
        raise CommandError(argv, 0, "docker create printed no container id")
    return out[-1].strip()


def remove_container(cid: str, docker: str = "docker") -> None:
    probe([docker, "rm", "-f", cid], timeout=60)


# -- git ------------------------------------------------------------------------------------------------
def git_ls_remote(repository: str, *refs: str, timeout: float = 30) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `git ls-remote`; never prompts for credentials."""
    argv = ["git", "ls-remote", repository, *refs]
    try:
        proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout,
                              env={"GIT_TERMINAL_PROMPT": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except FileNotFoundError:
        return 127, "", "git: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"git ls-remote {repository}: timed out after {timeout:g}s"
    return proc.returncode, proc.stdout, proc.stderr
