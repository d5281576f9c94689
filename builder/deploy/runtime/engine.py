"""The one engine runtime of the deployer's side (smoke, bench): where the engine runs — a container of the
image (the `docker` SDK, the one docker client of builder/deploy/, GPUs through device requests) or a plain
process in a Python environment (a GPU host without Docker) — and a running engine (`RunningEngine`: start,
wait_ready, models, complete, metrics, log_tail, stop), the one boot loop smoke L3 and bench share. Both
launchers run the same probe and the same launch line; only how a path, the host address and the GPUs reach the
engine differs. What a boot wrote under its cache root (the watch that stop() reports) is caches.py's.

The engine is always stopped and its container removed: Server.stop() runs from a `finally`, so a failure,
a timeout and Ctrl-C (SIGTERM is turned into KeyboardInterrupt by the CLI) all end it. No container can escape
that by construction: every container of one smoke run carries the run's own label, it is created, recorded and
only then started, and DockerLauncher.close() (a `finally` around the whole run, KeyboardInterrupt included)
removes every container with that label — also one the daemon made while an interrupt landed in the SDK call
that was making it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...errors import EnvironmentProblem, UserError
from ...imageref import ImageRef
from ...owner import die_with_parent, owner
from ...owner import alive as owner_alive
from ...image import labels as labels_mod
from ...image.launchline import MODEL_ROOT, LaunchLine
from . import watchdog
from .client import docker_client
from .caches import Written, container_written, process_written, snapshot

log = logging.getLogger("builder.commands")

PROBE = Path(__file__).parent.parent / "smoke" / "probe.py"  # deploy/smoke/probe.py, mounted into the image
RUN_LABEL = "io.builder.smoke.run"  # one value per smoke run: what DockerLauncher.close() removes
MARK = "BUILDER-PROBE-RESULT: "


@dataclass
class ProbeRun:
    returncode: int
    output: str  # stdout and stderr together

    def result(self) -> dict | None:
        import json

        for line in reversed(self.output.splitlines()):
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        return None

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.output.strip().splitlines()[-n:])


class Server(Protocol):
    log_path: Path

    def exit_code(self) -> int | None: ...  # None while it runs

    def settle(self) -> None: ...  # after its exit: its whole log is in log_path

    def stop(self) -> None: ...


class Launcher(Protocol):
    name: str
    host: str  # the address the engine binds to
    gpus: bool

    def where(self, path: Path) -> str: ...  # how a host path (mounted read-only) reaches the engine

    def probe(self, command: str, spec: dict, env: dict[str, str], timeout: float) -> ProbeRun: ...

    def start(self, line: LaunchLine, env: dict[str, str], port: int, log_path: Path) -> Server: ...


# the KV-cache size engines print at boot: vLLM "GPU KV cache size: 1,234 tokens", SGLang "#tokens: 1234"
KV_CACHE_LINES = (re.compile(r"GPU KV cache size: ([\d,]+) tokens"), re.compile(r"KV Cache is allocated\. #tokens: (\d+)"))


def kv_cache_tokens(log: str) -> int | None:
    """The KV-cache tokens the engine reported in its log (the last such line), None when it said nothing."""
    for rx in KV_CACHE_LINES:
        found = rx.findall(log)
        if found:
            return int(found[-1].replace(",", ""))
    return None


def model_place(places: dict[str, str], host: str, root: str = MODEL_ROOT) -> str:
    """Where a model directory of the host is reached in the image: <root>/<its name>, a second path of the same name
    in its own folder; `places` (host -> place) remembers what was given out."""
    if host not in places:
        name = Path(host).name
        inside = f"{root}/{name}"
        if inside in places.values():
            inside = f"{root}/m{len(places)}/{name}"
        places[host] = inside
    return places[host]


# -- a plain process ---------------------------------------------------------------------------------------
@dataclass
class ProcessServer:
    proc: subprocess.Popen
    log_path: Path
    _log: object = None

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def settle(self) -> None:
        if self._log is not None:
            self._log.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)  # the engine and every worker it started
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            try:  # workers the engine left behind in its process group
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()


@dataclass
class ProcessLauncher:
    """Runs the engine's launch line in a Python environment of this host (no Docker): `python` is its
    interpreter; a console script (`vllm`) is looked up beside it, then on PATH."""

    python: str = "python3"
    name: str = "process"
    host: str = "127.0.0.1"
    gpus: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    gpu_ids: tuple[int, ...] = ()  # --gpus 0,1: these devices only (CUDA_VISIBLE_DEVICES); () every GPU
    # --image-paths (image/launchline.ImagePaths): the engine runs at the image's paths, its model reached under the
    # image's model root as a container mounts it (vLLM's compile-cache hash holds the model's path)
    paths: object = None

    places: dict[str, str] = field(default_factory=dict)  # with paths: host path -> its link under the model root

    def where(self, path: Path) -> str:
        host = Path(path).resolve()
        if self.paths is None:
            return str(host)
        inside = Path(model_place(self.places, str(host), self.paths.model_root))
        try:
            inside.parent.mkdir(parents=True, exist_ok=True)
            if inside.is_symlink() and inside.resolve() != host:
                inside.unlink()
            if not inside.is_symlink():
                inside.symlink_to(host, target_is_directory=True)
        except OSError as exc:
            raise UserError(f"--image-paths: cannot link {inside} to {host} ({exc.strerror}): the model is reached "
                            "there as in the image") from None
        return str(inside)

    def _env(self, env: dict[str, str]) -> dict[str, str]:
        chosen = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpu_ids))} if self.gpus and self.gpu_ids else {}
        if self.paths is not None:
            from . import imagepaths

            chosen.update(imagepaths.env(self.paths))
        return {**os.environ, **chosen, **self.extra_env, **env}

    def _resolve(self, argv: list[str]) -> list[str]:
        first = argv[0]
        if first in ("python", "python3"):
            return [self.python, *argv[1:]]
        beside = Path(self.python).parent / first if os.sep in self.python else None
        found = str(beside) if beside and beside.is_file() else shutil.which(first)
        if not found:
            raise UserError(f"{first}: not found beside {self.python} or on PATH (install the engine in that "
                            "environment, or put its bin/ on PATH)")
        return [found, *argv[1:]]

    def probe(self, command: str, spec: dict, env: dict[str, str], timeout: float) -> ProbeRun:
        import json

        argv = [self.python, str(PROBE), command, json.dumps(spec)]
        log.debug("$ %s %s %s <spec>", self.python, PROBE, command)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self._env(env),
                                  preexec_fn=die_with_parent)
        except FileNotFoundError:
            raise UserError(f"--python {self.python}: not found") from None
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
            return ProbeRun(124, out + f"\nprobe {command} timed out after {timeout:g}s")
        return ProbeRun(proc.returncode, proc.stdout + proc.stderr)

    def start(self, line: LaunchLine, env: dict[str, str], port: int, log_path: Path) -> ProcessServer:
        argv = self._resolve(line.argv)  # the whole launch line: the image's ENTRYPOINT and its arguments
        log.debug("$ %s", shlex.join(argv))
        out = open(log_path, "w")
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self._env(env), start_new_session=True, preexec_fn=die_with_parent)
        return ProcessServer(proc, log_path, out)


# -- a container -------------------------------------------------------------------------------------------
@dataclass
class ContainerServer:
    container: object
    log_path: Path
    _thread: threading.Thread | None = None

    def exit_code(self) -> int | None:
        try:
            self.container.reload()
        except Exception:  # noqa: BLE001 - gone
            return -1
        if self.container.status in ("exited", "dead"):
            return self.container.attrs.get("State", {}).get("ExitCode", -1)
        return None

    def settle(self) -> None:
        """The log stream of an exited container ends: wait (a while) until the pump has written all of it."""
        if self._thread is not None:
            self._thread.join(timeout=10)

    def stop(self, root: str | None = None, dest: Path | None = None, mounts: tuple[str, ...] = ()) -> "Written | None":
        """Stop and remove the container; with `root`, first what the run wrote under it (its files copied to
        `dest` when given) and anywhere else (the container's diff, mount points left out)."""
        try:
            self.container.stop(timeout=15)
        except Exception:  # noqa: BLE001 - already stopped or gone
            pass
        if self._thread is not None:
            self._thread.join(timeout=15)
        written = None
        try:
            if root:
                written = container_written(self.container, root, dest, mounts)
        finally:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001
                pass
        return written


@dataclass
class DockerLauncher:
    """Runs the engine in a container of `image` (never pulled). GPUs, when asked for, go through a device
    request for every GPU; host paths are mounted read-only under /smoke/."""

    image: str
    gpus: bool = False
    name: str = "docker"
    host: str = "0.0.0.0"
    client: object = None
    mounts: dict[str, str] = field(default_factory=dict)  # host path -> path in the container
    gpu_ids: tuple[int, ...] = ()  # --gpus 0,1: a device request for these only; () every GPU
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # the label value of this run's containers
    _watchdog: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.client is None:
            self.client = docker_client()
        self.reap_orphans()

    def _watch(self) -> None:
        """Start this run's watchdog (watchdog.py) once, before its first container: a builder killed outright
        leaves no container running, not even until the next run."""
        if self._watchdog is None:
            self._watchdog = subprocess.Popen([sys.executable, "-m", "builder.deploy.runtime.watchdog", self.run_label],
                                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                              start_new_session=True, text=True)

    def _unwatch(self) -> None:
        """Tell the watchdog the containers are removed, and let it go."""
        dog, self._watchdog = self._watchdog, None
        if dog is None:
            return
        try:
            dog.stdin.write(watchdog.DONE + "\n")
            dog.stdin.close()
            dog.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):  # it is gone, or slow: it finds nothing to remove
            pass

    def reap_orphans(self) -> list[str]:
        """Remove the smoke and bench containers of earlier runs whose builder is gone (killed outright: no handler
        ran; builder/owner.py), running or stopped; never one a live run owns. Returns their names."""
        try:
            found = self.client.containers.list(all=True, filters={"label": "io.builder.smoke=1"})
        except Exception:  # noqa: BLE001 - the daemon's answer is not needed to go on
            return []
        gone = []
        for c in found:
            spec = (getattr(c, "labels", None) or {}).get(labels_mod.OWNER)
            if spec and not owner_alive(spec):
                try:
                    c.remove(force=True)
                    gone.append(c.name)
                except Exception:  # noqa: BLE001 - removed meanwhile
                    pass
        if gone:
            log.warning("removed %d container(s) of earlier runs whose builder was killed: %s", len(gone),
                        ", ".join(gone))
        return gone

    @property
    def run_label(self) -> str:
        return f"{RUN_LABEL}={self.run_id}"

    def close(self) -> None:
        """Remove every container this launcher made (by the run's label), running or not. Safe to call twice."""
        try:
            found = self.client.containers.list(all=True, filters={"label": self.run_label})
        except Exception as exc:  # noqa: BLE001 - the daemon went away: nothing more can be done here
            log.warning("could not list this smoke run's containers (%s): %s", self.run_label, exc)
            return
        for c in found:
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - removed meanwhile
                pass
        self._unwatch()

    def where(self, path: Path) -> str:
        """Under /models/ as `builder serve` mounts a model."""
        return model_place(self.mounts, str(Path(path).resolve()))

    def _kwargs(self, env: dict[str, str]) -> dict:
        import docker as docker_sdk

        volumes = {h: {"bind": c, "mode": "ro"} for h, c in self.mounts.items()}
        kw = {"environment": env, "volumes": volumes}
        if self.gpus:
            kw["device_requests"] = [docker_sdk.types.DeviceRequest(device_ids=[str(i) for i in self.gpu_ids],
                                                                    capabilities=[["gpu"]]) if self.gpu_ids else
                                     docker_sdk.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        return kw

    def _run(self, entrypoint: list[str] | None, args: list[str], env: dict[str, str], **extra):
        """Create a container named builder-smoke-<random> with this run's label, then start it; one the daemon
        refused to start (or an interrupt stopped half-way) is removed. entrypoint None: the image's own."""
        name = f"builder-smoke-{uuid.uuid4().hex[:12]}"
        log.debug("docker run --name %s %s (SDK) --entrypoint %s %s", name, self.image,
                  entrypoint if entrypoint is not None else "<the image's>", args[:3])
        kw = {"entrypoint": entrypoint} if entrypoint is not None else {}
        self._watch()
        try:
            c = self.client.containers.create(self.image, command=args, name=name,
                                              labels={"io.builder.smoke": "1", RUN_LABEL: self.run_id,
                                                      labels_mod.OWNER: owner()},
                                              **kw, **self._kwargs(env), **extra)
            c.start()
            return c
        except BaseException:  # KeyboardInterrupt too: the daemon may have made it before the interrupt landed
            try:  # a failed start leaves the container in state "created"
                self.client.containers.get(name).remove(force=True)
            except Exception:  # noqa: BLE001 - never created
                pass
            raise

    def probe(self, command: str, spec: dict, env: dict[str, str], timeout: float) -> ProbeRun:
        import json

        probe = self.where(PROBE)
        c = self._run(["python3"], [probe, command, json.dumps(spec)], env, network_mode="none")
        try:
            try:
                code = c.wait(timeout=timeout).get("StatusCode", -1)
            except Exception:  # noqa: BLE001 - the SDK raises requests' ConnectionError on a read timeout
                c.kill()
                code = 124
            out = c.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            if code == 124:
                out += f"\nprobe {command} timed out after {timeout:g}s"
            return ProbeRun(code, out)
        finally:
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001
                pass

    def start(self, line: LaunchLine, env: dict[str, str], port: int, log_path: Path) -> ContainerServer:
        """The image's own ENTRYPOINT with the line's arguments, as `builder serve` runs it: an image whose
        ENTRYPOINT is wrong fails here, not after publish."""
        argv = line.argv
        try:
            c = self._run(None, list(line.args), env, ports={f"{port}/tcp": ("127.0.0.1", port)})
        except Exception as exc:  # noqa: BLE001 - docker.errors.APIError: port taken, no GPU runtime, ...
            raise StartFailed(f"the container did not start: {getattr(exc, 'explanation', None) or exc}") from None
        server = ContainerServer(c, log_path)

        def pump():
            with open(log_path, "wb") as out:
                out.write(f"$ docker run {self.image} {shlex.join(argv)}\n".encode())
                try:
                    for chunk in c.logs(stream=True, follow=True):
                        out.write(chunk)
                        out.flush()
                except Exception:  # noqa: BLE001 - the container went away
                    pass

        server._thread = threading.Thread(target=pump, daemon=True)
        server._thread.start()
        time.sleep(0.2)
        return server


class StartFailed(Exception):
    """The engine could not be started at all (its container was refused)."""



def local_image(client, ref: str):
    """The daemon's image REF (docker SDK Image), None when it has none."""
    try:
        return client.images.get(ref)
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound, or a reference the daemon refuses
        return None


def pull(client, ref: str) -> None:
    """Pull REF into the daemon (an image read from its registry is pulled only here: to run it)."""
    parsed = ImageRef.parse(ref)
    try:
        client.images.pull(parsed.name, tag=parsed.reference)
    except Exception as exc:  # noqa: BLE001 - docker.errors.APIError and requests' errors
        raise EnvironmentProblem(f"{ref}: the pull failed: {getattr(exc, 'explanation', None) or exc}") from None


# -- HTTP to the engine ------------------------------------------------------------------------------------
HUB_OFF = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something listens on (or holds) 127.0.0.1:port; connections left in TIME_WAIT do not count."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of GET url; status 0 and the error when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace") if exc.fp else ""
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {metric name: sum over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                pass
    return out


def find_key(obj, key):
    """A key anywhere in nested JSON (SGLang's server info is flat; be lenient about nesting)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def log_tail(path: Path, n: int = 25) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class BootFailed(Exception):
    """The engine exited during boot or was not ready in time; `tail` is the end of its log."""

    def __init__(self, why: str, tail: str = ""):
        super().__init__(why)
        self.why, self.tail = why, tail


@dataclass
class RunningEngine:
    """An engine started by a launcher on 127.0.0.1:port with its log streamed to log_path: wait until its
    health path answers 200, then talk to it; stop() ends it (and removes its container) whatever happened."""

    server: Server
    port: int
    log_path: Path
    health: str
    completions: str = "/v1/completions"
    started: float = field(default_factory=time.monotonic)
    boot_s: float | None = None
    watch_root: str = ""  # the cache root whose writes stop() reports ("": none)
    _before: dict = field(default_factory=dict)
    _mounts: tuple[str, ...] = ()

    @classmethod
    def start(cls, launcher: Launcher, line: LaunchLine, env: dict[str, str], port: int, log_path: Path,
              health: str, completions: str = "/v1/completions", watch_root: str = "") -> "RunningEngine":
        """Raises StartFailed when the launcher could not start it at all (a container refused). With `watch_root`
        (the cache root: a path in the container, or this host's directory for a process), stop() says what the
        run wrote there."""
        before = snapshot(watch_root) if watch_root and not isinstance(launcher, DockerLauncher) else {}
        t0 = time.monotonic()
        server = launcher.start(line, env, port, log_path)
        mounts = tuple(getattr(launcher, "mounts", {}).values())
        return cls(server, port, log_path, health, completions, t0, watch_root=watch_root, _before=before,
                   _mounts=mounts)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> float:
        """Seconds from the start until GET health answered 200; BootFailed when the engine exits first or
        the deadline passes."""
        deadline = self.started + timeout
        while True:
            code = self.server.exit_code()
            if code is not None:
                self.server.settle()
                raise BootFailed(f"the engine exited with code {code} during boot", self.log_tail())
            status, _ = http_get(self.base + self.health, timeout=5)
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise BootFailed(f"not ready after {timeout:g}s: GET {self.health} answered {status or 'nothing'} "
                                 "(last status)", self.log_tail())
            time.sleep(1.0)
        self.boot_s = round(time.monotonic() - self.started, 1)
        return self.boot_s

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        return http_get(self.base + path, timeout)

    def get_json(self, path: str, timeout: float = 5.0) -> tuple[int, object]:
        """(status of GET path, its JSON body; None unless 200 with JSON)."""
        code, body = self.get(path, timeout)
        try:
            return code, json.loads(body) if code == 200 else None
        except ValueError:
            return code, None

    def models(self) -> str | None:
        """The first model id of GET /v1/models (what requests name), None when it does not say."""
        code, body = self.get("/v1/models")
        if code == 200:
            try:
                return json.loads(body)["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                return None
        return None

    def metrics(self) -> tuple[int, dict[str, float]]:
        """(status of GET /metrics, its figures summed per name; {} unless 200)."""
        code, text = self.get("/metrics")
        return code, parse_metrics(text) if code == 200 else {}

    def complete(self, model: str, prompt: str, max_tokens: int, timeout: float) -> dict:
        """One streamed greedy completion: text, TTFT, latency and token count (from usage, else the chunks)."""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(self.base + self.completions, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        ttft, text, chunks, usage = None, "", 0, None
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("usage"):
                    usage = msg["usage"]
                for choice in msg.get("choices") or []:
                    piece = choice.get("text") or ""
                    if piece:
                        chunks += 1
                        text += piece
                        if ttft is None:
                            ttft = time.monotonic() - t0
        latency = time.monotonic() - t0
        tokens = (usage or {}).get("completion_tokens") or chunks
        return {"text": text, "ttft_s": ttft, "latency_s": latency, "output_tokens": tokens}

    def post(self, path: str, body: dict, timeout: float) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def call(self, path: str, timeout: float, body: str = "") -> int:
        """The status of a POST to path: empty (vLLM's /sleep and /wake_up answer 200 with no body), or `body` as
        JSON (SGLang's /release_memory_occupation reads its tags from one); 0 when nothing answered."""
        req = urllib.request.Request(self.base + path, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"} if body else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):
            return 0

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 25) -> str:
        return log_tail(self.log_path, n)

    def stop(self, capture_to: Path | None = None) -> Written | None:
        """End the engine (and remove its container); with a watched root, what the run wrote there (copied to
        `capture_to` when given)."""
        if not self.watch_root:
            self.server.stop()
            return None
        if isinstance(self.server, ContainerServer):
            return self.server.stop(self.watch_root, capture_to, self._mounts)
        self.server.stop()
        return process_written(self.watch_root, self._before, capture_to)
