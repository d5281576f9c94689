"""Real engine translation units compiled and measured (builder/rehearse.py's measurement), for the cell's archs:
vLLM 0.33.0 and flash-attn 2.8.3 from their PyPI sdists, configured as builder's build would (vLLM: its setup.py's
CMake configure with the rendered knobs and the deps stage's overrides, benchmarks/build_ninja_units.py's route;
flash-attn: its setup.py through torch 2.14.0's BuildExtension), each unit's own command from build.ninja
(`ninja -t compdb`), compiled one at a time in the trixie devel base (GCC 14, nvcc 13.0.88) with --network=none.

Per unit: wall seconds, peak resident MiB of the container's processes (nvcc and its cudafe++/cicc/ptxas), the
kernel×arch units, and the audit of the object (its fatbin's SASS against the command's and the plan's). Then the
projection of the package's whole compile on this host (builder/rehearse.py `projection`).

vLLM's GitHub sources cannot be fetched here: --source NAME=DIR gives a checkout (cutlass at least: its CUTLASS
3.x kernels include it), every other source is a stub (build_ninja_units.py), and units whose sources a stub
stands for cannot be compiled.

    benchmarks/rehearse_units.py --engine vllm --source cutlass=DIR [--unit PATTERN ...] [--arch 80,90] [--json]
    benchmarks/rehearse_units.py --engine flash-attn [--unit PATTERN ...] [--json]

--unit: a source path pattern to compile (repeatable; default: the heaviest unit of each binary). The torch venv
of build_ninja_units.py (--venv) is made on first use.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import build_ninja_units as bnu  # noqa: E402

from builder import archs as archs_mod  # noqa: E402
from builder import rehearse  # noqa: E402
from builder.engines import recipe  # noqa: E402
from builder.resources import Host, choose  # noqa: E402

IMAGE = bnu.DEVEL_IMAGE
# The devel base's toolkit (PyPI's nvcc wheels) has no cuBLAS/cuSPARSE/... headers, which NVIDIA's devel images
# ship in the toolkit's include/ and vLLM's sources include (csrc/torch_utils.h: cublas_v2.h): the venv's CUDA 13
# wheels (torch's own dependencies) carry them; those the toolkit lacks are put on CPATH, the toolkit's own first.
EXTRA_HEADERS = ("mkdir -p /tmp/extra-include; for f in " + bnu.VENV_IN + "/lib/python3*/site-packages/nvidia/cu13/include/*; "
                 "do [ -e /usr/local/cuda/include/$(basename $f) ] || ln -s $f /tmp/extra-include/; done; "
                 "export CPATH=/tmp/extra-include; ")
CUDA = "13.0"


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def container(mounts: dict, env: dict, script: str, memory: int | None = None) -> subprocess.CompletedProcess:
    argv = ["docker", "run", "--rm", "--network", "none"]
    for host, m in mounts.items():
        argv += ["-v", f"{host}:{m['bind']}:{m['mode']}"]
    for k, v in env.items():
        argv += ["-e", f"{k}={v}"]
    if memory:
        argv += ["--memory", str(memory), "--memory-swap", str(memory)]
    return _run([*argv, IMAGE, "bash", "-c", script])


def compdb_units(mounts: dict, env: dict, build: str, package: str, work: Path) -> list[rehearse.Unit]:
    out = work / "out"
    out.mkdir(exist_ok=True)
    proc = container(mounts, env, f"{bnu.VENV_IN}/bin/ninja -C {build} -t compdb > /rehearsal/out/entries.json")
    if proc.returncode != 0:
        raise SystemExit(f"ninja -t compdb failed: {proc.stderr[-2000:]}")
    (out / "compdb-0.json").write_text(json.dumps({"build_dir": build,
                                                   "entries": json.loads((out / "entries.json").read_text())}))
    return rehearse.units_from_capture(out, package)


def measure(mounts: dict, env: dict, unit: rehearse.Unit, index: int, work: Path, prefix: str = "") -> rehearse.Measured:
    """The unit's own command, its object where build.ninja puts it (the build tree lives in `work`)."""
    script = (f"{prefix}rm -f {shlex.quote(unit.output)}; python3 /rehearsal/measure.py {shlex.quote(unit.command)} "
              f"{shlex.quote(unit.cwd)} /rehearsal/out/unit-{index}.log > /rehearsal/out/unit-{index}.json")
    container(mounts, env, script)
    log = work / "out" / f"unit-{index}.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.is_file() else ""
    r = json.loads((work / "out" / f"unit-{index}.json").read_text())
    obj = work / Path(unit.output).relative_to("/rehearsal")
    return rehearse.Measured(unit, r["returncode"], r["seconds"], r["peak_bytes"], r["cgroup_peak_bytes"],
                             r["oom_kills"] > 0, tail, rehearse.audit_object(obj))


