"""rehearse: compile a few real translation units of each package a cell compiles, exactly as its build would,
before the hours of the whole compile — and measure them.

1. Capture. The package's own build command runs in its build stage (the rendered Dockerfile up to the compile
   RUN: same image, WORKDIR, ENV, MAX_JOBS/NVCC_THREADS) with no network, and stops where the compile would
   start: a build tool run through Python (torch's BuildExtension running `ninja`, a setup.py or scikit-build
   running `cmake --build`) is stopped at that call and `ninja -t compdb` lists every compile edge of its
   build.ninja; a setup.py that calls nvcc itself meets a recording nvcc instead (CUDA_HOME, as `with-sccache
   --cuda-home` gives it), which writes down the command and an empty output.
2. Choose. Every CUDA translation unit with its SASS targets (`code=sm_XX` of its -gencode flags): kernel×arch
   units. Per binary (CMake target, or the package for other builds) the heaviest unit (most SASS targets, then
   the largest source), plus any unit a --unit pattern names.
3. Compile and measure. Each chosen unit's own command, through the build's `with-sccache` (so its objects land in
   the object cache the build reads), in a container of the build stage: wall seconds, the peak resident memory
   of every process of the container (nvcc, cudafe++, cicc, ptxas, sccache; anonymous pages, sampled every
   50 ms), the cgroup's own peak where the kernel gives it, and the audit of the object (its fatbin's SASS, read as `builder audit`
   reads it, against the command's gencode and the plan's SASS).
4. Project. nvcc thread-seconds per kernel×arch unit (per SASS set: a sm_90a-only CUTLASS 3.x unit costs what
   the measured sm_90a units cost) × the package's units ÷ the nvcc threads the build would run, where
   those threads come from the measured memory per nvcc thread through the same rule as the build's
   (builder/resources.py) — printed beside the engine data's GB per thread and the history estimate.

`run` is the verb (builder/cli/rehearse.py parses its options and prints). Every docker command goes through
builder/docker.py (logged, CommandError on failure); what runs inside the containers is builder/rehearsal/
(capture_site.py, nvcc.py, measure.py), mounted read-only at PROGRAMS_DIR.

Failures the user can fix exit 2 (UserError), naming what to do: nvcc killed for memory (its peak, the MAX_JOBS
that fits), a GCC older than the engine's minimum (measured in the stage), a missing header (what provides it).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import re
import secrets
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import docker, gencode_filter
from .audit import read_fatbin_entries
from .errors import CommandError, UserError
from .estimate import threads as threads_at
from .resources import RAM_HEADROOM, Host, choose

MIB = 1024 * 1024
REHEARSAL_DIR = "/rehearsal"  # the host directory (writable) mounted into every rehearsal container
PROGRAMS = Path(__file__).with_name("rehearsal")  # the in-container programs, shipped in the package
PROGRAMS_DIR = "/rehearsal-programs"  # where every rehearsal container sees them (mounted read-only)
SCCACHE_DIR = "/root/.cache/sccache"  # with-sccache's object cache (the build's cache mount)


@dataclass(frozen=True)
class Unit:
    """One translation unit as the build compiles it."""

    binary: str  # the CMake target, or the package for a build without targets
    source: str
    output: str  # the object, absolute inside the build stage
    command: str  # a shell command, run in `cwd`
    cwd: str
    sass: tuple[str, ...]  # code=sm_XX of its -gencode flags
    nvcc_threads: int = 1  # its --threads / -t (nvcc compiles that many archs at once)

    @property
    def units(self) -> int:
        return len(self.sass)

    @property
    def threads(self) -> int:
        """nvcc threads this unit keeps busy: --threads, at most one per SASS target."""
        return max(1, min(self.nvcc_threads, self.units or 1))

    def to_json(self) -> dict:
        return {"binary": self.binary, "source": self.source, "object": self.output, "sass": list(self.sass),
                "kernel_arch_units": self.units, "nvcc_threads": self.nvcc_threads}


def _arch_key(code: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", code) or 0), code


def sass_of(words: list[str]) -> tuple[str, ...]:
    entries = []
    for i, w in enumerate(words):
        if w in ("-gencode", "--generate-code") and i + 1 < len(words):
            entries.append(words[i + 1])
        elif w.startswith(("-gencode=", "--generate-code=")):
            entries.append(w.split("=", 1)[1])
    codes = {c for e in entries for c in (gencode_filter.split_entry(e) or ("", []))[1] if c.startswith("sm_")}
    return tuple(sorted(codes, key=_arch_key))


def _threads_of(words: list[str]) -> int:
    for i, w in enumerate(words):
        m = re.fullmatch(r"(?:--threads|-t)(?:=(\d+))?", w)
        if m:
            value = m.group(1) or (words[i + 1] if i + 1 < len(words) else "1")
            return int(value) if value.isdigit() and int(value) > 0 else 1
    return 1


_TARGET = re.compile(r"CMakeFiles/([^/]+)\.dir/")


def _unit(binary_default: str, source: str, output: str, command: str, cwd: str) -> Unit:
    words = shlex.split(command)
    target = _TARGET.search(output)
    if not output.startswith("/"):
        output = str(Path(cwd) / output)
    return Unit(target.group(1) if target else binary_default, source, output, command, cwd, sass_of(words),
                _threads_of(words))


def units_from_capture(out: Path, package: str) -> list[Unit]:
    """The CUDA translation units the capture wrote: compdb-*.json (a build.ninja) and nvcc.jsonl (nvcc calls)."""
    units = []
    for f in sorted(out.glob("compdb-*.json")):
        for e in json.loads(f.read_text())["entries"]:
            if e.get("file", "").endswith(".cu"):
                units.append(_unit(package, e["file"], e.get("output", ""), e["command"], e["directory"]))
    nvcc = out / "nvcc.jsonl"
    if nvcc.is_file():
        for line in nvcc.read_text().splitlines():
            rec = json.loads(line)
            argv = rec["argv"]
            cus = [a for a in argv[1:] if a.endswith(".cu")]
            if "-c" in argv and cus:
                units.append(_unit(package, cus[0], argv[argv.index("-o") + 1], shlex.join(argv), rec["cwd"]))
    # one object, one unit: a compile both lists record (flash-attn's setup.py: build.ninja's edge and the nvcc
    # call the recorder met) is compiled once by the build; the build.ninja edge is kept
    seen, out_units = set(), []
    for u in units:
        where = os.path.normpath(os.path.join(u.cwd, u.output)) if u.output else (u.cwd, u.source, u.command)
        if where not in seen:
            seen.add(where)
            out_units.append(u)
    return out_units


def matches(source: str, pattern: str) -> bool:
    """A --unit pattern: fnmatch on the source's path, or a substring of it."""
    return fnmatch.fnmatch(source, pattern) or pattern in source


