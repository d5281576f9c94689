"""The object cache under the compile (sccache, builder/compile_cache.py), measured through `builder build` on the
real templates, the local bases and nvcc 13.0, in one run:

  cold        a package of N CUDA sources (default 16) for sm_80 + sm_90, an empty local object cache
  key change  the wheel's key changes (engine data build_env gains a variable no compiler reads), no compile
              command does: goal ≥ 95 % hits and a compile RUN wall ≤ 10 % of cold
  +1 arch     --arch 80,90,100: sm_80's and sm_90's cicc/ptxas steps must hit, only sm_100's (and nvcc's own
              per-source steps, whose command line changed) miss
  edit 1 .cu  back to 80,90 with one source edited: only that source's steps miss

Every build starts from an empty wheelhouse (the wheel cache would otherwise skip the compile); each change
reaches the compile RUN, so BuildKit's layer cache does not skip it (no --no-cache: BuildKit then also hands
the RUN empty cache mounts, the object cache included). The local object cache is a cache mount of this run
only (BUILDER_SCCACHE_NAMESPACE). "compile RUN
wall" is BuildKit's own time for the RUN that compiles (its DONE line); "compilers" is sccache's sum of
compiler seconds (misses only).

    .venv/bin/python benchmarks/compile_cache.py            # 16 sources, heavier kernels
    .venv/bin/python benchmarks/compile_cache.py --quick    # 16 small sources: a few minutes on 2 cores
    .venv/bin/python benchmarks/compile_cache.py --json     # the figures as JSON too
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import CA, REPO, ensure_local_bases  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
CELL_PREFIX = "cuda-ext-1.0.0-cu130-py311-"

# compiles csrc/*.cu, each to its own object (MAX_JOBS at a time, as ninja would), then links them
SETUP = '''\
import os, subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithNvcc(build_py):
    def run(self):
        super().run()
        archs = [a for a in os.environ.get("CUDA_EXT_ARCHS", "80").split(";") if a]
        nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
        gencode = [f for a in archs for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
        objdir = Path(self.build_lib).resolve().parent / "obj"
        objdir.mkdir(parents=True, exist_ok=True)
        sources = sorted((HERE / "csrc").glob("*.cu"))

        def compile_one(src):
            obj = objdir / (src.stem + ".o")
            cmd = [str(nvcc), "-O2", "-c", "-Xcompiler", "-fPIC", "-o", str(obj), *gencode, str(src)]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            return obj

        with ThreadPoolExecutor(int(os.environ.get("MAX_JOBS", "2"))) as pool:
            objs = list(pool.map(compile_one, sources))
        out = Path(self.build_lib) / "cuda_ext" / "libsaxpy.so"
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(nvcc), "-shared", "-cudart", "shared", *gencode, "-o", str(out), *map(str, objs)], check=True)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithNvcc}, distclass=BinaryDistribution)
'''


def kernel_source(i: int, instances: int, edit: str = "", unroll: int = 8) -> str:
    """One translation unit: a templated kernel instantiated `instances` times (compile time grows with it)."""
    inst = "\n".join(f"template __global__ void step{i}<{n}>(float *, const float *, int);" for n in range(1, instances + 1))
    return f"""// source {i}{edit}
