"""Every external command builder runs — docker, docker buildx, skopeo, git — goes through this module, which
logs the exact argv (logger ``builder.commands``; `builder --debug` prints it) before running it. No other module
runs the docker CLI (tests/unit/project/test_layers.py holds that): the build side (steps, audit, pins, lock, rehearse) reaches
the local daemon through the functions here. The deployer's side (builder/deploy/: smoke, bench, doctor --host)
reads images and runs its containers through the docker SDK instead, one client made in deploy/runtime/engine.py
(`docker_client`) for containers it waits on, reads the logs of and removes by label, and logs each container it
starts to the same logger; `builder serve`'s one `docker run` is spelled (`run_argv`) and started here. nvidia-smi,
twine, the load generator and credential helpers are no container tools and are not logged.

Build lines are spelled here too (docker-py has no BuildKit, so builds go through the buildx CLI).
A tool that is not installed is an environment problem (exit 3), not a failed cell.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from . import gitmirror, redact
from .errors import CommandError, EnvironmentProblem
from .imageref import ImageRef
from .owner import die_with_parent

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
                              env={**os.environ, **env} if env else None, preexec_fn=die_with_parent)
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
        proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              preexec_fn=die_with_parent)
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
        return subprocess.Popen(_logged(argv), preexec_fn=die_with_parent, **kwargs)
    except FileNotFoundError:
        raise _missing(argv) from None


def stream(argv: list[str], logfile: TextIO, echo: Callable[[str], None] | None, env: dict | None = None) -> float:
    """Run a command, writing its argv and every output line to the log (and to echo, live).

    Returns the seconds taken; raises CommandError with the output tail when it fails. The child runs in a
    process group of its own (the docker CLI and the buildx plugin it starts): if builder is interrupted
    (SIGINT, SIGTERM, any exception), the whole group gets SIGINT — buildx cancels its BuildKit solve — and
    is waited for; what is still alive after STOP_GRACE seconds is killed. What was stopped, and how, is
    written to the log and attached to the exception as `stopped`.
    """
    t0 = time.monotonic()
    logfile.write(f"$ {shlex.join(argv)}\n")
    logfile.flush()
    tail: list[str] = []
    proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                 env={**os.environ, **(env or {})}, process_group=0)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            logfile.write(line)
            tail.append(line.rstrip("\n"))
            del tail[:-40]
            if echo:
                echo(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException as exc:
        how = stop_group(proc)
        what = f"{shlex.join(argv[:3])} ... {_target(argv)}(pid {proc.pid}): {how}"
        try:
            logfile.write(f"\n# interrupted: stopped {what}\n")
            logfile.flush()
        except (OSError, ValueError):
            pass
        try:
            exc.stopped = what
        except AttributeError:
            pass
        raise
    finally:
        proc.stdout.close()
    logfile.flush()
    if rc != 0:
        raise CommandError(argv, rc, "\n".join(tail))
    return time.monotonic() - t0


STOP_GRACE = 15.0  # seconds buildx gets to cancel its build after SIGINT before the group is killed


def _target(argv: list[str]) -> str:
    return f"--target {argv[argv.index('--target') + 1]} " if "--target" in argv[:-1] else ""


def _live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live (not zombie) process, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("latin-1")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z":
            out.append((int(entry), int(fields[1]), int(fields[2])))
    return out


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    return [pid for pid, _, group in _live_processes() if group == pgid]


def children(pid: int) -> list[int]:
    """The live child processes of `pid` that lead a process group of their own (what `stream` starts)."""
    return [child for child, parent, group in _live_processes() if parent == pid and group == child]


def stop_group(proc: subprocess.Popen, grace: float = STOP_GRACE) -> str:
    """SIGINT to the child's process group, wait for every member, SIGKILL what outlives `grace`; says how it
    went. A second interrupt while waiting kills the group at once."""
    pgid = proc.pid
    t0 = time.monotonic()

    def signal_group(sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    signal_group(signal.SIGINT)  # buildx cancels its build on SIGINT
    killed = False
    deadline = t0 + grace
    while True:
        try:
            if proc.poll() is not None and not group_members(pgid):
                break
            if time.monotonic() > deadline and not killed:
                signal_group(signal.SIGKILL)
                killed = True
                deadline = time.monotonic() + grace
            elif killed and time.monotonic() > deadline:
                return f"still running {time.monotonic() - t0:.1f}s after SIGKILL (pids {group_members(pgid)})"
            time.sleep(0.05)
        except KeyboardInterrupt:  # interrupted again while waiting: no more grace
            signal_group(signal.SIGKILL)
            killed = True
    seconds = time.monotonic() - t0
    return f"killed after {seconds:.1f}s (it outlived SIGINT)" if killed else f"exited {seconds:.1f}s after SIGINT"


# -- docker buildx build --------------------------------------------------------------------------------
def csv_options(**pairs: str) -> str:
    """key=value pairs for the options buildx reads as one CSV record (--output, --secret, --cache-to):
    a value holding ',' or '"' is quoted the CSV way, so a path like `build,dest=/elsewhere` stays one path
    instead of adding a key. A newline cannot be carried at all and is refused."""
    fields = []
    for key, value in pairs.items():
        value = str(value)
        if "\n" in value or "\r" in value:
            raise ValueError(f"{key}={value!r}: a newline cannot be passed to buildx")
        field = f"{key}={value}"
        fields.append('"' + field.replace('"', '""') + '"' if any(c in field for c in ',"') else field)
    return ",".join(fields)


@dataclass(frozen=True)
class BuildxCall:
    dockerfile: Path
    context: Path
    target: str
    build_args: tuple[tuple[str, str], ...] = ()
    contexts: tuple[tuple[str, str], ...] = ()  # named build contexts: name → dir / docker-image://...
    secrets: tuple[tuple[str, str], ...] = ()  # id → file
    secret_envs: tuple[tuple[str, str], ...] = ()  # id → environment variable of the buildx process
    output: str | None = None  # e.g. "type=local,dest=DIR"
    tags: tuple[str, ...] = ()
    load: bool = False
    metadata_file: Path | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    builder: str | None = None  # a buildx builder (or docker context) other than the current one
    # BuildKit's layer cache in a registry: (repository, tag prefix); the tag is "<prefix>-<target>"
    layer_cache: tuple[str, str] | None = None
    attest: tuple[str, ...] | None = None  # None: buildx's default; () none at all; ("type=provenance,mode=max",)

    def cache_ref(self) -> str:
        repo, prefix = self.layer_cache
        tag = f"{prefix}-{self.target}"
        if len(tag) > 128:  # the longest tag a registry takes
            import hashlib

            tag = f"{tag[:100]}-{hashlib.sha256(tag.encode()).hexdigest()[:16]}"
        return f"{repo}:{tag}"

    def argv(self, docker: str = "docker") -> list[str]:
        argv = [docker, "buildx", "build", "--progress=plain", "-f", str(self.dockerfile), "--target", self.target]
        if self.builder and is_context(self.builder, docker):  # buildx refuses --builder for a context's builder
            argv[1:1] = ["--context", self.builder]
        elif self.builder:
            argv += ["--builder", self.builder]
        for k, v in self.build_args:
            argv += ["--build-arg", f"{k}={v}"]
        for k, v in self.contexts:
            argv += ["--build-context", f"{k}={v}"]
        for k, v in self.secrets:
            argv += ["--secret", csv_options(id=k, src=v)]
        for k, v in self.secret_envs:
            argv += ["--secret", csv_options(id=k, env=v)]
        if self.output:
            argv += ["--output", self.output]
        for t in self.tags:
            argv += ["--tag", t]
        if self.load:
            argv.append("--load")
        if self.metadata_file:
            argv += ["--metadata-file", str(self.metadata_file)]
        if self.layer_cache:
            ref = self.cache_ref()
            argv += ["--cache-from", csv_options(type="registry", ref=ref),
                     "--cache-to", csv_options(type="registry", ref=ref, mode="max", **{"ignore-error": "true"})]
        if self.attest is not None:
            argv += ["--provenance=false", "--sbom=false"] if not self.attest else [
                x for a in self.attest for x in ("--attest", a)]
        argv += list(self.extra)
        argv.append(str(self.context))
        return argv


@functools.cache
def is_context(name: str, docker: str = "docker") -> bool:
    """Whether NAME is a docker context (another engine: its builder is reached with `docker --context NAME
    buildx`) rather than a buildx builder instance (`--builder NAME`)."""
    return probe([docker, "context", "inspect", name], timeout=30)[0] == 0


def require_buildx(docker: str = "docker") -> None:
    """Raise EnvironmentProblem (exit 3) unless the daemon answers and `docker buildx` works."""
    code, out, err = probe([docker, "buildx", "version"], timeout=30)
    if code == 127:
        raise EnvironmentProblem(f"{docker}: command not found: Docker is not installed or not on PATH\nfix: {SETUP_FIX}")
    if code != 0:
        why = (err or out).strip() or f"{docker} buildx version exited {code}"
        raise EnvironmentProblem(f"docker buildx is not usable: {why}\nfix: {SETUP_FIX}")
    require_daemon(docker)


def buildx_version(docker: str = "docker") -> str:
    """`docker buildx version`'s line (what a provenance records of the build's tool), "" when it does not answer."""
    code, out, _ = probe([docker, "buildx", "version"], timeout=30)
    return out.strip().splitlines()[0] if code == 0 and out.strip() else ""


def require_daemon(docker: str = "docker") -> None:
    code, out, err = probe([docker, "info", "--format", "{{.ServerVersion}}"], timeout=30)
    if code == 127:
        raise EnvironmentProblem(f"{docker}: command not found: Docker is not installed or not on PATH\nfix: {SETUP_FIX}")
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
    return run(run_argv(image, list(args), network="none", entrypoint=entrypoint, docker=docker)).stdout


def run_container(image: str, args: list[str], *, check: bool = True, timeout: float | None = None,
                  docker: str = "docker", **options) -> subprocess.CompletedProcess[str]:
    """`docker run` of IMAGE with `run_argv`'s OPTIONS (a name, no network, a memory limit, mounts, environment,
    an entrypoint), run to its end with its output captured. With check a non-zero exit raises CommandError;
    without, the exit is the caller's to read (a build command stopped on purpose, a compile killed for memory)."""
    return run(run_argv(image, args, docker=docker, **options), check=check, timeout=timeout)