def pick(units: list[Unit], patterns: tuple[str, ...] = (), size=None) -> list[Unit]:
    """Per binary its heaviest unit (most SASS targets, then `size(source)`, largest first), then every unit
    whose source matches one of `patterns` (fnmatch on the path, or a substring of it)."""
    size = size or (lambda s: 0)
    chosen: dict[str, Unit] = {}
    for u in units:
        best = chosen.get(u.binary)
        if best is None or (u.units, size(u.source)) > (best.units, size(best.source)):
            chosen[u.binary] = u
    out = list(chosen.values())
    for pat in patterns:
        matched = [u for u in units if matches(u.source, pat)]
        if not matched:
            raise UserError(f"--unit {pat!r}: no CUDA translation unit of the build matches it")
        out += [u for u in matched[:1] if u not in out]
    return out


@dataclass
class Measured:
    unit: Unit
    returncode: int
    seconds: float
    peak_bytes: int
    cgroup_peak_bytes: int | None
    oom_killed: bool
    log_tail: str
    object_sass: tuple[str, ...] = ()
    planned_sass: tuple[str, ...] = ()  # the package's SASS as plan prints it (Package.built_sass)
    asked: tuple[int, ...] = ()  # the cell's archs: every SASS of the unit must serve one (gencode_filter.keep)
    object_cache: dict = field(default_factory=dict)

    def outside(self) -> list[str]:
        """SASS of the unit that no requested GPU runs — the audit's and the gencode filter's rule (sm_90a serves
        a 9.0 GPU; sm_89, built beside 9.0 by vLLM's scaled_mm_c2x, serves none of 8.0 and 9.0)."""
        return [s for s in self.unit.sass if self.asked and not gencode_filter.keep(s, self.asked)]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.oom_killed

    @property
    def peak_mib(self) -> int:
        return round(self.peak_bytes / MIB)

    @property
    def mib_per_thread(self) -> float:
        return self.peak_bytes / MIB / self.unit.threads

    @property
    def audit_ok(self) -> bool:
        return self.ok and bool(self.object_sass) and self.object_sass == self.unit.sass and not self.outside()

    def audit_line(self) -> str:
        if not self.ok:
            return "not compiled"
        if not self.object_sass and self.unit.sass:
            return "FAILED: the object has no device code (does the source define no kernel?)"
        if self.object_sass != self.unit.sass:
            return f"FAILED: object has {' '.join(self.object_sass) or 'no SASS'}, command asks {' '.join(self.unit.sass)}"
        outside = self.outside()
        if outside:
            return (f"FAILED: {' '.join(outside)} serves none of the requested "
                    f"{', '.join(f'sm_{a}' for a in self.asked)}")
        return f"ok ({' '.join(self.object_sass)})"

    def to_json(self) -> dict:
        return {**self.unit.to_json(), "returncode": self.returncode, "seconds": self.seconds,
                "peak_mib": self.peak_mib, "cgroup_peak_mib": None if self.cgroup_peak_bytes is None
                else round(self.cgroup_peak_bytes / MIB), "mib_per_nvcc_thread": round(self.mib_per_thread),
                "oom_killed": self.oom_killed, "object_sass": list(self.object_sass),
                "planned_sass": list(self.planned_sass), "outside_requested": self.outside(),
                "audit": self.audit_line(), "audit_ok": self.audit_ok,
                "object_cache": self.object_cache}


