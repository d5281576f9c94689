"""An unchanged cell on a fresh runner (builder/reuse.py), on the fixture cell (tests/fixtures/cuda-ext): the
cell is published once to a real registry on 127.0.0.1 (its wheel to the registry's wheel cache); then each
round is a fresh runner — the cell's tag gone from the daemon, an empty wheelhouse and image ledger, only the
runtime pins kept — timed twice:

  reuse   build --reuse-from REGISTRY: the wheel pulled from the wheel cache, the image pulled by the
          registry's digest (the ledger record in the image's repository vouches for it); no image build
  build   the same fresh runner without --reuse-from: the wheel pulled, the image built (BuildKit's layer
          cache warm, so this is the OCI export + load of today's fresh CI runner, at the fixture's size)

Prints the median wall seconds of each and the image step's own seconds. The daemon here is shared and never
pruned: layer blobs of the cell's earlier builds may still sit in its content store, so a pull may move fewer
bytes than on a really fresh runner (the image's compressed size is printed beside it).

    .venv/bin/python benchmarks/registry_reuse.py            # 3 rounds
    .venv/bin/python benchmarks/registry_reuse.py --quick    # 1 round (the suite's mode)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import CA, FIXTURE_MATRIX, REPO, ensure_local_bases  # noqa: E402

TAG = "1.0.0-cu130-py311-sm80.90"


def run(verb: str, work: Path, matrix: Path, registry: str, *extra: str) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "builder.cli", verb, "--matrix", str(matrix), "--ca-bundle", CA,
            "--wheelhouse", str(work / "wheelhouse"), "--work-dir", str(work / "w"), "--log-dir", str(work / "logs"),
            "--pins-dir", str(matrix.parent.parent / "pins"), "--quiet", "--json",
            "--cache-remote", f"registry:{registry}/wheels", *extra]
    if verb == "publish":
        argv += ["--registry", registry, "--images-json", str(work / "images.json")]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{verb} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    out = res.stdout[:res.stdout.rindex("]") + 1]
    (cell,) = json.loads(out)
    return seconds, {r["step"]: r for r in cell["steps"]}


def forget(ref: str) -> None:
    subprocess.run(["docker", "image", "rm", ref], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one round")
    args = ap.parse_args()
    rounds = 1 if args.quick else 3
    ensure_local_bases()
    from tests import services

    services.build_image(services.REGISTRY_IMAGE, services.SERVICES / "registry")
    names = f"127.0.0.1:5000/builder-bench-rr{uuid.uuid4().hex[:8]}"
    ref = f"{names}/cuda-ext:{TAG}"
    root = Path(tempfile.mkdtemp(prefix="builder-bench-reuse-"))
    try:
        fx = root / "fx"
        shutil.copytree(FIXTURE_MATRIX.parent, fx)
        text = (fx / "matrix.toml").read_text().replace('registry = "127.0.0.1:5000/builder-test"',
                                                        f'registry = "{names}"')
        (fx / "matrix.toml").write_text(text)
        matrix = fx / "matrix.toml"
        with services.registry() as reg:
            registry = f"{reg.host}/bench"
            first, steps = run("publish", root / "first", matrix, registry)
            digest = steps["publish"]["artifacts"]["digest"]
            reuse_s, reuse_image, build_s, build_image, size = [], [], [], [], 0
            for n in range(rounds):
                forget(ref)
                seconds, steps = run("build", root / f"reuse{n}", matrix, registry, "--no-smoke",
                                     "--reuse-from", registry)
                image = steps["image"]
                if not image["artifacts"].get("pulled") or image["artifacts"]["digest"] != digest:
                    sys.exit(f"round {n}: the fresh runner did not pull {digest}: {image}")
                reuse_s.append(seconds)
                size = image["artifacts"].get("bytes", 0)
                reuse_image.append(image["seconds"])
                forget(ref)
                seconds, steps = run("build", root / f"build{n}", matrix, registry, "--no-smoke")
                if steps["image"]["artifacts"].get("reused"):
                    sys.exit(f"round {n}: the build without --reuse-from reused: {steps['image']}")
                build_s.append(seconds)
                build_image.append(steps["image"]["seconds"])
    finally:
        forget(ref)
        shutil.rmtree(root, ignore_errors=True)
    print(f"fixture cell cuda-ext 1.0.0 (sm_80 + sm_90), image {size / 1e6:.1f} MB compressed: published once in "
          f"{first:.1f} s to a registry on 127.0.0.1; {rounds} fresh runner round(s), wheel from the registry's wheel "
          "cache in both")
    print(f"registry reuse: median {statistics.median(reuse_s):.1f} s wall (image step "
          f"{statistics.median(reuse_image):.1f} s, pull included), fresh build {statistics.median(build_s):.1f} s wall "
          f"(image step {statistics.median(build_image):.1f} s), over {rounds} round(s)")


if __name__ == "__main__":
    main()