template <int N>
__global__ void step{i}(float *out, const float *in, int n) {{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float x = in[t];
#pragma unroll
    for (int k = 0; k < N * {unroll}; ++k) x = x * 0.999f + __sinf(x + {i}.0f + k);
    out[t] = x;
}}
{inst}
"""


def make_fixture(root: Path, sources: int, instances: int, unroll: int = 8) -> Path:
    pkg = root / "pkg"
    shutil.copytree(FIXTURE / "pkg", pkg)
    (pkg / "csrc" / "saxpy.cu").unlink()
    tag = uuid.uuid4().hex[:8]  # sources no object cache has seen before
    for i in range(sources):
        (pkg / "csrc" / f"k{i:02d}.cu").write_text(kernel_source(i, instances, unroll=unroll) + f"// run {tag}\n")
    (pkg / "setup.py").write_text(SETUP)
    engines = (FIXTURE / "engines.toml").read_text().split("\n# The same package described")[0]
    (root / "engines.toml").write_text(engines)
    # images under a name of this run only (the fixture's own tag belongs to the tests)
    (root / "matrix.toml").write_text((FIXTURE / "matrix.toml").read_text()
                                      .replace("127.0.0.1:5000/builder-test", f"127.0.0.1:5000/bench-cc-{tag}"))
    return root / "matrix.toml"


def compile_run_wall(log: str) -> float | None:
    """BuildKit's DONE time of the RUN that ran with-sccache (the compile itself)."""
    step = None
    for line in log.splitlines():
        m = re.match(r"#(\d+) \[build-[^\]]+\] RUN .*with-sccache", line)
        if m:
            step = m.group(1)
        elif step and re.match(rf"#{step} DONE ([0-9.]+)s", line):
            return float(re.match(rf"#{step} DONE ([0-9.]+)s", line).group(1))
    return None


def build(root: Path, name: str, archs: str, namespace: str) -> dict:
    argv = [sys.executable, "-m", "builder.cli", "build", "--matrix", str(root / "matrix.toml"), "--arch", archs,
            "--ca-bundle", CA, "--wheelhouse", str(root / f"wh-{name}"), "--work-dir", str(root / "work"),
            "--log-dir", str(root / f"logs-{name}"), "--pins-dir", str(root / "pins"), "--no-smoke",
            "--quiet", "--json"]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=root,
                         env={**os.environ, "BUILDER_SCCACHE_NAMESPACE": namespace})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{name}: builder build failed:\n{(res.stdout + res.stderr)[-4000:]}")
    (cell,) = json.loads(res.stdout)
    compile_step = next(s for s in cell["steps"] if s["step"] == "compile")["artifacts"]
    (log,) = (root / f"logs-{name}").glob("*.log")
    stats = compile_step["compile"]["sccache"]
    return {"name": name, "archs": archs, "wall_s": round(wall, 1), "compile_run_s": compile_run_wall(log.read_text()),
            "hits": stats["hits"], "misses": stats["misses"], "hit_ratio": stats["hit_ratio"],
            "compiler_s": stats["compiler_seconds"], "hits_by_step": stats["hits_by_step"],
            "misses_by_step": stats["misses_by_step"]}