def audit_object(path: Path) -> tuple[str, ...]:
    if not path.is_file() or path.stat().st_size == 0:
        return ()
    return tuple(sorted({e.name for e in read_fatbin_entries(path) if e.kind == "sass"}, key=_arch_key))


# -- failures the user fixes ------------------------------------------------------------------------------

# headers a devel stage lacks most often, and what provides them (apt in the base, or the build requirement)
HEADER_PROVIDERS = {
    "Python.h": "the Python development headers (apt-get install python3-dev, or python3.X-dev for the profile's Python)",
    "cudnn.h": "cuDNN's headers (pip install nvidia-cudnn-cu13, or apt-get install libcudnn9-dev-cuda-13)",
    "nccl.h": "NCCL's headers (pip install nvidia-nccl-cu13, or apt-get install libnccl-dev)",
    "cublas_v2.h": "cuBLAS's headers (pip install nvidia-cublas, or apt-get install libcublas-dev-13-0)",
    "cusparse.h": "cuSPARSE's headers (pip install nvidia-cusparse, or apt-get install libcusparse-dev-13-0)",
    "torch/extension.h": "torch in the build stage (the cell's torch pin)",
}
_MISSING_HEADER = re.compile(r"fatal error: ([\w./+-]+): No such file or directory")
_GCC_FLOOR = re.compile(r"GCC >= ?([\d.]+) is required|unsupported GNU version! gcc versions later than ([\d.]+)")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def gcc_too_old(name: str, version: str, gcc: str, floor: str) -> UserError | None:
    """The stage's GCC (measured) against the engine data's floor."""
    if floor and gcc and _version_tuple(gcc) < _version_tuple(floor):
        return UserError(
            f"{name} {version} needs GCC >= {floor} and the build stage's gcc is {gcc} (gcc -dumpfullversion, run in "
            f"the stage): use a devel base with GCC >= {floor} (profile os = \"trixie\": GCC 14.2; ubuntu24.04: 13) "
            f"or install gcc-{floor.split('.')[0]} g++-{floor.split('.')[0]} in the base and make it the default gcc")
    return None


