"""What the engine's JIT modules cost at the first request, and what `jit = "prebuilt"` costs and saves.

Each JIT module a cell's engine builds (engine data jit_modules) is built through its own generator by smoke's
probe (builder/deploy/smoke/probe.py `jit`), for each of the cell's archs in the families that select it, twice against
one cache directory: the first build is what the first request pays without a prebuilt image, the second what it
pays with one (nothing compiled); the cache's size is what a prebuilt image adds.

    # a Python environment with the engine installed (e.g. a venv with vllm==0.33.0 and the runtime_jit pieces),
    # CUDA_HOME pointing at its nvcc with the unversioned library links and lib64/stubs/libcuda.so:
    .venv/bin/python benchmarks/jit_modules.py --python /path/to/venv/bin/python --cell 'vllm-0.33.0-*'
    # quick: the fixture package's own nvrtc-linking module in its image (tests/fixtures/cuda-ext), through Docker
    .venv/bin/python benchmarks/jit_modules.py --quick
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CA, REPO, builder, ensure_local_bases  # noqa: E402

sys.path.insert(0, str(REPO))
from builder.matrix import Selection, load  # noqa: E402
from builder.resolve import select  # noqa: E402
from builder.deploy.smoke import layers  # noqa: E402

PROBE = REPO / "builder" / "smoke" / "probe.py"
FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext" / "matrix-jit-modules.toml"


def du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def run_probe(argv: list[str], spec: dict) -> dict:
    out = subprocess.run([*argv, "jit", json.dumps(spec)], capture_output=True, text=True)
    line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("BUILDER-PROBE-RESULT: ")), None)
    if line is None:
        sys.exit(f"the probe did not report:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return json.loads(line.split(": ", 1)[1])["modules"]


def in_python(python: str, cell) -> None:
    spec = layers.jit_spec(cell)
    spec["paths"] = []
    with tempfile.TemporaryDirectory(prefix="builder-jit-bench-") as cache:
        for m in spec["modules"]:
            m["cache_dir"] = cache
        first, again = run_probe([python, str(PROBE)], spec), run_probe([python, str(PROBE)], spec)
        mib = du_mib(Path(cache))
    print(f"{cell.id}: the engine's JIT modules through their own generators, no GPU ({os.cpu_count()} cores)")
    for key, got in first.items():
        if not got["ok"]:
            print(f"  {key}: FAILED after {got['seconds']} s: {got['error']}")
            continue
        print(f"  {key}: first request {got['seconds']} s ({got['built']} files built, library "
              f"{got.get('library_bytes', 0) / 2**20:.2f} MiB); again {again[key]['seconds']} s "
              f"({again[key].get('built')} built)")
    print(f"prebuilt: the JIT cache holds {mib:.1f} MiB; first-request compiles "
          f"{sum(g['seconds'] for g in first.values()):.1f} s, prebuilt {sum(g['seconds'] for g in again.values()):.1f} s")


def quick() -> None:
    ensure_local_bases()
    cells = {c.jit_prebuilt: c for c in select(load(FIXTURE), Selection(profiles=("all",)))}
    seconds, mib = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for prebuilt in (False, True):
            cell = cells[prebuilt]
            t0 = time.monotonic()
            builder("build", "--matrix", str(FIXTURE), "--only", cell.id, "--wheelhouse", f"{tmp}/wheelhouse",
                    "--work-dir", f"{tmp}/work", "--log-dir", f"{tmp}/logs", "--pins-dir", f"{tmp}/pins", "--quiet",
                    *(("--ca-bundle", CA) if Path(CA).is_file() else ()))
            seconds[prebuilt] = time.monotonic() - t0
            size = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", cell.ref],
                                  capture_output=True, text=True, check=True)
            mib[prebuilt] = int(size.stdout) / 2**20
            (rep,) = json.loads((Path(tmp) / "work" / cell.id / "smoke" / "smoke.json").read_text())
            jit = next(r for r in rep["results"] if r["layer"] == "JIT")
            print(f"{cell.id}: build {seconds[prebuilt]:.0f} s, image {mib[prebuilt]:.1f} MiB, JIT layer "
                  f"{jit['seconds']:.1f} s: {jit['reason']}")
    print(f"jit = prebuilt: +{mib[True] - mib[False]:.2f} MiB image, build {seconds[True]:.0f} s after the "
          f"first-request cell's {seconds[False]:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the fixture's module in its images (Docker)")
    ap.add_argument("--python", help="a Python environment with the engine installed")
    ap.add_argument("--cell", default="vllm-0.33.0-*", help="cell id glob of the shipped matrix (with --python)")
    args = ap.parse_args()
    if args.quick or not args.python:
        quick()
        return
    cells = [c for c in select(load(REPO / "matrix.toml"), Selection(profiles=("all",)))
             if fnmatch.fnmatch(c.id, args.cell) and c.jit_builds]
    if not cells:
        sys.exit(f"no shipped cell matching {args.cell!r} builds JIT modules")
    for cell in cells:
        in_python(args.python, cell)


if __name__ == "__main__":
    main()