def report_key_change(runs: list[dict], instances: int) -> int:
    cold, key = runs
    ratio = key["compile_run_s"] / cold["compile_run_s"]
    print(f"compile cache, key change only, {instances} instantiations per source:")
    for r in runs:
        print(f"  {r['name']:<11} hits {r['hits']:>3} misses {r['misses']:>3}  compile RUN {r['compile_run_s']}s"
              f"  compilers {r['compiler_s']}s")
    print(f"  key change: {key['hit_ratio'] * 100:.1f} % hits; compile RUN {ratio * 100:.1f} % of cold")
    return 0 if key["hit_ratio"] >= 0.95 and ratio <= 0.10 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small kernels (the suite's mode)")
    ap.add_argument("--sources", type=int, default=16)
    ap.add_argument("--instances", type=int, default=None, help="template instantiations per source (weight)")
    ap.add_argument("--unroll", type=int, default=8, help="unrolled iterations per instantiation step (weight)")
    ap.add_argument("--key-change-only", action="store_true",
                    help="only cold and key change (the wall-time goal), e.g. with heavier kernels")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.sources < 16:
        sys.exit("--sources: at least 16 (reuse must show)")
    instances = args.instances or (2 if args.quick else 12)
    ensure_local_bases()
    root = Path(tempfile.mkdtemp(prefix="bench-cc-"))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        make_fixture(root, args.sources, instances, args.unroll)
        runs = [build(root, "cold", "80,90", namespace)]
        # a change of the wheel's key that no compile command sees: an environment variable no compiler reads
        engines = root / "engines.toml"
        engines.write_text(engines.read_text().replace('launch = ["python", "-m", "cuda_ext"]',
                                                       'launch = ["python", "-m", "cuda_ext"]\n'
                                                       'build_env = { BENCH_UNREAD = "1" }', 1))
        runs.append(build(root, "key-change", "80,90", namespace))
        if args.key_change_only:
            return report_key_change(runs, instances)
        runs.append(build(root, "plus-arch", "80,90,100", namespace))
        edited = root / "pkg" / "csrc" / "k00.cu"
        edited.write_text(edited.read_text().replace("x * 0.999f", "x * 0.998f"))
        runs.append(build(root, "edit-one", "80,90", namespace))
    finally:
        names = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                                "127.0.0.1:5000/bench-cc-*/*"], capture_output=True, text=True).stdout.split()
        if names:
            subprocess.run(["docker", "image", "rm", *names], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)

    cold, key, arch, edit = runs
    per_source = cold["misses"] / args.sources
    old_arch_steps = sum(arch["hits_by_step"].get(k, 0) for k in ("ptx [cicc]", "cubin [ptxas]"))
    new_arch_misses = sum(arch["misses_by_step"].get(k, 0) for k in ("ptx [cicc]", "cubin [ptxas]"))
    figures = {
        "sources": args.sources, "mode": "quick" if args.quick else "full", "runs": runs,
        "key_change_hit_ratio": key["hit_ratio"],
        "key_change_compile_run_vs_cold": round(key["compile_run_s"] / cold["compile_run_s"], 3)
        if key["compile_run_s"] and cold["compile_run_s"] else None,
        "key_change_compilers_vs_cold": round(key["compiler_s"] / cold["compiler_s"], 3) if cold["compiler_s"] else None,
        "plus_arch_old_arch_steps_hit": old_arch_steps, "plus_arch_old_arch_steps_expected": 4 * args.sources,
        "plus_arch_new_arch_steps_missed": new_arch_misses,
        "edit_one_misses": edit["misses"], "misses_per_source_cold": per_source,
    }
    print(f"compile cache (sccache {runs[0]['hits'] + runs[0]['misses']} steps cold), {args.sources} CUDA sources, "
          f"{figures['mode']} kernels, one run:")
    for r in runs:
        print(f"  {r['name']:<11} --arch {r['archs']:<9} hits {r['hits']:>3} misses {r['misses']:>3}"
              f" ({(r['hit_ratio'] or 0) * 100:5.1f} % hits)  compile RUN {r['compile_run_s']}s"
              f"  compilers {r['compiler_s']}s  build {r['wall_s']}s")
    print(f"  key change: {figures['key_change_hit_ratio'] * 100:.1f} % hits (goal >= 95 %); compile RUN "
          f"{figures['key_change_compile_run_vs_cold'] * 100:.1f} % of cold (goal <= 10 %); compilers "
          f"{(figures['key_change_compilers_vs_cold'] or 0) * 100:.1f} % of cold")
    print(f"  +1 arch: sm_80/sm_90 cicc+ptxas steps hit {old_arch_steps} of {4 * args.sources}; "
          f"sm_100's missed {new_arch_misses} (expected {2 * args.sources})")
    print(f"  edit one .cu: {edit['misses']} misses = one source's steps ({per_source:g} per source cold); "
          f"{edit['hits']} hits")
    if args.json:
        print(json.dumps(figures, indent=2))
    ok = (figures["key_change_hit_ratio"] >= 0.95 and figures["key_change_compile_run_vs_cold"] <= 0.10
          and old_arch_steps == 4 * args.sources and edit["misses"] == per_source)
    print("goals met" if ok else "GOALS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