def failure(m: Measured, name: str, version: str, host: Host, limit_bytes: int | None = None) -> UserError | None:
    """What the user must change for a unit that did not compile, or None when it is no fixable failure."""
    if m.ok:
        return None
    if m.oom_killed or re.search(r"died due to signal 9|Killed|signal 9", m.log_tail):
        peak = max(m.peak_bytes, m.cgroup_peak_bytes or 0)
        per_thread_gb = peak / 1024**3 / m.unit.threads
        where = f"limit {round(limit_bytes / MIB)} MiB" if limit_bytes else f"{host.free_gb} GB free"
        if host.free_gb is not None:
            fits = int(host.free_gb * RAM_HEADROOM // max(per_thread_gb, 1e-9))
            advice = (f"at that peak this host ({host.free_gb} GB free, {host.cores} cores) fits MAX_JOBS="
                      f"{max(1, min(fits, host.cores))} NVCC_THREADS=1 ({fits} nvcc threads by memory)"
                      + (": not even one, free memory or build elsewhere" if fits < 1 else "")
                      + "; pass --max-jobs/--nvcc-threads")
        else:
            advice = "lower --max-jobs/--nvcc-threads"
        return UserError(
            f"nvcc was killed for memory compiling {m.unit.source} of {name} {version} ({where}): its process tree "
            f"reached {round(peak / MIB)} MiB (peak of its resident memory) at {m.unit.threads} nvcc thread(s) before "
            f"the kill, "
            f"~{round(peak / MIB / m.unit.threads)} MiB per thread; {advice}")
    header = _MISSING_HEADER.search(m.log_tail)
    if header:
        h = header.group(1)
        what = HEADER_PROVIDERS.get(h) or HEADER_PROVIDERS.get(Path(h).name) or \
            "the package that provides it (apt-file search / pip), in the devel base or the package's build requirements"
        return UserError(f"{name} {version}: {m.unit.source} includes {h}, which the build stage lacks: install {what}")
    floor = _GCC_FLOOR.search(m.log_tail)
    if floor:
        return UserError(f"{name} {version}: the compiler refused the build stage's GCC ({floor.group(0)}): use a "
                         "devel base whose GCC the engine accepts (profile os = \"trixie\": GCC 14.2)")
    return None


# -- projection -------------------------------------------------------------------------------------------

def projection(name: str, version: str, recipe, all_units: list[Unit], measured: list[Measured], host: Host,
               max_jobs: int | None = None, nvcc_threads: int | None = None) -> dict:
    """The whole package's compile on this host from its measured units: nvcc thread-seconds per kernel×arch
    unit × its units ÷ the threads the build would run, those chosen from the measured memory per thread."""
    good = [m for m in measured if m.ok and m.unit.units]
    total_units = sum(u.units for u in all_units)
    out = {"package": f"{name} {version}", "tus": len(all_units), "kernel_arch_units": total_units,
           "measured_units": sum(m.unit.units for m in good)}
    divides = recipe.parallelism == "total-threads"
    today = choose(recipe, host, max_jobs, nvcc_threads) if recipe.mem_gb_per_nvcc_thread > 0 or max_jobs else None
    out["today"] = {"gb_per_nvcc_thread": recipe.mem_gb_per_nvcc_thread,
                    "max_jobs": today.max_jobs if today else None, "nvcc_threads": today.nvcc_threads if today else None,
                    "why": today.why if today else ""}
    if not good:
        return {**out, "projected_seconds": None}
    per_unit = sum(m.seconds * m.unit.threads for m in good) / sum(m.unit.units for m in good)
    # a unit of the build is costed like the measured units of its SASS set (CUTLASS 3.x and FA3 kernels are
    # sm_90a-only and far heavier than a sm_80+sm_90 elementwise kernel); a set none was measured for, at the mean
    by_sass: dict[tuple[str, ...], list[Measured]] = {}
    for m in good:
        by_sass.setdefault(m.unit.sass, []).append(m)
    cost = {k: sum(m.seconds * m.unit.threads for m in v) / sum(m.unit.units for m in v) for k, v in by_sass.items()}
    thread_seconds = sum(u.units * cost.get(u.sass, per_unit) for u in all_units)
    out["by_sass"] = {" ".join(k): {"thread_seconds_per_unit": round(v, 2),
                                    "units": sum(u.units for u in all_units if u.sass == k)} for k, v in cost.items()}
    out["units_at_the_mean"] = sum(u.units for u in all_units if u.sass not in cost)
    per_thread_gb = max(m.mib_per_thread for m in good) / 1024
    measured_recipe = dataclasses.replace(recipe, mem_gb_per_nvcc_thread=round(max(per_thread_gb, 0.01), 2))
    try:
        par = choose(measured_recipe, host, max_jobs, nvcc_threads)
        chosen = {"max_jobs": par.max_jobs, "nvcc_threads": par.nvcc_threads, "why": par.why}
        busy = threads_at(par.max_jobs, par.nvcc_threads, divides)
    except UserError as exc:
        chosen = {"max_jobs": None, "nvcc_threads": None, "why": str(exc)}
        busy = 1
    busy = min(busy, max(1, host.cores)) if max_jobs is None and nvcc_threads is None else busy
    # no faster than its longest translation unit, which one nvcc runs alone (its --threads archs at once)
    longest = max((u.units * cost.get(u.sass, per_unit) / u.threads for u in all_units), default=0.0)
    out.update({"thread_seconds_per_unit": round(per_unit, 2), "gb_per_nvcc_thread": round(per_thread_gb, 2),
                "chosen": chosen, "threads": busy,
                "projected_seconds": round(max(thread_seconds / busy, longest), 1)})
    if today is not None:
        today_busy = threads_at(today.max_jobs, today.nvcc_threads, divides)
        out["today"]["threads"] = today_busy
        out["today"]["fits"] = math.floor((host.free_gb or 0) * RAM_HEADROOM / per_thread_gb) >= today_busy \
            if per_thread_gb > 0 else True
    return out


# -- the build stage: the rendered Dockerfile up to the compile RUN -----------------------------------------

_COMPILE_LINE = re.compile(r"^\s*(?P<pre>.*?)with-sccache(?P<home> --cuda-home)? (?P<cmd>.*?)\s*\\?$")


@dataclass(frozen=True)
class BuildStage:
    dockerfile: str  # the rendered text up to the compile RUN of build-<package>: that stage is its last
    target: str
    command: str  # the compile's own command, without with-sccache
    cuda_home: bool  # with-sccache --cuda-home: nvcc is reached through $CUDA_HOME/bin


def build_stage(rendered: str, package: str) -> BuildStage:
    lines = rendered.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("FROM ") and ln.endswith(f" AS build-{package}")), None)
    if start is None:
        raise UserError(f"the rendered Dockerfile has no build-{package} stage (it is not compiled here)")
    run = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("RUN --network=")), None)
    m = _COMPILE_LINE.match(lines[run + 1]) if run is not None and run + 1 < len(lines) else None
    if m is None:
        raise UserError(f"the build-{package} stage has no `with-sccache` compile RUN to rehearse")
    return BuildStage("\n".join(lines[:run]) + "\n", f"build-{package}", (m.group("pre") + m.group("cmd")).strip(),
                      bool(m.group("home")))


