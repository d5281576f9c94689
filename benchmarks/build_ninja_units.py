"""Compile work counted in the real build system's own build.ninja: flash-attn 2.8.3 (the SGLang and vLLM cells'
flash-attn), configured by its own setup.py with torch 2.14.0's BuildExtension and nvcc 13.0, for the cell's archs
(the rendered knob FLASH_ATTN_CUDA_ARCHS and patches) and for upstream's default arch list (the knob unset).

torch's BuildExtension writes build.ninja and then runs ninja; here ninja is not run (the step that would start
nvcc is replaced by one that stops), so the file is exactly what a build would execute. The configure runs in a
network namespace of its own (`unshare --net`, root): it can download nothing. Counted: CUDA translation units
(`cuda_compile` edges) × SASS targets (`code=sm_XX` of the -gencode flags nvcc gets).

    benchmarks/build_ninja_units.py --python VENV/bin/python [--arch 80,90]

VENV: a virtual environment with torch==2.14.0 (PyPI, CUDA 13 build), setuptools, wheel, packaging, ninja,
psutil, einops. CUDA_HOME defaults to /usr/local/cuda-13.0 (nvcc 13.0.88). vLLM 0.33.0 is not counted here: its
configure needs GCC >= 13 and the repositories its CMake fetches from GitHub (see the README).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder import archs as archs_mod  # noqa: E402
from builder.engines import recipe  # noqa: E402
from builder.lock import Lock, _download  # noqa: E402
from builder.pypi import SimpleIndex  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Run inside the sdist with the environment the build stage sets: build_ext until build.ninja is written.
DRIVER = r'''
import json, runpy, sys
import torch.utils.cpp_extension as ce

class Written(Exception):
    pass

def stop(*args, **kwargs):
    raise Written()

ce._run_ninja_build = stop
sys.argv = ["setup.py", "build_ext", "--build-temp", sys.argv[1], "--build-lib", sys.argv[1] + "/lib"]
try:
    runpy.run_path("setup.py", run_name="__main__")
except Written:
    print("build.ninja written")
'''


def configure(python: str, sdist: Path, archs: str | None, work: Path) -> Path:
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
    if "build.ninja written" not in proc.stdout:
        raise SystemExit(f"setup.py did not reach build.ninja (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return temp / "build.ninja"


def count(ninja: Path) -> tuple[int, list[str], list[str]]:
    """(CUDA translation units, SASS targets every one of them is compiled for, every -gencode entry)."""
    text = ninja.read_text()
    tus = len(re.findall(r"^build \S+: cuda_compile ", text, re.M))
    flags = " ".join(re.findall(r"^cuda_(?:post_)?cflags = (.*)$", text, re.M))
    entries = re.findall(r"(?:-gencode|--generate-code)[= ](arch=\S+)", flags)
    codes = [c for e in entries for c in re.sub(r"^arch=[^,]+,code=", "", e).strip("[]").split(",")]
    sass = sorted({c for c in codes if c.startswith("sm_")}, key=lambda s: int(re.sub(r"\D", "", s)))
    return tus, sass, entries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="python of a venv with torch 2.14.0")
    ap.add_argument("--arch", default="80,90")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    asked = archs_mod.parse(args.arch)
    knob = recipe("flash-attn", "2.8.3").knob_values(asked)
    entry = Lock.load(REPO / "matrix.lock").data["packages"]["flash-attn==2.8.3"]["sdist"]
    sdist = _download(SimpleIndex("https://pypi.org/simple"), entry["url"], entry["sha256"], entry["filename"])
    result = {}
    for label, value in (("cell", dict(knob)["FLASH_ATTN_CUDA_ARCHS"]), ("upstream default", None)):
        with tempfile.TemporaryDirectory(prefix="fa-ninja-") as tmp:
            tus, sass, entries = count(configure(args.python, sdist, value, Path(tmp)))
        result[label] = {"tus": tus, "sass": sass, "units": tus * len(sass), "knob": value, "gencode": entries}
    cell, default = result["cell"], result["upstream default"]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for label, r in result.items():
            print(f"flash-attn 2.8.3 {label:<17} FLASH_ATTN_CUDA_ARCHS={r['knob']!s:<8} {r['tus']} CUDA TUs × "
                  f"{len(r['sass'])} SASS ({' '.join(r['sass'])}) = {r['units']} units")
        print(f"ratio {100 * cell['units'] / default['units']:.1f} % of upstream's default build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