def _prepare(work: Path) -> dict:
    (work / "out").mkdir(parents=True, exist_ok=True)
    (work / "measure.py").write_text((rehearse.PROGRAMS / "measure.py").read_text())
    return {str(work): {"bind": "/rehearsal", "mode": "rw"}}


def vllm_units(venv: Path, asked, real: dict[str, Path], work: Path):
    sdist = bnu._sdist("vllm==0.33.0")
    with tarfile.open(sdist) as tf:
        tf.extractall(work / "sdist", filter="data")
    (src,) = (work / "sdist").iterdir()
    mounts, kinds = bnu.vllm_sources(real, work / "stubs", src)
    mounts.update(_prepare(work))
    mounts[str(venv)] = {"bind": bnu.VENV_IN, "mode": "ro"}
    mounts[str(src)] = {"bind": "/tmp/src", "mode": "rw"}
    r = recipe(*bnu.VLLM)
    env = {**bnu.vllm_env(dict(r.knob_values(asked))["TORCH_CUDA_ARCH_LIST"]), "FETCHCONTENT_BASE_DIR": "/rehearsal/deps"}
    env["DRIVER"] = bnu.DRIVER
    proc = container(mounts, env, f"set -e; {bnu.CUDA_ROOT_SCRIPT}; cd /tmp/src && {bnu.VENV_IN}/bin/python -c \"$DRIVER\" /rehearsal/build")
    if bnu.WRITTEN not in proc.stdout:
        logs = proc.stdout + proc.stderr
        errors = "\n".join(m.group(0) for m in re.finditer(r"^CMake Error.*(?:\n(?!-- ).*){0,12}", logs, re.M))
        raise SystemExit(f"vLLM's configure did not reach build.ninja:\n{errors or logs[-4000:]}")
    env.pop("DRIVER")
    units = compdb_units(mounts, env, "/rehearsal/build", "vllm", work)
    return r, mounts, env, units, kinds, f"{bnu.CUDA_ROOT_SCRIPT}; {EXTRA_HEADERS}"


