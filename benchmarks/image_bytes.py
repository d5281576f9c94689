"""Where a runtime image's bytes go (issue 48's size table; goal for the vLLM 0.33.0 cell: <= 9.9 GB in files,
<= 4.3 GB compressed): per layer, per kind of content, per distribution, the files shipped twice, the files of
other archs and the device code the cell's archs never load (builder/image/sizes.py).

    .venv/bin/python benchmarks/image_bytes.py --archive WORK/<cell>/image.oci.tar --arch 80,90 [--json OUT]
    .venv/bin/python benchmarks/image_bytes.py --quick      # the fixture cell, built here first

The archive is the one `builder build` leaves in the cell's work dir; it is read as a stream (a 15 GB image needs
no 15 GB of memory)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import CA, FIXTURE_MATRIX, builder, ensure_local_bases  # noqa: E402

from builder import archs as archs_mod  # noqa: E402
from builder.image import sizes  # noqa: E402

GOAL_BYTES, GOAL_COMPRESSED = 9.9e9, 4.3e9


def fixture_archive(tmp: Path) -> tuple[Path, tuple[int, ...]]:
    ensure_local_bases()
    res = builder("build", "--matrix", str(FIXTURE_MATRIX), "--wheelhouse", str(tmp / "wh"), "--work-dir", str(tmp / "w"),
                  "--log-dir", str(tmp / "logs"), "--pins-dir", str(tmp / "pins"), "--ca-bundle", CA, "--quiet",
                  "--no-smoke", "--json")
    (cell,) = json.loads(res.stdout[:res.stdout.rindex("]") + 1])
    return tmp / "w" / cell["cell"] / "image.oci.tar", (80, 90)


def chosen_archive(quick: bool, given: Path | None, tmp: Path) -> Path:
    """The archive a benchmark reads: the fixture cell's, built under `tmp` (--quick), or the one given (--archive)."""
    if quick:
        return fixture_archive(tmp)[0]
    if given is None:
        sys.exit("give --archive PATH or --quick")
    return given


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, help="an OCI archive of the image (builder's image.oci.tar)")
    ap.add_argument("--arch", default="80,90", help="the cell's archs (what device code is loaded)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    ap.add_argument("--quick", action="store_true", help="build the fixture cell and measure its image")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="builder-bytes-") as tmp:
        if args.archive is None:
            archive, archs = fixture_archive(Path(tmp))
        else:
            archive, archs = args.archive, archs_mod.parse(args.arch)
        started = time.monotonic()
        found = sizes.measure(archive, archs, say=lambda line: print(line, file=sys.stderr, flush=True))
        seconds = time.monotonic() - started
    print("\n".join(sizes.report(found)))
    if args.json:
        args.json.write_text(json.dumps(sizes.to_json(found), indent=1))
    dups = sum(d for d, _ in sizes.duplicates(found))
    dead = sum(f.dead for f in found.files.values() if not f.linked)
    print(f"\nimage bytes: {found.total / 1e9:.2f} GB in files (goal <= {GOAL_BYTES / 1e9:.1f}), "
          f"{found.compressed / 1e9:.2f} GB compressed (goal <= {GOAL_COMPRESSED / 1e9:.1f}); shipped twice "
          f"{dups / 1e9:.2f} GB; device code no sm_{'/'.join(map(str, archs))} GPU loads {dead / 1e9:.2f} GB; "
          f"read in {seconds:.1f} s")


if __name__ == "__main__":
    main()
