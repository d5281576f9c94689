"""Compile work of the SGLang cell, in kernel×arch units (one device-code object per CUDA source and SASS target),
counted from the real packages — upstream's default build against a build for the cell's archs.

- sglang-kernel 0.4.10: the x86_64 wheel on PyPI (built from the v0.5.23 sources with nvcc 13.0, the cell's
  toolchain); per binary its fatbin entries per SASS target are counted, then the gencode filter's own rule
  (builder/gencode_filter.py `keep`, with the engine data's scopes) picks the targets a build for --arch keeps:
  Recipe.binary_plans, what `builder plan` prints.
- flash-attn (the shipped pin): the sdist's setup.py, the CUDA sources of its extension (`.cu` entries of the `sources=`
  list) × its SASS targets: FLASH_ATTN_CUDA_ARCHS, default "80;90;100;120" as setup.py reads it.

    .venv/bin/python benchmarks/compile_units.py [--arch 80,90]
    .venv/bin/python benchmarks/compile_units.py --quick   # flash-attn only: the sdist, not the 373 MB wheel

Downloads (once, into ~/.cache/builder/sdists): the wheel (373 MB) and the sdist (8 MB).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder import archs as archs_mod  # noqa: E402
from builder.engines import recipe  # noqa: E402
from builder.lock import _download  # noqa: E402
from builder.lockfile import Lock  # noqa: E402
from builder.pypi import SimpleIndex  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WHEEL = "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"
INDEX = "https://pypi.org/simple"


def shipped_flash_attn() -> str:
    """The flash-attn version the shipped cu130 profile pins (matrix.toml)."""
    from builder.matrix import load

    return load(REPO / "matrix.toml").profiles["cu130"].flash_attn
CUDA = "13.0"  # the cell's toolchain, the CUDA release the engine data's binaries were read from


def sglang_kernel_units(archs: tuple[int, ...]) -> list[tuple[str, dict[str, int], tuple[str, ...], tuple[str, ...]]]:
    """[(binary, {sass: entries}, SASS kept for archs, SASS of the switch alone)]: the entries counted in the wheel,
    the SASS kept what plan says (Recipe.binary_plans: the gencode filter's rule on the engine data's binaries, one
    code path); without the filter only ENABLE_BELOW_SM90 reaches the CMake (sm_8x on or off)."""
    index = SimpleIndex(INDEX)
    (f,) = [f for f in index.files("sglang-kernel") if f.filename == WHEEL]
    wheel = _download(index, f.url, f.sha256, f.filename)
    r = recipe("sglang-kernel", "0.4.10")
    plans = {bp.binary.files: bp for bp in r.binary_plans(archs, CUDA)}
    switch_only = {bp.binary.files: bp.sass for bp in dataclasses.replace(r, arch_select="").binary_plans(archs, CUDA)}
    from builder.audit import read_fatbin_entries

    out = []
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        for name in sorted(n for n in z.namelist() if n.endswith(".so")):
            path = Path(z.extract(name, tmp))
            counts = collections.Counter(e.name for e in read_fatbin_entries(path) if e.kind == "sass")
            path.unlink()
            (files,) = [g for g in plans if archs_mod.ArchScope(g, (), "").matches(name)]
            out.append((name, dict(counts), plans[files].sass, switch_only[files]))
    return out


def flash_attn_units(archs: tuple[int, ...]) -> tuple[int, int, int]:
    """(CUDA sources, units for archs, units for setup.py's default arch list)."""
    version = shipped_flash_attn()
    entry = Lock.load(REPO / "matrix.lock").data["packages"][f"flash-attn=={version}"]["sdist"]
    sdist = _download(SimpleIndex(INDEX), entry["url"], entry["sha256"], entry["filename"])
    with tarfile.open(sdist) as tf:
        setup = tf.extractfile(f"flash_attn-{version}/setup.py").read().decode()
    sources = re.findall(r'"(csrc/flash_attn/src/[^"]+\.cu)"', setup)
    default = re.search(r'os\.getenv\("FLASH_ATTN_CUDA_ARCHS", "([0-9;]+)"\)', setup).group(1).split(";")
    asked = recipe("flash-attn", version).arch_knobs[0].archs_for(archs)  # what plan gives FLASH_ATTN_CUDA_ARCHS
    return len(sources), len(sources) * len(asked), len(sources) * len(default)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--quick", action="store_true", help="flash-attn only (the test suite's mode)")
    args = ap.parse_args()
    archs = archs_mod.parse(args.arch)
    if args.quick:
        tus, fa_built, fa_default = flash_attn_units(archs)
        print(f"flash-attn {shipped_flash_attn()} ({tus} CUDA sources) for {', '.join(map(archs_mod.sm, archs))}: {fa_built} kernel×arch "
              f"units built of {fa_default} for setup.py's default arch list ({100 * fa_built / fa_default:.1f} %)")
        return 0
    print(f"SGLang cell (sglang 0.5.23, sglang-kernel 0.4.10, flash-attn {shipped_flash_attn()}, CUDA 13.0) for "
          f"{', '.join(map(archs_mod.sm, archs))}: kernel×arch units, upstream default vs this build\n")
    total_default = total_built = sk_switch_only = 0
    print(f"{'sglang-kernel 0.4.10 binary':<56} {'upstream':>9} {'built':>7}  SASS kept")
    for name, counts, kept, switch_only in sglang_kernel_units(archs):
        default, built = sum(counts.values()), sum(counts[s] for s in kept)
        total_default += default
        total_built += built
        sk_switch_only += sum(counts[s] for s in switch_only)
        print(f"  {name:<54} {default:>9} {built:>7}  {' '.join(kept) or 'not built (its CMake option OFF)'}")
    sk_default, sk_built = total_default, total_built
    print(f"  {'sglang-kernel':<54} {sk_default:>9} {sk_built:>7}  ({100 * sk_built / sk_default:.1f} %)")
    tus, fa_built, fa_default = flash_attn_units(archs)
    total_default += fa_default
    total_built += fa_built
    print(f"  {'flash-attn ' + shipped_flash_attn() + ' (' + str(tus) + ' CUDA sources)':<54} {fa_default:>9} {fa_built:>7}  "
          f"({100 * fa_built / fa_default:.1f} %)")
    ratio = total_built / total_default
    # without the filter --arch reached sglang-kernel only through ENABLE_BELOW_SM90 (ON, its default, for any arch
    # below 90: the whole upstream set; OFF drops the sm_8x entries)
    unfiltered = sk_switch_only + fa_built
    print(f"\n  {'SGLang cell, sglang-kernel unfiltered (switch only)':<54} {total_default:>9} {unfiltered:>7}  "
          f"ratio {100 * unfiltered / total_default:.1f} %")
    print(f"\n  {'SGLang cell':<54} {total_default:>9} {total_built:>7}  ratio {100 * ratio:.1f} % "
          f"(goal <= 55 %: {'met' if ratio <= 0.55 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