def _capture_script(stage: BuildStage) -> str:
    """bash for the capture container: the recording nvcc where the build reaches nvcc through CUDA_HOME, the
    stop at the build tool for Python build backends (capture_site.py as the sitecustomize.py of every Python
    the build starts), then the build's command."""
    setup = ["mkdir -p /tmp/rehearsal-site",
             f"cp {PROGRAMS_DIR}/capture_site.py /tmp/rehearsal-site/sitecustomize.py",
             f"export PYTHONPATH=/tmp/rehearsal-site${{PYTHONPATH:+:$PYTHONPATH}} REHEARSAL_OUT={REHEARSAL_DIR}/out"]
    if stage.cuda_home:  # the same CUDA_HOME with-sccache --cuda-home makes, its nvcc the recorder
        setup += ['real=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}"); fake=/tmp/sccache-cuda; mkdir -p "$fake/bin"',
                  'for e in "$real"/*; do [ "${e##*/}" = bin ] || ln -sfn "$e" "$fake/"; done',
                  'for e in "$real"/bin/*; do [ "${e##*/}" = nvcc ] || ln -sfn "$e" "$fake/bin/"; done',
                  f'cp {PROGRAMS_DIR}/nvcc.py "$fake/bin/nvcc" && chmod 0755 "$fake/bin/nvcc"',
                  'export REHEARSAL_REAL_NVCC="$real/bin/nvcc" CUDA_HOME="$fake" CUDA_PATH="$fake" PATH="$fake/bin:$PATH"']
    return "; ".join(setup) + f"; {stage.command}; echo rehearsal-build-exit=$?"


DIST_SECRET = "/run/secrets/sccache-dist"  # where with-sccache finds the sccache-dist client configuration


def _container(work: Path, env: dict[str, str], name: str, *writable: tuple[str, str], memory: int | None = None,
               dist_conf: Path | None = None) -> dict:
    """run_argv's options of every rehearsal container: a name, no network, the rehearsal directory writable
    and the programs read-only, the build's environment. With `dist_conf` (the sccache-dist client configuration
    the build hands over as secret `sccache-dist`) the container has the host's network, as the build's compile
    RUN has then, and the configuration where with-sccache reads it."""
    mounts = ((str(PROGRAMS), PROGRAMS_DIR),) + (((str(dist_conf), DIST_SECRET),) if dist_conf else ())
    return {"name": name, "network": "host" if dist_conf else "none", "memory": memory, "entrypoint": "bash",
            "writable": ((str(work), REHEARSAL_DIR), *writable), "mounts": mounts, "env": tuple(env.items())}


def measured_gcc(image: str, docker_bin: str = "docker") -> str:
    """The build stage's gcc, run there."""
    proc = docker.run_container(image, ["-dumpfullversion"], network="none", entrypoint="gcc", check=False,
                                docker=docker_bin)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def capture(image: str, stage: BuildStage, work: Path, env: dict[str, str], package: str,
            docker_bin: str = "docker", made: list[str] | None = None) -> tuple[str, list[Unit]]:
    """Run the build's command in a container of the stage, stopped where the compile starts; returns an image
    of that container (the configured build tree: CMake's generated sources, the objects' directories) and
    the CUDA units it would compile. The image's name goes into `made` before the commit that makes it, so a
    caller that removes what it made removes it even when an interrupt lands during the commit."""
    (work / "out").mkdir(parents=True, exist_ok=True)
    name = f"builder-rehearse-{secrets.token_hex(6)}"
    try:
        proc = docker.run_container(image, ["-c", _capture_script(stage)], remove=False, check=False,
                                    docker=docker_bin, **_container(work, env, name))
        (work / "capture.log").write_text(proc.stdout + proc.stderr)
        units = units_from_capture(work / "out", package)
        if not units:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
            err = _build_failure(tail, package)
            raise err or UserError(f"{package}: its build command compiled no CUDA translation unit the rehearsal "
                                   f"could see (exit {proc.returncode}):\n{tail}")
        snapshot = f"builder-rehearse-capture:{name.rsplit('-', 1)[1]}"
        if made is not None:
            made.append(snapshot)
        docker.commit_container(name, snapshot, docker_bin)
        return snapshot, units
    finally:
        docker.remove_container(name, docker_bin)


def _build_failure(tail: str, package: str) -> UserError | None:
    fake = Measured(Unit(package, "the configure", "", "", "", ()), 1, 0, 0, None, False, tail)
    return failure(fake, package, "", Host(1, None))


