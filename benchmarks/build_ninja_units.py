"""Compile work counted in the real build systems' own build.ninja, for the cell's archs and for upstream's default
arch list: vLLM 0.33.0 (its setup.py's CMake configure) and flash-attn 2.8.3 (its setup.py through torch 2.14.0's
BuildExtension), both with nvcc 13.0 and the knobs builder renders.

Neither build tool is run: setup.py stops where ninja would start (torch's _run_ninja_build, or setup.py's
`cmake --build`), so build.ninja is exactly what a build would execute. Counted: CUDA translation units (compile
edges) × SASS targets (`code=sm_XX` of the -gencode flags each one gets; PTX is not counted), per CMake target.

- flash-attn: FLASH_ATTN_CUDA_ARCHS as rendered, the engine data's patches, in a network namespace of its own
  (`unshare --net`, root), with the --python venv on this machine.
- vLLM: in the trixie devel base (GCC 14: vLLM >= 0.33 stops on GCC < 13; nvcc 13.0.88 from PyPI wheels) with
  `--network=none`, a venv of its Python with torch 2.14.0 (installed on first use, kept under --venv),
  TORCH_CUDA_ARCH_LIST from the arch knob, the build_env, and the deps stage's overrides (every *_SRC_DIR, CMAKE_ARGS
  with FETCHCONTENT_SOURCE_DIR_* and FETCHCONTENT_FULLY_DISCONNECTED=ON) pointing at /opt/deps/<source> as the
  committed fetch plan lays it out. Its GitHub repositories cannot be fetched here: give real checkouts with
  --source NAME=DIR; every other source is a stub (the files vLLM's CMake names, empty), named as such in the
  output, and kernels its CMake globs from a stub are not counted. Upstream's default arch list is read from the
  sdist's docker/Dockerfile.

    benchmarks/build_ninja_units.py [--engine vllm|flash-attn] [--python VENV/bin/python] [--arch 80,90]
        [--source vllm-flash-attn=DIR ...] [--json]

--python: a venv with torch==2.14.0 (PyPI, CUDA 13 build), setuptools, wheel, packaging, ninja, psutil, einops;
CUDA_HOME defaults to /usr/local/cuda-13.0 (nvcc 13.0.88).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder import archs as archs_mod  # noqa: E402
from builder import deps, gencode_filter  # noqa: E402
from builder.engines import recipe  # noqa: E402
from builder.lock import _download  # noqa: E402
from builder.lockfile import Lock  # noqa: E402
from builder.pypi import SimpleIndex  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VENV_DEFAULT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "builder-bench" / "torch-venv-trixie"

# Run inside the source tree with the environment the build stage sets: setup.py's build_ext until the build tool
# would start. flash-attn: torch's BuildExtension writes build.ninja, then runs ninja; vLLM: setup.py runs CMake's
# configure (which writes build.ninja), then `cmake --build`. Both hooks are set; whichever comes first stops it.
DRIVER = r"""
import runpy, subprocess, sys
import torch.utils.cpp_extension as ce

class Written(Exception):
    pass

def stop(*args, **kwargs):
    raise Written()

real_check_call = subprocess.check_call

def check_call(cmd, *args, **kwargs):
    if list(cmd)[:2] == ["cmake", "--build"]:
        raise Written()
    return real_check_call(cmd, *args, **kwargs)

ce._run_ninja_build = stop
subprocess.check_call = check_call
sys.argv = ["setup.py", "build_ext", "--build-temp", sys.argv[1], "--build-lib", sys.argv[1] + "/lib"]
try:
    runpy.run_path("setup.py", run_name="__main__")
except Written:
    print("build.ninja written")
