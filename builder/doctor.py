"""Host checks for ``builder doctor``: is this machine able to build, prove and publish images?

Pure functions over subprocess and HTTP: no click here. Every check has a timeout, none raises on a
missing tool, and every failing check says how to fix it.
"""

from __future__ import annotations

import glob
import json
import http.client
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import docker, net
from .net import is_loopback
from .errors import BuilderError, EnvironmentProblem

SETUP_FIX = "run scripts/setup-docker.sh (as root): it installs and starts Docker with buildx"

# BuildKit 0.13 (vendored by Docker Engine 26) is the first with rewrite-timestamp for reproducible
# OCI exports; buildx 0.13 is the matching client.
MIN_BUILDKIT = Version("0.13")
MIN_BUILDX = Version("0.13")
MIN_ENGINE_FOR_BUILDKIT_013 = 26
MIN_CLIENT_MAJOR = 23  # older clients lack the buildx plugin integration

TIMEOUT = 20.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None


def _run(argv: list[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); 127 when the tool is missing, 124 on timeout."""
    return docker.probe(argv, timeout)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _version(text: str) -> Version | None:
    """The first dotted version in text (``v0.13.1+ds1`` -> 0.13.1+ds1)."""
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?(?:[-+][0-9A-Za-z.+~-]*)?)", text)
    if not m:
        return None
    raw = m.group(1)
    for candidate in (raw, raw.replace("~", "."), re.split(r"[-+~]", raw)[0]):
        try:
            return Version(candidate)
        except InvalidVersion:
            continue
    return None


def _base(v: Version) -> Version:
    return Version(v.base_version)


# --- Docker ------------------------------------------------------------------------------------


def check_docker_client() -> Check:
    code, out, err = _run(["docker", "version", "--format", "{{.Client.Version}}"])
    version = out.strip()
    if code == 127 or not version:
        return Check("docker client", False, _first_line(err) or "docker client not found", SETUP_FIX)
    v = _version(version)
    if v is None or v.major < MIN_CLIENT_MAJOR:
        return Check(
            "docker client",
            False,
            f"{version} (need {MIN_CLIENT_MAJOR} or newer)",
            f"install a Docker CLI {MIN_CLIENT_MAJOR}+ first on PATH; {SETUP_FIX}",
        )
    return Check("docker client", True, f"{version} at {shutil.which('docker')}")


def _daemon_info() -> tuple[dict | None, str]:
    code, out, err = _run(["docker", "info", "--format", "{{json .}}"], timeout=30)
    if code != 0:
        return None, _first_line(err) or f"docker info exited {code}"
    try:
        info = json.loads(out)
    except json.JSONDecodeError:
        return None, "docker info printed no JSON"
    if not info.get("ServerVersion"):
        errors = info.get("ServerErrors") or ["no server version"]
        return None, str(errors[0])
    return info, ""


def check_daemon(info: dict | None, error: str) -> Check:
    if info is None:
        return Check("docker daemon", False, f"not reachable: {error}", SETUP_FIX)
    return Check(
        "docker daemon",
        True,
        f"{info['ServerVersion']} ({info.get('Driver', '?')}, {info.get('OperatingSystem', '?')})",
    )


def check_buildx() -> Check:
    code, out, err = _run(["docker", "buildx", "version"])
    if code != 0:
        return Check("buildx", False, _first_line(err) or "docker buildx is not installed", SETUP_FIX)
    parts = out.split()
    version = parts[1] if len(parts) > 1 else out.strip()
    v = _version(version)
    if v is None:
        return Check("buildx", True, f"{version} (version not parsed)")
    if _base(v) < MIN_BUILDX:
        return Check("buildx", False, f"{version} (need {MIN_BUILDX} or newer)", SETUP_FIX)
    return Check("buildx", True, version)


def check_buildkit(info: dict | None) -> Check:
    if info is None:
        return Check("BuildKit", False, "docker daemon not reachable", SETUP_FIX)
    code, out, err = _run(["docker", "buildx", "inspect", "--bootstrap"], timeout=60)
    if code != 0:
        return Check("BuildKit", False, _first_line(err) or "docker buildx inspect failed", SETUP_FIX)
    m = re.search(r"^BuildKit version:\s*(\S+)", out, re.M)
    driver_m = re.search(r"^Driver:\s*(\S+)", out, re.M)
    driver = driver_m.group(1) if driver_m else "?"
    raw = m.group(1) if m else ""
    v = _version(raw) if raw else None
    need = f"BuildKit {MIN_BUILDKIT}+ (rewrite-timestamp for reproducible exports)"
    if v is not None and _base(v) > Version("0"):
        if _base(v) < MIN_BUILDKIT:
            return Check("BuildKit", False, f"{raw} on driver {driver}; need {need}", SETUP_FIX)
        return Check("BuildKit", True, f"{raw} (driver {driver})")
    # Distribution builds of dockerd (Debian's among them) report v0.0.0+unknown: they vendor the
    # BuildKit of their engine release.
    engine = _version(info.get("ServerVersion", ""))
    if driver == "docker" and engine is not None and engine.major >= MIN_ENGINE_FOR_BUILDKIT_013:
        return Check(
            "BuildKit",
            True,
            f"{raw or 'unreported'} (driver docker: the BuildKit vendored by dockerd "
            f"{info['ServerVersion']}, 0.13 or newer)",
        )
    return Check(
        "BuildKit",
        False,
        f"{raw or 'unreported'} on driver {driver} with dockerd {info.get('ServerVersion')}; need {need}",
        SETUP_FIX,
    )


def check_snapshotter(info: dict | None) -> Check:
    if info is None:
        return Check("containerd snapshotter", False, "docker daemon not reachable", SETUP_FIX)
    status = {row[0]: row[1] for row in info.get("DriverStatus") or [] if len(row) == 2}
    if status.get("driver-type") == "io.containerd.snapshotter.v1":
        return Check("containerd snapshotter", True, f"on (storage driver {info.get('Driver', '?')})")
    return Check(
        "containerd snapshotter",
        False,
        f"off (storage driver {info.get('Driver', '?')}): OCI exports with rewrite-timestamp need the "
        "containerd image store",
        'add {"features": {"containerd-snapshotter": true}} to the dockerd config file and restart '
        "dockerd (scripts/setup-docker.sh does both)",
    )


# --- Tools and registry --------------------------------------------------------------------------


def check_skopeo() -> Check:
    code, out, err = _run(["skopeo", "--version"])
    if code != 0:
        return Check(
            "skopeo",
            False,
            _first_line(err) or "skopeo --version failed",
            "apt-get install skopeo (scripts/setup-docker.sh installs it); publishing pushes OCI archives with it",
        )
    v = _version(out)
    return Check("skopeo", True, str(v) if v else _first_line(out))


def _registry_host(registry: str) -> str:
    host = re.sub(r"^[a-z]+://", "", registry.strip())
    return host.split("/")[0]


def _get_v2(url: str, timeout: float) -> tuple[int | None, str]:
    """(HTTP status, what is wrong); an answer without the registry API's header or JSON is not a registry."""
    try:
        with net.urlopen(url, url, timeout=timeout) as resp:
            status, body, headers = resp.status, net.read_urllib(resp, url, limit=1 << 20), resp.headers
    except urllib.error.HTTPError as exc:
        try:
            status, body, headers = exc.code, net.read_urllib(exc, url, limit=1 << 20), exc.headers
        except (BuilderError, OSError):
            return exc.code, ""
    except (urllib.error.URLError, OSError, ValueError, BuilderError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)
    if status in (200, 401) and not net.speaks_registry_api(headers, body):
        return None, f"HTTP {status} without the registry API's header or JSON (not an OCI registry)"
    return status, ""


def check_registry(registry: str, timeout: float | None = None) -> Check:
    """GET /v2/ under one deadline per request: BUILDER_REMOTE_TIMEOUT, at most 5 s (a check, not a transfer)."""
    timeout = min(5.0, net.timeouts()[1]) if timeout is None else timeout
    host = _registry_host(registry)
    schemes = ["http"] if is_loopback(host) else ["https", "http"]
    errors = []
    for scheme in schemes:
        url = f"{scheme}://{host}/v2/"
        status, error = _get_v2(url, timeout)
        if status in (200, 401):
            auth = "auth required" if status == 401 else "no auth"
            return Check("registry", True, f"{url} answers {status} ({auth})")
        errors.append(f"{url}: {error or f'HTTP {status}'}")
    return Check(
        "registry",
        False,
        "not reachable: " + "; ".join(errors),
        f"start the registry or fix the address (GET /v2/ on {host} must answer 200 or 401); "
        "for a local one: docker-registry serve CONFIG with http.addr set to that host:port",
    )


# --- GPUs and CUDA -------------------------------------------------------------------------------


def check_gpus() -> tuple[Check, bool]:
    """(check, whether GPUs were found). No GPU is informational: builds need none."""
    from .deploy.runtime import gpus as gpus_mod

    try:
        found = gpus_mod.read()
    except EnvironmentProblem as exc:  # a line nvidia-smi printed is no GPU
        found = gpus_mod.HostGpus((), str(exc), failed=True, error=str(exc))
    if found.failed:
        return (
            Check(
                "NVIDIA GPUs",
                False,
                f"nvidia-smi fails: {found.error}",
                "fix the NVIDIA driver installation (nvidia-smi must list the GPUs), or remove nvidia-smi "
                "from PATH on a build-only host",
            ),
            False,
        )
    if not found.present:
        why = "no GPU (nvidia-smi not found)" if "not found" in found.why_none else "no GPU listed by nvidia-smi"
        return Check("NVIDIA GPUs", True, f"{why}: GPU boot tests will skip"), False
    names: dict[str, int] = {}
    for g in found.gpus:
        label = f"{g.name} (sm_{g.compute_cap})"
        names[label] = names.get(label, 0) + 1
    listed = ", ".join(f"{n} x {label}" for label, n in names.items())
    return Check("NVIDIA GPUs", True, f"{listed}; driver {found.gpus[0].driver}"), True


def check_gpu_containers(info: dict | None) -> Check:
    runtimes = (info or {}).get("Runtimes") or {}
    cdi = [p for d in ("/etc/cdi", "/var/run/cdi") for p in glob.glob(f"{d}/*nvidia*")]
    if "nvidia" in runtimes or cdi:
        how = "nvidia runtime" if "nvidia" in runtimes else f"CDI spec {cdi[0]}"
        return Check("GPU containers", True, how)
    return Check(
        "GPU containers",
        False,
        "GPUs present but docker has no nvidia runtime and no CDI spec",
        "install nvidia-container-toolkit, then: nvidia-ctk runtime configure --runtime=docker "
        "and restart dockerd",
    )


CUDA_ROOT = Path("/usr/local")  # where CUDA toolkits install: cuda/ (the default one) and cuda-X.Y/


def _toolkit_version(nvcc: Path) -> tuple[int, ...]:
    """cuda-13.0/bin/nvcc → (13, 0): toolkits compare by version (as text, cuda-9.2 would beat cuda-13.0)."""
    return tuple(int(n) for n in re.findall(r"\d+", nvcc.parent.parent.name))


def find_nvcc() -> str | None:
    """The host nvcc: on PATH, else CUDA_ROOT/cuda/bin, else the newest CUDA_ROOT/cuda-X.Y/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    toolkits = sorted(CUDA_ROOT.glob("cuda-*/bin/nvcc"), key=_toolkit_version, reverse=True)
    for candidate in [CUDA_ROOT / "cuda" / "bin" / "nvcc", *toolkits]:
        if candidate.is_file():
            return str(candidate)
    return None


def check_host_nvcc() -> Check:
    nvcc = find_nvcc()
    if nvcc is None:
        return Check("nvcc (host)", True, "not found; not needed: images compile with their own nvcc")
    code, out, err = _run([nvcc, "--version"])
    if code != 0:
        return Check(
            "nvcc (host)",
            False,
            f"{nvcc} --version fails: {_first_line(err) or f'exit {code}'}",
            f"repair or remove {nvcc}; the host nvcc is optional",
        )
    m = re.search(r"release (\S+), V(\S+)", out)
    detail = f"{m.group(1)} (V{m.group(2)})" if m else _first_line(out)
    return Check("nvcc (host)", True, f"{detail} at {nvcc}")


def check_devel_gcc(cells) -> list[Check]:
    """The GCC of each devel base a selected cell compiles a package with a GCC floor on (engine data min_gcc):
    measured in the image where it is local (`gcc -dumpfullversion`), else the OS's from the engine data."""
    out = []
    for base in dict.fromkeys(c.base_devel for c in cells):
        pkgs = [p for c in cells if c.base_devel == base for p in c.packages if p.recipe.min_gcc and p.compiled_here]
        if not pkgs:
            continue
        gcc, how = "", "its OS (engine data)"
        if docker.image_exists(base):
            code, got, err = _run(["docker", "run", "--rm", "--network=none", "--entrypoint", "gcc", base, "-dumpfullversion"])
            gcc, how = (got.strip(), "measured") if code == 0 else ("", f"gcc does not run in it: {_first_line(err)}")
        gcc = gcc or pkgs[0].base_gcc
        problems = sorted({p.gcc_problem(gcc) for p in pkgs} - {""})
        need = ", ".join(sorted({f"{p.name} {p.version} >= {p.recipe.min_gcc}" for p in pkgs}))
        if problems:
            out.append(Check(f"GCC in {base}", False, f"{gcc} ({how}); needed: {need}",
                             "a devel base whose OS has GCC >= the floor (ubuntu24.04; locally "
                             "`scripts/make-local-bases.sh --trixie` and os = \"trixie\")"))
        else:
            out.append(Check(f"GCC in {base}", True, f"{gcc or 'unknown'} ({how}); needed: {need}"))
    return out


# --- All of them ---------------------------------------------------------------------------------


def run_checks(registry: str | None = None) -> list[Check]:
    checks = [check_docker_client()]
    info, error = _daemon_info()
    checks.append(check_daemon(info, error))
    checks.append(check_buildx())
    checks.append(check_buildkit(info))
    checks.append(check_snapshotter(info))
    checks.append(check_skopeo())
    if registry:
        checks.append(check_registry(registry))
    gpu_check, have_gpus = check_gpus()
    checks.append(gpu_check)
    if have_gpus:
        checks.append(check_gpu_containers(info))
    checks.append(check_host_nvcc())
    return checks