def compile_unit(snapshot: str, unit: Unit, index: int, work: Path, env: dict[str, str], cuda_home: bool,
                 sccache_dir: Path, memory: int | None = None, docker_bin: str = "docker",
                 dist_conf: Path | None = None, recache: bool = True, name: str | None = None) -> Measured:
    """Compile one unit in a fresh container of the captured stage, through with-sccache, and measure it.
    `dist_conf`: through the sccache-dist farm it configures, as the build with [defaults.cache] dist.
    `recache` (the rehearsal's own way): compiled even when the object cache holds the unit; without it, a unit
    the cache holds is fetched, which is what a rebuild does."""
    name = name or f"builder-rehearse-{secrets.token_hex(6)}"
    out = f"{REHEARSAL_DIR}/out"
    cmd = f"rm -f {shlex.quote(unit.output)}; {unit.command}"
    script = (f"with-sccache{' --cuda-home' if cuda_home else ''} python3 {PROGRAMS_DIR}/measure.py "
              f"{shlex.quote(cmd)} {shlex.quote(unit.cwd)} {out}/unit-{index}.log > {out}/unit-{index}.json; "
              f"cp /wheels/.sccache-stats.json {out}/unit-{index}.sccache.json 2>/dev/null; "
              f"cp {shlex.quote(unit.output)} {out}/unit-{index}.o 2>/dev/null; true")
    # measured cold: an object already in the cache would time its fetch, not its compile (sccache compiles it
    # again and stores the result)
    options = _container(work, {**env, "SCCACHE_RECACHE": "1"} if recache else env, name,
                         (str(sccache_dir), SCCACHE_DIR), memory=memory, dist_conf=dist_conf)
    try:
        proc = docker.run_container(snapshot, ["-c", script], check=False, docker=docker_bin, **options)
    except BaseException:  # an interrupt stops the docker CLI, not the container (--rm removes it once it ends)
        docker.remove_container(name, docker_bin)
        raise
    return measured_unit(unit, index, work, proc.stdout + proc.stderr)


def measured_unit(unit: Unit, index: int, work: Path, output: str) -> Measured:
    """What compile_unit's container left in the rehearsal directory, read back."""
    result = work / "out" / f"unit-{index}.json"
    log = work / "out" / f"unit-{index}.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else ""
    try:
        r = json.loads(result.read_text())
    except (OSError, ValueError):  # the sampler itself was killed (the container's memory limit)
        return Measured(unit, 137, 0.0, 0, None, True, tail or output[-3000:])
    from .compile_cache import summarize

    stats = work / "out" / f"unit-{index}.sccache.json"
    cache = {}
    if stats.is_file():
        try:
            s = summarize(json.loads(stats.read_text()))
            cache = {"hits": s["hits"], "misses": s["misses"]}
            if s["distributed"]:  # build server -> nvcc steps it compiled (sccache-dist)
                cache["distributed"] = s["distributed"]
        except ValueError:
            pass
    return Measured(unit, r["returncode"], r["seconds"], r["peak_bytes"], r["cgroup_peak_bytes"],
                    r["oom_kills"] > 0 or r["returncode"] in (-9, 137), tail,
                    audit_object(work / "out" / f"unit-{index}.o"), object_cache=cache)


# SEED_RUN: a token of this seeding, so BuildKit runs the copy (a RUN's layer cache key has no cache mount id: a
# seeding of the same objects into another namespace would be "CACHED" and copy nothing); never --no-cache,
# under which BuildKit gives the RUN an empty cache mount
SEED_DOCKERFILE = """FROM {image} AS seed
ARG SCCACHE_NAMESPACE=default
ARG SEED_RUN
RUN --network=none --mount=type=cache,target=/root/.cache/sccache,id=builder-sccache-${{SCCACHE_NAMESPACE}} \\
    --mount=type=bind,target=/rehearsal-objects \\
    echo "seeding $SEED_RUN" && cp -a /rehearsal-objects/. /root/.cache/sccache/
"""


def seed_object_cache(sccache_dir: Path, image: str, work: Path, namespace: str = "default",
                      builder: str | None = None, docker_bin: str = "docker") -> None:
    """Copy the rehearsal's sccache entries into the build's local object cache (the BuildKit cache mount
    with-sccache compiles into, in the buildx builder the build uses), so the build finds the rehearsed units
    there. The build's output goes to seed.log in `work`."""
    df = work / "seed.Dockerfile"
    df.write_text(SEED_DOCKERFILE.format(image=image))
    call = docker.BuildxCall(dockerfile=df, context=sccache_dir, target="seed", output="type=cacheonly",
                             builder=builder, build_args=(("SCCACHE_NAMESPACE", namespace),
                                                          ("SEED_RUN", secrets.token_hex(8))))
    with (work / "seed.log").open("w") as log:
        docker.stream(call.argv(docker_bin), log, None)


# -- the verb ---------------------------------------------------------------------------------------------

def work_dir_of(opts, cell, pkg) -> Path:
    """Where one package's rehearsal keeps its Dockerfile, context, logs and units."""
    return opts.work_dir / "rehearse" / cell.id / pkg.name