"""
WRITTEN = "build.ninja written"

_EDGE = re.compile(r"^build (\S+): (\S+)")
_CUDA_RULE = re.compile(r"^(cuda_compile|CUDA_COMPILER__\S+)$")  # torch's BuildExtension | CMake's Ninja generator


@dataclass
class Counted:
    """The CUDA translation units of one build.ninja and the device code nvcc makes of each."""

    tus: list[tuple[str, str, list[str]]]  # (CMake target, or "extension" for BuildExtension; object; gencode entries)

    @staticmethod
    def codes(entries: list[str]) -> list[str]:
        return [c for e in entries for c in (gencode_filter.split_entry(e) or ("", []))[1]]

    def sass(self, entries: list[str]) -> list[str]:
        return sorted({c for c in self.codes(entries) if c.startswith("sm_")}, key=_arch_key)

    @property
    def units(self) -> int:
        return sum(len(self.sass(e)) for _, _, e in self.tus)

    def per_target(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for target, _, entries in self.tus:
            t = out.setdefault(target, {"tus": 0, "units": 0, "sass": set()})
            t["tus"] += 1
            t["units"] += len(self.sass(entries))
            t["sass"] |= set(self.sass(entries))
        return {k: {**v, "sass": sorted(v["sass"], key=_arch_key)} for k, v in sorted(out.items())}

    def entries(self) -> list[str]:
        return sorted({e for _, _, es in self.tus for e in es})

    def summary(self) -> dict:
        sass = sorted({s for _, _, e in self.tus for s in self.sass(e)}, key=_arch_key)
        return {"tus": len(self.tus), "units": self.units, "sass": sass, "gencode": self.entries(),
                "per_target": self.per_target()}


def _arch_key(code: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", code) or 0), code


def count(ninja: Path) -> Counted:
    """Every CUDA compile edge of a build.ninja with its own flags (CMake writes FLAGS per edge; torch's
    BuildExtension writes cuda_cflags/cuda_post_cflags once), and the gencode entries nvcc gets there."""
    lines = ninja.read_text().splitlines()
    glob = " ".join(m.group(1) for ln in lines if (m := re.match(r"^cuda_(?:post_)?cflags = (.*)$", ln)))
    tus = []
    for i, ln in enumerate(lines):
        m = _EDGE.match(ln)
        if not m or not _CUDA_RULE.match(m.group(2)):
            continue
        flags = glob
        for var in lines[i + 1:]:
            if not var.startswith("  "):
                break
            if var.strip().startswith("FLAGS = "):
                flags = var.strip()[len("FLAGS = "):]
        target = gencode_filter._TARGET_DIR.search(m.group(1))
        tus.append((target.group(1) if target else "extension", m.group(1),
                    re.findall(r"(?:-gencode|--generate-code)[= ](arch=\S+)", flags)))
    return Counted(tus)


# -- flash-attn 2.8.3: its setup.py, torch's BuildExtension, on this machine ---------------------------------

def configure_flash_attn(python: str, sdist: Path, archs: str | None, work: Path) -> Path:
    """Unpack, patch as the build stage does, run setup.py's build_ext up to build.ninja; returns the file."""
    with tarfile.open(sdist) as tf:
        tf.extractall(work, filter="data")
    (src,) = [p for p in work.iterdir() if p.is_dir()]
    r = recipe("flash-attn", "2.8.3")
    for pt in r.patches_for("2.14.0"):
        f = src / pt["file"]
        text = f.read_text()
        assert pt["replace"] in text, f"{pt['file']}: {pt['replace']!r} is gone: the engine data is out of date"
        f.write_text(text.replace(pt["replace"], pt["with"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_ATTN", "TORCH_CUDA"))}
    env.update(dict(r.build_env), CUDA_HOME=os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0"), MAX_JOBS="1")
    env["PATH"] = f"{Path(python).parent}:{env['CUDA_HOME']}/bin:{env.get('PATH', '')}"
    if archs is not None:
        env["FLASH_ATTN_CUDA_ARCHS"] = archs
    temp = work / "build"
    proc = subprocess.run(["unshare", "--net", python, "-c", DRIVER, str(temp)], cwd=src, env=env,
                          capture_output=True, text=True)
    if WRITTEN not in proc.stdout:
        raise SystemExit(f"setup.py did not reach build.ninja (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return temp / "build.ninja"


def flash_attn(python: str, asked: tuple[int, ...]) -> dict:
    knob = recipe("flash-attn", "2.8.3").knob_values(asked)
    sdist = _sdist("flash-attn==2.8.3")
    result = {}
    for label, value in (("cell", dict(knob)["FLASH_ATTN_CUDA_ARCHS"]), ("upstream default", None)):
        with tempfile.TemporaryDirectory(prefix="fa-ninja-") as tmp:
            counted = count(configure_flash_attn(python, sdist, value, Path(tmp)))
        result[label] = {**counted.summary(), "knob": f"FLASH_ATTN_CUDA_ARCHS={value}"}
    return result


def _sdist(key: str) -> Path:
    entry = Lock.load(REPO / "matrix.lock").data["packages"][key]["sdist"]
    return _download(SimpleIndex("https://pypi.org/simple"), entry["url"], entry["sha256"], entry["filename"])


# -- vLLM 0.33.0: its setup.py's CMake configure, in a container (GCC >= 13) with no network -----------------

VLLM = ("vllm", "0.33.0")
DEVEL_IMAGE = "builder-local/cuda:13.0-devel-trixie"  # GCC 14, Python 3.13, nvcc 13.0.88 (make-local-bases.sh --trixie)
VENV_IN = "/opt/bench-venv"
DEPS_IN = deps.DEPS_DIR
VENV_REQUIREMENTS = ["torch==2.14.0", "cmake>=3.26.1", "ninja", "setuptools>=77.0.3,<81", "setuptools-scm>=8",
                     "wheel", "packaging", "jinja2", "setuptools-rust"]


def _pip_passthrough() -> tuple[dict[str, str], dict[str, dict]]:
    """This machine's pip settings (index, extra indexes, find-links, constraints, CA bundle) as PIP_* variables for
    a container, with every local path they name mounted read-only at the same place."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    env: dict[str, str] = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    mounts: dict[str, dict] = {}
    for line in out.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line)
        if not m or m.group(1) not in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
            continue
        env["PIP_" + m.group(1).upper().replace("-", "_")] = m.group(2)
        for word in m.group(2).split():
            path = word.removeprefix("file://")
            if path.startswith("/") and Path(path).exists():
                top = Path(path) if Path(path).is_dir() else Path(path).parent
                if top.name == "simple":  # a local simple index links its files beside it (../files/...)
                    top = top.parent
                mounts[str(top)] = {"bind": str(top), "mode": "ro"}
    return env, mounts


def _container(client, image: str, command: list[str], **kwargs) -> tuple[int, str]:
    c = client.containers.run(image, command, detach=True, **kwargs)
    try:
        rc = c.wait()["StatusCode"]
        return rc, c.logs().decode(errors="replace")
    finally:
        c.remove(force=True)


def ensure_venv(client, venv: Path, image: str = DEVEL_IMAGE) -> None:
    """A venv of the devel base's Python with torch 2.14.0 and vLLM's build tools, kept on this machine (network
    on: this is the install, not the configure)."""
    check = [f"{VENV_IN}/bin/python", "-c", "import torch; assert torch.__version__.split('+')[0] == '2.14.0'"]
    mount = {str(venv): {"bind": VENV_IN, "mode": "rw"}}
    if venv.is_dir() and _container(client, image, check, volumes=mount, network_mode="none")[0] == 0:
        return
    venv.mkdir(parents=True, exist_ok=True)
    env, mounts = _pip_passthrough()
    script = f"python3 -m venv {VENV_IN} && {VENV_IN}/bin/pip install " + " ".join(shlex.quote(r) for r in VENV_REQUIREMENTS)
    rc, logs = _container(client, image, ["bash", "-c", script], volumes={**mount, **mounts}, environment=env)
    if rc != 0:
        raise SystemExit(f"installing torch 2.14.0 into {venv} failed:\n{logs[-3000:]}")


def stub_source(source, cmake_dir: Path, dest: Path) -> str:
    """A stand-in for a repository that cannot be fetched here: a directory holding (empty) every file the
    engine's own CMake names under that source's directory, so the configure gets through; its kernels are not
    counted where its CMake globs them, nor where the source's own CMake would add them: the returned line says
    which of the two applies."""
    root = dest / (source.override_subpath or "")
    root.mkdir(parents=True, exist_ok=True)
    # FetchContent_MakeAvailable adds a source's own CMakeLists.txt as a subdirectory: the stub's adds nothing
    (root / "CMakeLists.txt").write_text(f"# stub standing in for {source.repository} at {source.commit}\n")
    text = (cmake_dir / source.cmake_file).read_text()
    for rel in re.findall(r"\$\{[A-Za-z0-9_-]+_SOURCE_DIR\}/([^\s)\"${}]+)", text):
        f = root / rel
        if Path(rel).suffix and "*" not in rel:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
        elif "*" not in rel:
            f.mkdir(parents=True, exist_ok=True)
    caveats = []
    if re.search(r"file\(GLOB[^)]*_SOURCE_DIR\}/[^)\s]*\.cu\b", text):
        caveats.append("the CUDA sources its CMake globs there are not counted")
    if re.search(rf"FetchContent_MakeAvailable\(\s*{re.escape(source.name)}\s*\)", text):
        caveats.append("FetchContent_MakeAvailable would add its CMakeLists.txt, if it has one")
    return "stub" + (f" ({'; '.join(caveats)})" if caveats else "")


def vllm_sources(real: dict[str, Path], stubs_dir: Path, src: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """Mounts for /opt/deps (the deps stage's layout) and, per source, what stands there: a real checkout given
    with --source, or a stub."""
    mounts, kinds = {}, {}
    for s in deps.plan_sources(*VLLM):
        where = f"{DEPS_IN}/{s.name}"
        if s.name in real:
            mounts[str(real[s.name].resolve())] = {"bind": where, "mode": "ro"}
            kinds[s.name] = f"real ({real[s.name]})"
        else:
            kinds[s.name] = stub_source(s, src, stubs_dir / s.name)
            mounts[str(stubs_dir / s.name)] = {"bind": where, "mode": "ro"}
    return mounts, kinds


def vllm_env(arch_list: str) -> dict[str, str]:
    """The compile step's environment as builder renders it (arch knob, build_env, the deps stage's overrides)."""
    r = recipe(*VLLM)
    ctx = deps.deps_context(*VLLM, fetchcontent=tuple(n for n, _ in r.fetch_overrides))
    env = {**dict(r.build_env), **dict(ctx["env"]), "TORCH_CUDA_ARCH_LIST": arch_list, "MAX_JOBS": "2",
           "NVCC_THREADS": "1", "CUDA_HOME": CUDA_ROOT, "PATH": f"{VENV_IN}/bin:{CUDA_ROOT}/bin:/usr/bin:/bin"}
    return env


def upstream_arch_list(src: Path) -> str:
    """The arch list vLLM's own release Dockerfile builds (`ARG torch_cuda_arch_list=...`)."""
    m = re.search(r"^ARG torch_cuda_arch_list='([^']+)'", (src / "docker" / "Dockerfile").read_text(), re.M)
    if not m:
        raise SystemExit("docker/Dockerfile of the vLLM sdist has no torch_cuda_arch_list default")
    return m.group(1)


# The devel base's toolkit (PyPI's nvcc wheels) has no NVRTC and no driver stub, which vLLM's CMake links
# (CUDA::nvrtc, CUDA::cuda_driver); NVIDIA's devel images ship both (lib64/libnvrtc.so, lib64/stubs/libcuda.so).
# The configure only needs them to exist: a toolkit root of links to the base's nvcc and headers, torch's own
# NVRTC 13.0 (nvidia-cuda-nvrtc, in the venv), and an empty shared object standing in for the driver stub.
CUDA_ROOT = "/tmp/cuda"
CUDA_ROOT_SCRIPT = "; ".join([
    f"mkdir -p {CUDA_ROOT}/lib/stubs",
    f"for d in bin include nvvm; do ln -s /usr/local/cuda/$d {CUDA_ROOT}/$d; done",
    f"for f in /usr/local/cuda/lib/* {VENV_IN}/lib/python3*/site-packages/nvidia/cu13/lib/*.so.*; do "
    f"[ -e {CUDA_ROOT}/lib/$(basename $f) ] || ln -s $f {CUDA_ROOT}/lib/; "
    f"n=$(basename $f); [ -e {CUDA_ROOT}/lib/${{n%%.so.*}}.so ] || ln -s $f {CUDA_ROOT}/lib/${{n%%.so.*}}.so; done",
    f"ln -s lib {CUDA_ROOT}/lib64",
    f"gcc -shared -o {CUDA_ROOT}/lib/stubs/libcuda.so -x c /dev/null",
])


def configure_vllm(client, venv: Path, sdist: Path, mounts: dict, arch_list: str, work: Path,
                   image: str = DEVEL_IMAGE) -> tuple[Path, str]:
    """vLLM's setup.py build_ext up to its CMake configure's build.ninja, in the GCC 14 devel base with
    --network=none; returns (build.ninja, the configure's output)."""
    script = (f"set -e; {CUDA_ROOT_SCRIPT}; mkdir -p /tmp/src && tar -xzf /sdist.tar.gz --strip-components=1 -C /tmp/src"
              f" && cd /tmp/src && {VENV_IN}/bin/python -c \"$DRIVER\" /out/build")
    volumes = {**mounts, str(venv): {"bind": VENV_IN, "mode": "ro"}, str(sdist): {"bind": "/sdist.tar.gz", "mode": "ro"},
               str(work): {"bind": "/out", "mode": "rw"}}
    rc, logs = _container(client, image, ["bash", "-c", script], volumes=volumes, network_mode="none",
                          environment={**vllm_env(arch_list), "DRIVER": DRIVER, "FETCHCONTENT_BASE_DIR": "/out/deps"})
    if WRITTEN not in logs:
        errors = "\n".join(m.group(0) for m in re.finditer(r"^CMake Error.*(?:\n(?!-- ).*){0,12}", logs, re.M))
        raise SystemExit(f"vLLM's configure did not reach build.ninja (exit {rc}):\n{errors or logs[-5000:]}")
    return work / "build" / "build.ninja", logs


def downloads(work: Path, logs: str) -> list[str]:
    """What the configure fetched: FetchContent populates a download through a *-subbuild project; CMake's
    file(DOWNLOAD) and git clones print their URL."""
    found = [str(p.relative_to(work)) for p in work.rglob("*-subbuild")]
    found += re.findall(r"(?:Cloning into|Downloading) \S+", logs)
    return found


def vllm(venv: Path, asked: tuple[int, ...], real: dict[str, Path], keep: Path | None = None) -> dict:
    import docker

    client = docker.from_env()
    ensure_venv(client, venv)
    sdist = _sdist("vllm==0.33.0")
    r = recipe(*VLLM)
    # what plan and the image labels say the build emits, held against what build.ninja makes nvcc emit
    result: dict = {"planned_sass": list(r.built_sass(asked, "13.0"))}  # the devel base's nvcc 13.0
    with tempfile.TemporaryDirectory(prefix="vllm-ninja-") as tmp:
        tmp = Path(tmp)
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp / "sdist", filter="data")
        (src,) = (tmp / "sdist").iterdir()
        mounts, kinds = vllm_sources(real, tmp / "stubs", src)
        result["sources"] = kinds
        cell_list = dict(r.knob_values(asked))["TORCH_CUDA_ARCH_LIST"]
        for label, arch_list in (("cell", cell_list), ("upstream default", upstream_arch_list(src))):
            work = tmp / label.replace(" ", "-")
            work.mkdir()
            ninja, logs = configure_vllm(client, venv, sdist, mounts, arch_list, work)
            counted = count(ninja)
            cache = (ninja.parent / "CMakeCache.txt").read_text()
            result[label] = {**counted.summary(), "knob": f"TORCH_CUDA_ARCH_LIST={arch_list}",
                             "downloads": downloads(work, logs),
                             "disconnected": "FETCHCONTENT_FULLY_DISCONNECTED:BOOL=ON" in cache,
                             "status": [ln for ln in logs.splitlines() if re.search(
                                 r"CUDA target architectures|_ARCHS:|will not compile|Building .* for archs|"
                                 r"CUDA architectures:", ln)],
                             "gencode_outside": outside(counted, asked, r.arch_scoped) if label == "cell" else []}
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"vllm-{label.replace(' ', '-')}.build.ninja").write_text(ninja.read_text())
    return result


def outside(counted: Counted, asked: tuple[int, ...], scopes) -> list[str]:
    """Gencode codes of the build that serve no requested GPU loading that target's binary (gencode_filter.keep,
    the rule the audit and the filter use; a target's binary found by the engine data's arch_scoped globs)."""
    bad = set()
    for target, obj, entries in counted.tus:
        scope = archs_mod.scope_for(f"vllm/{target}.abi3.so", scopes) or \
            archs_mod.scope_for(f"vllm/vllm_flash_attn/{target}.abi3.so", scopes)
        config = ({"all_but": list(scope.all_but)} if scope.all_but else {"archs": list(scope.archs)}) if scope else None
        bad |= {f"{target}: {c} ({obj.split('.dir/', 1)[-1].removesuffix('.o')})"
                for c in Counted.codes(entries) if not gencode_filter.keep(c, asked, config)}
    return sorted(bad)


def _print(name: str, result: dict) -> None:
    for label in ("cell", "upstream default"):
        r = result[label]
        print(f"{name} {label:<17} {r['knob']}: {r['tus']} CUDA TUs, {r['units']} TU×SASS units "
              f"({' '.join(r['sass'])})")
        for target, t in r["per_target"].items():
            print(f"    {target:<28} {t['tus']:>4} TUs {t['units']:>5} units  {' '.join(t['sass'])}")
    cell, default = result["cell"], result["upstream default"]
    print(f"{name}: ratio {cell['units']} / {default['units']} = {100 * cell['units'] / default['units']:.1f} % "
          f"of upstream's default build")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("flash-attn", "vllm"), action="append",
                    help="what to count (repeatable; default: both)")
    ap.add_argument("--python", help="flash-attn: python of a venv with torch 2.14.0 on this machine")
    ap.add_argument("--venv", type=Path, default=VENV_DEFAULT,
                    help="vLLM: the devel base's venv with torch 2.14.0 (made on first use)")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=DIR",
                    help="vLLM: a real checkout of a fetch-plan source (every other one is a stub, named as such)")
    ap.add_argument("--keep", type=Path, help="vLLM: copy the build.ninja files here")
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    engines = args.engine or ["flash-attn", "vllm"]
    asked = archs_mod.parse(args.arch)
    known = {s.name for s in deps.plan_sources(*VLLM)}
    real = {}
    for spec in args.source:
        name, _, where = spec.partition("=")
        if name not in known or not Path(where).is_dir():
            print(f"--source {spec}: expected NAME=DIR with NAME one of {', '.join(sorted(known))} and DIR a "
                  "directory", file=sys.stderr)
            return 2
        real[name] = Path(where)
    if "flash-attn" in engines and not args.python:
        print("--python is required to count flash-attn", file=sys.stderr)
        return 2
    result = {}
    if "flash-attn" in engines:
        result["flash-attn 2.8.3"] = flash_attn(args.python, asked)
    if "vllm" in engines:
        result["vLLM 0.33.0"] = vllm(args.venv, asked, real, args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, r in result.items():
        if "sources" in r:
            print(f"{name} sources: " + ", ".join(f"{k} {v}" for k, v in r["sources"].items()))
            for ln in r["cell"]["status"]:
                print(f"    configure: {ln.strip()}")
        _print(name, r)
        if "downloads" in r["cell"]:
            for label in ("cell", "upstream default"):
                print(f"{name} {label}: downloads {r[label]['downloads'] or 'none'}, FETCHCONTENT_FULLY_DISCONNECTED "
                      f"{'ON' if r[label]['disconnected'] else 'off'}, network none")
            print(f"{name} cell: gencode outside the requested archs and scopes: {r['cell']['gencode_outside'] or 'none'}")
            print(f"{name} cell: plan says SASS {' '.join(r['planned_sass'])}; build.ninja has {' '.join(r['cell']['sass'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
