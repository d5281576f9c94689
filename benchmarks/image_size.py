"""Runtime image size against the devel stage of the same Dockerfile (goal: runtime ≤ 60 % of devel).

devel = toolchain + torch + the compiled wheels (what a single-stage image ships); runtime = the small base +
Python + only the wheels. Measured on the fixture cell over the local bases (and on any other cell whose
wheels are already in the wheelhouse: pass --matrix / --only).

    .venv/bin/python benchmarks/image_size.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CA, FIXTURE_MATRIX, builder, ensure_local_bases  # noqa: E402


def size(ref: str) -> int:
    """Bytes a registry pull moves: the image's compressed content (docker image inspect .Size)."""
    out = subprocess.run(["docker", "image", "inspect", ref, "--format", "{{.Size}}"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def disk_size(ref: str) -> float:
    """Bytes on disk once pulled (docker image ls, content + unpacked snapshot), parsed from its units."""
    out = subprocess.run(["docker", "image", "ls", "--format", "{{.Size}}", ref], capture_output=True, text=True, check=True)
    text = out.stdout.split()[0]
    units = {"kB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1}
    unit = next(u for u in units if text.endswith(u))
    return float(text[: -len(unit)]) * units[unit]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", default=str(FIXTURE_MATRIX))
    ap.add_argument("--only", default="*")
    args = ap.parse_args()
    ensure_local_bases()
    with tempfile.TemporaryDirectory(prefix="builder-size-") as tmp:
        wh, wd = Path(tmp) / "wh", Path(tmp) / "w"
        res = builder("build", "--matrix", args.matrix, "--only", args.only, "--wheelhouse", str(wh), "--work-dir", str(wd),
                      "--log-dir", str(Path(tmp) / "logs"), "--pins-dir", str(Path(tmp) / "pins"), "--ca-bundle", CA,
                      "--quiet", "--json")
        for r in json.loads(res.stdout):
            cell, ref = r["cell"], r["image"]
            stage = wd / cell / "wheels"
            devel_ref = f"builder-bench/devel:{cell}"
            subprocess.run(["docker", "buildx", "build", "--progress=quiet", "-f", str(wd / cell / "Dockerfile"), "--target", "devel",
                            "--build-context", f"wheels={stage}", "--secret", f"id=ca,src={CA}", "--tag", devel_ref, "--load",
                            str(wd / cell / "context")], check=True, stdout=subprocess.DEVNULL)
            rt, dv = size(ref), size(devel_ref)
            rtd, dvd = disk_size(ref), disk_size(devel_ref)
            print(f"{cell}: pull size runtime {rt / 1e6:.0f} MB vs devel {dv / 1e6:.0f} MB = {rt / dv:.1%}; "
                  f"on disk {rtd / 1e6:.0f} MB vs {dvd / 1e6:.0f} MB = {rtd / dvd:.1%} (goal <= 60%)")
            subprocess.run(["docker", "image", "rm", devel_ref], capture_output=True)


if __name__ == "__main__":
    main()