def compile_units(snapshot: str, chosen: list[Unit], work: Path, env: dict[str, str], cuda_home: bool,
                  sccache_dir: Path, memory: int | None, docker_bin: str, jobs: int = 1,
                  dist_conf: Path | None = None, recache: bool = True, say=lambda text: None) -> list[Measured]:
    """compile_unit for each chosen unit, `jobs` of them at once (each in its own container, measured alone);
    in the order chosen. An interrupt removes every container of the batch (the other threads' docker CLIs then
    end), not only the one the main thread waited on."""
    from concurrent.futures import ThreadPoolExecutor

    names = [f"builder-rehearse-{secrets.token_hex(6)}" for _ in chosen]

    def one(i: int) -> Measured:
        say(f"compiling {chosen[i].source} ({' '.join(chosen[i].sass)})")
        return compile_unit(snapshot, chosen[i], i, work, env, cuda_home, sccache_dir, memory, docker_bin,
                            dist_conf, recache, names[i])

    if jobs <= 1:
        return [one(i) for i in range(len(chosen))]
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        return list(pool.map(one, range(len(chosen))))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        for name in names:
            docker.remove_container(name, docker_bin)
        raise
    finally:
        pool.shutdown(wait=True)


@dataclass
class Captured:
    """A package's build stage, built and captured: the image of its configured build tree (`snapshot`), the CUDA
    units it would compile, the environment its compile runs with, the stage's measured gcc."""

    work: Path
    stage: BuildStage
    tag: str
    snapshot: str
    units: list[Unit]
    env: dict[str, str]
    gcc: str


def capture_package(plan, wheel, opts, host: Host, say, images: list[str]) -> Captured:
    """Build one package's build stage (the rendered Dockerfile up to its compile RUN) and capture its compile
    commands; every image it makes is named in `images` first (the caller removes them). UserError for a gcc
    below the engine's floor."""
    from .render import render
    from .steps import CellContext, common_build_args

    cell, pkg = plan.cell, wheel.package
    work = work_dir_of(opts, cell, pkg)
    if work.exists():
        shutil.rmtree(work)
    (work / "context").mkdir(parents=True)
    stage = build_stage(render(plan, opts.index_url, opts.compile_reaches_out), pkg.name)
    (work / "Dockerfile").write_text(stage.dockerfile)
    par = choose(pkg.recipe, host, opts.max_jobs, opts.nvcc_threads)
    tag = f"builder-rehearse:{secrets.token_hex(6)}"
    images.append(tag)
    with (work / "build.log").open("w") as log:
        ctx = CellContext(plan=plan, opts=opts, cache=None, host=host, say=say, log=log)
        common = {**common_build_args(ctx), "dockerfile": work / "Dockerfile", "context": work / "context",
                  "layer_cache": None}
        common["build_args"] += (("MAX_JOBS", str(par.max_jobs)), ("NVCC_THREADS", str(par.nvcc_threads)))
        call = docker.BuildxCall(target=stage.target, tags=(tag,), load=True, **common)
        say(f"[{cell.id}] {pkg.name}: building its build stage ({stage.target}, up to the compile)")
        docker.stream(call.argv(opts.docker), log, None)
    gcc = measured_gcc(tag, opts.docker)
    too_old = gcc_too_old(pkg.name, pkg.version, gcc, pkg.recipe.min_gcc)
    if too_old:
        raise too_old
    env = {"MAX_JOBS": str(par.max_jobs), "NVCC_THREADS": str(par.nvcc_threads)}
    if opts.source_date_epoch:
        env["SOURCE_DATE_EPOCH"] = opts.source_date_epoch
    say(f"[{cell.id}] {pkg.name}: capturing its compile commands ({stage.command})")
    snapshot, units = capture(tag, stage, work, env, pkg.name, opts.docker, made=images)
    return Captured(work, stage, tag, snapshot, units, env, gcc)