def commit_container(container: str, ref: str, docker: str = "docker", timeout: float = 1800) -> None:
    """Name REF an image of the (stopped) container's filesystem, run to its end even when interrupted."""
    run_to_end([docker, "commit", container, ref], timeout=timeout)


def create_container(image: str, docker: str = "docker") -> str:
    """A stopped container of a local image (never pulled); returns its id."""
    argv = [docker, "create", "--pull", "never", "--entrypoint", "", image, "true"]
    out = run(argv).stdout.strip().splitlines()
    if not out:
        raise CommandError(argv, 0, "docker create printed no container id")
    return out[-1].strip()


def remove_container(cid: str, docker: str = "docker") -> None:
    """Remove a container, running or not; best effort (never raises: a cleanup)."""
    probe([docker, "rm", "-f", cid], timeout=60)


def remove_image(ref: str, docker: str = "docker") -> None:
    """Remove the image REF (its name, and the image when no other name holds it); best effort (never raises: a
    cleanup). `untag_image` is the checked removal of a name."""
    probe([docker, "image", "rm", "-f", ref], timeout=120)


# -- OCI archives and registries: docker load, skopeo ---------------------------------------------------
def load_archive(archive: Path, docker: str = "docker", timeout: float = 3600) -> str:
    """`docker load` an OCI archive into the daemon; with the containerd image store the image keeps the
    archive's manifest digest as its id. Returns docker's output ("Loaded image: REF")."""
    return run([docker, "load", "--input", str(archive)], timeout=timeout).stdout