def flash_attn_units(venv: Path, asked, work: Path):
    sdist = bnu._sdist("flash-attn==2.8.3")
    with tarfile.open(sdist) as tf:
        tf.extractall(work / "sdist", filter="data")
    (src,) = (work / "sdist").iterdir()
    r = recipe("flash-attn", "2.8.3")
    for pt in r.patches_for("2.14.0"):
        f = src / pt["file"]
        f.write_text(f.read_text().replace(pt["replace"], pt["with"]))
    mounts = _prepare(work)
    mounts[str(venv)] = {"bind": bnu.VENV_IN, "mode": "ro"}
    mounts[str(src)] = {"bind": "/tmp/src", "mode": "rw"}
    par = choose(r, Host.detect())  # what the build stage gets on this host
    env = {**dict(r.build_env), **dict(r.knob_values(asked)), "CUDA_HOME": bnu.CUDA_ROOT,
           "MAX_JOBS": str(par.max_jobs), "NVCC_THREADS": str(par.nvcc_threads),
           "PATH": f"{bnu.VENV_IN}/bin:{bnu.CUDA_ROOT}/bin:/usr/bin:/bin", "DRIVER": bnu.DRIVER}
    proc = container(mounts, env, f"set -e; {bnu.CUDA_ROOT_SCRIPT}; cd /tmp/src && python -c \"$DRIVER\" /rehearsal/build")
    if bnu.WRITTEN not in proc.stdout:
        raise SystemExit(f"flash-attn's setup.py did not reach build.ninja:\n{(proc.stdout + proc.stderr)[-4000:]}")
    env.pop("DRIVER")
    units = compdb_units(mounts, env, "/rehearsal/build", "flash-attn", work)
    return r, mounts, env, units, {}, f"{bnu.CUDA_ROOT_SCRIPT}; {EXTRA_HEADERS}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("vllm", "flash-attn"), required=True)
    ap.add_argument("--venv", type=Path, default=bnu.VENV_DEFAULT)
    ap.add_argument("--source", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--unit", action="append", default=[], help="a source path pattern to compile (repeatable)")
    ap.add_argument("--only-listed", action="store_true", help="compile only the --unit ones, not each binary's heaviest")
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="list the CUDA units and stop")
    args = ap.parse_args()
    asked = archs_mod.parse(args.arch)
    real = {n: Path(d) for n, _, d in (s.partition("=") for s in args.source)}
    import docker

    bnu.ensure_venv(docker.from_env(), args.venv)
    with tempfile.TemporaryDirectory(prefix="rehearse-units-") as tmp:
        work = Path(tmp)
        if args.engine == "vllm":
            r, mounts, env, units, kinds, prefix = vllm_units(args.venv, asked, real, work)
        else:
            r, mounts, env, units, kinds, prefix = flash_attn_units(args.venv, asked, work)
        if args.list:
            for u in units:
                print(f"{u.binary:<24} {' '.join(u.sass):<14} {u.source}")
            return 0
        src_root = next(Path(h) for h, m in mounts.items() if m["bind"] == "/tmp/src")

        def size(s: str) -> int:
            p = src_root / s.removeprefix("/tmp/src/")
            return p.stat().st_size if p.is_file() else 0

        chosen = rehearse.pick(units, tuple(args.unit), size)
        if args.only_listed:
            chosen = [u for u in chosen if any(p in u.source for p in args.unit)]
        planned = tuple(r.built_sass(asked, CUDA))
        results = []
        for i, u in enumerate(chosen):
            print(f"compiling {u.source} ({u.binary}, {' '.join(u.sass)})", file=sys.stderr, flush=True)
            m = measure(mounts, env, u, i, work, prefix)
            m.planned_sass, m.asked = planned, tuple(asked)
            results.append(m)
            print(f"  {m.seconds:.1f} s, peak {m.peak_mib} MiB, audit {m.audit_line()}"
                  + ("" if m.ok else f"\n{m.log_tail}"), file=sys.stderr, flush=True)
        host = Host.detect()
        proj = rehearse.projection(r.name, r.version, r, units, results, host)
    out = {"package": f"{r.name} {r.version}", "sources": kinds, "units": [m.to_json() for m in results],
           "projection": proj, "host": {"cores": host.cores, "free_gb": host.free_gb}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['package']} for {args.arch}: {proj['tus']} CUDA TUs, {proj['kernel_arch_units']} kernel×arch units")
    print(f"{'unit':<64} {'binary':<22} {'SASS':<12} {'s':>7} {'peak MiB':>9}  audit")
    for m in results:
        print(f"{m.unit.source.removeprefix('/tmp/src/'):<64} {m.unit.binary:<22} {' '.join(m.unit.sass):<12} "
              f"{m.seconds:>7.1f} {m.peak_mib:>9}  {m.audit_line()}")
    if proj.get("projected_seconds") is not None:
        print(f"projection: {proj['thread_seconds_per_unit']} thread-s per unit × {proj['kernel_arch_units']} units ÷ "
              f"{proj['threads']} threads = {proj['projected_seconds']} s; {proj['gb_per_nvcc_thread']} GB per nvcc "
              f"thread measured → {proj['chosen']['why']}")
        print(f"today's rule: {proj['today']['why']}")
    return 0 if all(m.ok for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