def rehearse_package(plan, wheel, opts, host: Host, patterns: tuple[str, ...], memory: int | None, keep: bool,
                     say, jobs: int = 1) -> dict:
    """One compiled package of one cell: its build stage, the capture, the chosen units compiled (`jobs` at once)
    and measured, the projection. With [defaults.cache] dist the units compile through that sccache-dist farm, as
    the build's would. Raises UserError (exit 2) for a failure the user fixes; removes its images and the client
    configuration either way (unless `keep`: the images)."""
    cell, pkg = plan.cell, wheel.package
    work = work_dir_of(opts, cell, pkg)
    images: list[str] = []
    try:
        c = capture_package(plan, wheel, opts, host, say, images)
        snapshot, units, env, stage, gcc, tag = c.snapshot, c.units, c.env, c.stage, c.gcc, c.tag
        chosen = pick(units, patterns)
        sccache_dir = opts.work_dir / "rehearse" / "sccache"
        sccache_dir.mkdir(parents=True, exist_ok=True)
        dist_conf = None
        if opts.compile_dist is not None:  # the build's sccache-dist client configuration, for this rehearsal only
            from .compile_cache import write_dist_config

            dist_conf = write_dist_config(opts.compile_dist, work / "sccache-dist.conf")
        started = time.monotonic()
        measured = compile_units(snapshot, chosen, work, env, stage.cuda_home, sccache_dir, memory, opts.docker,
                                 jobs, dist_conf, say=lambda text: say(f"[{cell.id}] {pkg.name}: {text}"))
        wall = round(time.monotonic() - started, 1)
        for m in measured:
            m.planned_sass, m.asked = tuple(pkg.built_sass), tuple(pkg.archs)
            unit = m.unit
            problem = failure(m, pkg.name, pkg.version, host, memory)
            if problem:
                raise problem
            if not m.ok:
                raise UserError(f"{pkg.name} {pkg.version}: {unit.source} did not compile (exit {m.returncode}):\n"
                                f"{m.log_tail}")
        seeded = ""
        if any(m.object_cache.get("misses") for m in measured):
            seed_object_cache(sccache_dir, tag, work, os.environ.get("BUILDER_SCCACHE_NAMESPACE", "default"),
                              opts.builder, opts.docker)
            seeded = "the build's local object cache"
        proj = projection(pkg.name, pkg.version, pkg.recipe, units, measured, host, opts.max_jobs,
                          opts.nvcc_threads)
        return {"cell": cell.id, "package": pkg.name, "version": pkg.version, "gcc": gcc,
                "units": [m.to_json() for m in measured], "projection": proj,
                "estimate": wheel.estimate.to_json() if wheel.estimate else None, "objects_to": seeded,
                "compile": {"wall_seconds": wall, "jobs": jobs, "dist": opts.compile_dist}}
    finally:
        (work / "sccache-dist.conf").unlink(missing_ok=True)  # it holds the farm's client token
        if not keep:
            for image in images:
                docker.remove_image(image, opts.docker)


def packages(m, sel, flags, say=lambda text: None) -> tuple:
    """(build options, host, [(cell plan, wheel step)]): every package the selected cells compile with nvcc.
    UserError when there is none or an option is bad; EnvironmentProblem without Docker and buildx."""
    from . import epoch, lock, resolve, runner
    from .options import build_options, wheelhouse_at
    from .plan import plan_cells

    cells = resolve.select(m, sel)
    stamp = epoch.resolve(m)
    opts = build_options(m, flags, stamp.value)
    runner.check_options(opts)  # --max-jobs 0, a CA bundle that is no file, ...: exit 2 before Docker
    cells = lock.pin_git_sources(cells, echo=say)
    host = Host.detect()
    plans = plan_cells(cells, None, history=wheelhouse_at(m.path, flags.wheelhouse), host=host,
                       max_jobs=flags.max_jobs, nvcc_threads=flags.nvcc_threads)
    # what nvcc compiles: a package with no device code (engine data: 0 GB per nvcc thread, e.g. sglang's Rust) is
    # compiled by the build but has no CUDA unit to rehearse
    todo = [(p, w) for p in plans for w in p.wheels
            if w.package.compiled_here and w.package.recipe.mem_gb_per_nvcc_thread > 0]
    if not todo:
        raise UserError("the selected cells compile no CUDA code here (every such package comes from an index): "
                        "nothing to rehearse")
    docker.require_buildx(opts.docker)
    return opts, host, todo


def run(m, sel, flags, patterns: tuple[str, ...] = (), memory: int | None = None, keep: bool = False,
        say=lambda text: None, jobs: int = 1) -> list[dict]:
    """`builder rehearse`: every package the selected cells compile with nvcc, rehearsed (`rehearse_package`);
    one result (JSON-able) per package. UserError when there is nothing to rehearse or a failure the user fixes;
    EnvironmentProblem without Docker and buildx. `say` gets the progress lines."""
    opts, host, todo = packages(m, sel, flags, say)
    results = []
    for p, w in todo:
        try:
            results.append(rehearse_package(p, w, opts, host, tuple(patterns), memory, keep, say, jobs))
        except CommandError as exc:
            # one package's stage failing (a source its deps stage cannot download, a configure error) hides no
            # other package's measurements: it is reported, and the verb exits 1 after the rest
            log = work_dir_of(opts, p.cell, w.package) / "build.log"
            reason = _failed_step(exc.output)
            say(f"[{p.cell.id}] {w.package.name}: its build stage failed ({reason}); log {log}")
            results.append({"cell": p.cell.id, "package": w.package.name, "version": w.package.version,
                            "failed": reason, "log": str(log)})
    return results


def _failed_step(output: str) -> str:
    """The failing step of a buildx log and the last line it printed, in one line."""
    lines = output.strip().splitlines()
    step = next((ln.strip(" >:") for ln in reversed(lines) if ln.startswith(" > [")), "")
    said = next((ln.split(" ", 1)[1] for ln in reversed(lines)
                 if re.match(r"^\d+\.\d+ ", ln) and not ln.split(" ", 1)[1].startswith("WARNING")), "")
    return "; ".join(x for x in (step[:160], said[:300]) if x) or "docker buildx build failed"