def run_to_end(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`run` for a short command that names or unnames an image: an interrupt (SIGINT, SIGTERM) waits for it to
    finish before it goes on, so whether the name exists afterwards is known (a docker CLI killed half-way may
    leave the daemon to finish the request after builder removed the name). The command runs in a process
    group of its own, so a Ctrl-C at the terminal reaches builder only."""
    proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    interrupted: BaseException | None = None
    deadline = time.monotonic() + timeout
    while True:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            break
        except KeyboardInterrupt as exc:  # let it finish (it takes milliseconds), then go on with the interrupt
            interrupted = exc
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise CommandError(argv, 124, f"timed out after {timeout:g}s\n{out}{err}") from None
    if interrupted is not None:
        raise interrupted
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, out + err)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def pull_by_digest(ref: str, timeout: float, docker: str = "docker") -> None:
    """`docker pull REPO@sha256:...` (the docker login's credentials, as for a base image). A pull by digest
    names nothing but that digest: one interrupted half-way leaves no name on a wrong or partial image."""
    run([docker, "pull", "--quiet", ref], timeout=timeout)


def tag_image(source: str, target: str, docker: str = "docker") -> None:
    """Name image SOURCE (a name or an image id) TARGET as well, run to its end even when interrupted."""
    run_to_end([docker, "tag", source, target])


TAG_ATTEMPTS = 6


def point_tag(target: str, digest: str, docker: str = "docker") -> None:
    """Make the name TARGET point at the image whose id is DIGEST. Two builds of one cell move its tag at the
    same moment: the containerd image store then refuses one of them ("failed to create an image ... after
    deleting the existing one: image ... already exists"), since a tag move is a delete and a create. That
    answer is not a failure when the name now points at DIGEST (the other build loaded the same content);
    otherwise the move is tried again, and the last build to move the name has it, as with one build after
    another."""
    for attempt in range(TAG_ATTEMPTS):
        try:
            tag_image(digest, target, docker)
            return
        except CommandError as exc:
            if "already exists" not in exc.output or attempt == TAG_ATTEMPTS - 1:
                raise
            if image_id(target, docker) == digest:
                return
        time.sleep(0.05 * 2 ** attempt)


def local_tags(repository: str, docker: str = "docker") -> list[str]:
    """The tags the local daemon holds for REPOSITORY (REGISTRY/PATH, no tag); [] when it holds none."""
    code, out, _ = probe([docker, "image", "ls", "--format", "{{.Tag}}", repository], timeout=60)
    return [t for t in out.split() if t and t != "<none>"] if code == 0 else []


def untag_image(ref: str, docker: str = "docker", missing_ok: bool = False) -> bool:
    """Remove the name REF (the image stays while another name holds it); with missing_ok a name that does not
    exist is no error. Whether a name was removed."""
    try:
        run_to_end([docker, "image", "rm", ref])
    except CommandError as exc:
        if missing_ok and "No such image" in exc.output:
            return False
        raise
    return True


def image_id(ref: str, docker: str = "docker") -> str:
    """The local image's id (its manifest digest in the containerd image store), "" when there is none."""
    code, out, _ = probe([docker, "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    return out.strip() if code == 0 else ""


def repo_digest(ref: str, docker: str = "docker") -> str:
    """The manifest digest under which the local daemon knows image REF (its RepoDigests entry for REF's
    name), "" when it has none: what `FROM REF@digest` resolves to on this host."""
    import json

    code, out, _ = probe([docker, "image", "inspect", "--format", "{{json .RepoDigests}}", ref], timeout=60)
    if code != 0:
        return ""
    want = ImageRef.parse(ref)
    for entry in json.loads(out or "null") or []:
        found = ImageRef.parse(entry, "the daemon's RepoDigests entry")
        if found.same_repository(want) and found.digest.startswith("sha256:"):
            return found.digest
    return ""


def local_tag_for_digest(ref: str, docker: str = "docker") -> str:
    """For REF named by digest (NAME[:TAG]@sha256:...) that the local daemon holds: a NAME:TAG that names that
    very image now ("" for a reference without a digest, or one the daemon does not hold)."""
    import json

    want = ImageRef.parse(ref)
    if not want.digest.startswith("sha256:"):
        return ""
    code, out, _ = probe([docker, "image", "inspect", "--format", "{{json .RepoTags}}", ref], timeout=60)
    if code != 0:
        return ""
    name = str(dataclasses.replace(want, digest=""))
    tags = [t for t in json.loads(out or "null") or [] if ImageRef.parse(t).same_repository(want)]
    return name if name in tags else (tags[0] if tags else "")


def make_local_digest_resolvable(ref: str, tag: str, scratch: Path, builder: str | None = None,
                                 docker: str = "docker") -> tuple[int, str]:
    """Let BuildKit take `FROM REF` (a base named by digest that only the local daemon holds) from the local
    store. With the docker driver and the containerd image store, BuildKit resolves NAME@sha256:... from the
    content store only when that manifest's blob records the repository it came from (the
    containerd.io/distribution.source label a pull writes); else it asks NAME's registry, which has never
    seen a local base (Docker Hub for builder-local/..., and the build fails). Resolving TAG once (a
    cache-only build of `FROM TAG`: nothing runs, nothing is exported) writes that label. (returncode,
    output) of that build; `scratch` holds its Dockerfile."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "Dockerfile").write_text(f"FROM {tag}\n")
    call = BuildxCall(dockerfile=scratch / "Dockerfile", context=scratch, target="", output="type=cacheonly",
                      builder=builder)
    argv = [a for a in call.argv(docker) if a not in ("--target", "")]
    code, out, err = probe(argv, timeout=300)
    return code, (out + err).strip()


def image_labels(ref: str, docker: str = "docker") -> dict[str, str] | None:
    """The labels of a local image; None when the daemon has no such image.

    The build side's one reader of a local image's labels (the image step's reuse check, `builder audit IMAGE`'s
    packages): through the docker CLI, like every other command of a build, so `--docker` and `--debug` hold for
    it. The deployer's side reads a local image's whole config (environment, labels, repo digest) through the
    docker SDK (deploy/subject.py `read_local`), with the client its smoke and bench containers are started
    with."""
    import json

    code, out, _ = probe([docker, "image", "inspect", "--format", "{{json .Config.Labels}}", ref], timeout=60)
    return (json.loads(out or "null") or {}) if code == 0 else None


def run_argv(image: str, args: list[str], *, gpus: str | None = None, ports: tuple[str, ...] = (),
             mounts: tuple[tuple[str, str], ...] = (), env: tuple[tuple[str, str], ...] = (), name: str | None = None,
             ipc: str | None = None, network: str | None = None, memory: int | None = None,
             writable: tuple[tuple[str, str], ...] = (), entrypoint: str | None = None, remove: bool = True,
             docker: str = "docker", shm_size: str | None = None, options: tuple[str, ...] = ()) -> list[str]:
    """`docker run` (`--rm` unless not `remove`) of IMAGE with its ENTRYPOINT (or `entrypoint`) and ARGS: GPUs
    ("all" or "device=0,1"), a network ("none"), a memory limit in bytes (swap included: no swapping past it),
    published ports ("127.0.0.1:8000:8000"), read-only bind mounts and writable ones (host path, container
    path), environment, /dev/shm's size ("16g") and further options (a health check) before the image."""
    argv = [docker, "run"] + (["--rm"] if remove else [])
    if name:
        argv += ["--name", name]
    if gpus:
        argv += ["--gpus", gpus]
    if ipc:
        argv += ["--ipc", ipc]
    if shm_size:
        argv += ["--shm-size", shm_size]
    if network:
        argv += ["--network", network]
    if memory:
        argv += ["--memory", str(memory), "--memory-swap", str(memory)]
    for p in ports:
        argv += ["-p", p]
    for src, dst in mounts:
        argv += ["-v", f"{src}:{dst}:ro"]
    for src, dst in writable:
        argv += ["-v", f"{src}:{dst}"]
    for k, v in env:
        argv += ["-e", f"{k}={v}"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return argv + list(options) + [image, *args]


def _auth_fd(credentials: dict[str, tuple[str, str]]) -> int:
    """An in-memory file (memfd, never on disk) holding a containers-auth.json for `credentials` (host →
    (user, password)); its path for the child is /proc/self/fd/N."""
    import base64
    import json

    fd = os.memfd_create("builder-registry-auth", os.MFD_CLOEXEC)
    doc = {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
                     for host, (user, password) in credentials.items()}}
    os.write(fd, json.dumps(doc).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _docker_hosts(args: list[str]) -> set[str]:
    """The registry hosts skopeo's arguments name (docker://HOST/...): the only ones its auth file may hold."""
    return {a.removeprefix("docker://").split("/", 1)[0] for a in args if a.startswith("docker://")}


def skopeo(args: list[str], *, credentials: dict[str, tuple[str, str]] | None = None,
           timeout: float = 3600, binary: bool = False) -> subprocess.CompletedProcess:
    """Run `skopeo ARGS`. Credentials reach it through an in-memory auth file: never on its command line (which
    is logged and visible in ps), never written to disk, and only those of a host its arguments name. A non-zero exit raises CommandError. With binary,
    stdout is bytes (a manifest, whose digest is of its exact bytes)."""
    credentials = {host: pair for host, pair in (credentials or {}).items() if host in _docker_hosts(args)}
    fd = _auth_fd(credentials) if credentials else None
    argv = ["skopeo", args[0], *(["--authfile", f"/proc/self/fd/{fd}"] if fd is not None else []), *args[1:]]
    try:
        proc = subprocess.run(_logged(argv), capture_output=True, text=not binary, timeout=timeout, check=False,
                              pass_fds=(fd,) if fd is not None else (), preexec_fn=die_with_parent)
    except FileNotFoundError:
        raise EnvironmentProblem("skopeo: command not found (publishing copies OCI archives with it)\n"
                                 "fix: apt-get install skopeo (scripts/setup-docker.sh installs it)") from None
    except subprocess.TimeoutExpired:
        raise CommandError(argv, 124, f"timed out after {timeout:g}s (i/o timeout)") from None
    finally:
        if fd is not None:
            os.close(fd)
    if proc.returncode != 0:
        out = proc.stdout + proc.stderr
        raise CommandError(argv, proc.returncode, out.decode(errors="replace") if binary else out)
    return proc


def _tls(flag: str, verify: bool) -> list[str]:
    return [f"--{flag}={'true' if verify else 'false'}"]


def skopeo_copy_args(src: str, dest: str, *, src_tls_verify: bool = True, dest_tls_verify: bool = True,
                     all_images: bool = False, digestfile: Path | None = None) -> list[str]:
    """`skopeo copy` keeping every digest (an image that would have to be converted is refused, not changed)."""
    args = ["copy", "--preserve-digests", "--retry-times", "0"]
    if src.startswith("docker://"):
        args += _tls("src-tls-verify", src_tls_verify)
    if dest.startswith("docker://"):
        args += _tls("dest-tls-verify", dest_tls_verify)
    if all_images:
        args.append("--all")
    if digestfile is not None:
        args += ["--digestfile", str(digestfile)]
    return args + [src, dest]


def skopeo_inspect_args(ref: str, *, tls_verify: bool = True) -> list[str]:
    """What a registry says about REF (its config's labels among it), nothing pulled."""
    return ["inspect", "--retry-times", "0", *_tls("tls-verify", tls_verify), ref]


def skopeo_inspect_raw_args(ref: str, *, tls_verify: bool = True) -> list[str]:
    """The manifest a registry serves for REF, byte for byte (its sha256 is the digest under that name)."""
    return ["inspect", "--raw", "--retry-times", "0", *_tls("tls-verify", tls_verify), ref]


# -- git ------------------------------------------------------------------------------------------------
def git_last_commit_time(directory: Path) -> str:
    """Unix time of the last commit of the git repository holding `directory` ("" when there is none; git
    runs only when `directory` or a parent holds a .git, or GIT_DIR names a repository)."""
    directory = Path(directory).resolve()
    if not os.environ.get("GIT_DIR") and not any((d / ".git").exists() for d in (directory, *directory.parents)):
        return ""
    code, out, _ = probe(["git", "-C", str(directory), "log", "-1", "--format=%ct"], timeout=30)
    out = out.strip()
    return out if code == 0 and out.isascii() and out.isdigit() else ""


def git_ls_remote(repository: str, *refs: str, timeout: float = 30) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `git ls-remote`; never prompts for credentials."""
    argv = ["git", "ls-remote", repository, *refs]
    try:
        proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout,
                              env={"GIT_TERMINAL_PROMPT": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                   **gitmirror.git_env()},
                              preexec_fn=die_with_parent)
    except FileNotFoundError:
        return 127, "", "git: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"git ls-remote {repository}: timed out after {timeout:g}s"
    return proc.returncode, proc.stdout, redact.redact(proc.stderr)


def git_fetch_commit(repository: str, commit: str, dest: Path, timeout: float = 600) -> tuple[int, str]:
    """(returncode, error text) of checking out exactly `commit` of `repository` into the empty directory `dest`
    (a depth-1 fetch of that commit, verified); never prompts for credentials."""
    env = {"GIT_TERMINAL_PROMPT": "0", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(dest),
           **gitmirror.git_env()}
    for var in ("GIT_SSL_CAINFO", "SSL_CERT_FILE", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    steps = [
        ["git", "init", "-q", str(dest)],
        ["git", "-C", str(dest), "fetch", "-q", "--depth", "1", repository, commit],
        ["git", "-C", str(dest), "-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD"],
        ["git", "-C", str(dest), "rev-parse", "HEAD"],
    ]
    out = ""
    for argv in steps:
        try:
            proc = subprocess.run(_logged(argv), capture_output=True, text=True, timeout=timeout, env=env,
                                  preexec_fn=die_with_parent)
        except FileNotFoundError:
            return 127, "git: command not found"
        except subprocess.TimeoutExpired:
            return 124, f"{' '.join(argv[:4])}: timed out after {timeout:g}s"
        if proc.returncode != 0:
            return proc.returncode, redact.redact((proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1])
        out = proc.stdout.strip()
    if out != commit:
        return 1, f"fetched {out or 'nothing'}, not {commit}"
    return 0, ""
