"""builder's overhead over raw `docker buildx build` of the same rendered Dockerfile (goal ≤ 1.05×).

Both sides do the same work from scratch (--no-cache, an empty wheelhouse): compile the fixture's wheel
stage, build the runtime image into an OCI archive and `docker load` it. The raw side runs the very commands
`builder build --dry-run` prints, on the Dockerfile builder rendered, and stages the wheels as the image step
does: the wheels, their wheels.sha256 (which the runtime stage checks before pip sees a wheel) and the cell's
hash-locked runtime requirements. Those come from one untimed warm-up build (a cell's first build resolves and
records them: a one-time cost, not a per-build one). builder adds rendering, planning, the parallelism rule, log
files, the fatbin audit, the wheelhouse store, the image checks and the closing table; the smoke step (a
container boot, which raw buildx does not do) is left out on both sides (--no-smoke). Runs alternate so that
neither side always goes first; the figure is the ratio of the medians (and, next to it, the median of each
round's own ratio, which a load that drifts between rounds moves less).

    .venv/bin/python benchmarks/build_overhead.py [--rounds 3]
    .venv/bin/python benchmarks/build_overhead.py --quick   # one round (the test suite's slow tier)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import CA, FIXTURE_MATRIX, builder, dry_run_commands, ensure_local_bases, timed  # noqa: E402

WHEEL_SUMS = "wheels.sha256"  # builder/steps/image.py WHEEL_SUMS


def stage_wheels(out: Path, stage: Path, pins_file: Path) -> None:
    """What the image step puts in the runtime's `wheels` context, for the wheels the raw wheel build exported."""
    from builder import pins

    stage.mkdir(parents=True, exist_ok=True)
    sums, own = [], []
    for w in sorted(out.glob("*.whl")):
        shutil.copy2(w, stage / w.name)
        digest = hashlib.sha256(w.read_bytes()).hexdigest()
        sums.append(f"{digest}  /wheels/{w.name}\n")
        own.append((w.name, digest))
    if not sums:
        sys.exit(f"the raw wheel build exported no wheel into {out}")
    (stage / WHEEL_SUMS).write_text("".join(sums))
    text = pins_file.read_text()
    if pins.hashed(text):
        (stage / pins.HASHED_IN_CONTEXT).write_text(pins.requirements(text, own))
    else:
        (stage / pins.FILE_IN_CONTEXT).write_text(pins.constraints(text))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    ensure_local_bases()
    work = Path(tempfile.mkdtemp(prefix="builder-bench-"))
    raw_images: list[str] = []
    try:
        common = ["--matrix", str(FIXTURE_MATRIX), "--arch", "80,90", "--ca-bundle", CA, "--max-jobs", "2",
                  "--nvcc-threads", "1", "--no-smoke", "--pins-dir", str(work / "pins")]

        def tool_argv(tag: str, *extra: str) -> list[str]:
            return [sys.executable, "-m", "builder.cli", "build", *common, *extra, "--wheelhouse", str(work / f"wh{tag}"),
                    "--work-dir", str(work / f"w{tag}"), "--log-dir", str(work / f"logs{tag}"), "--quiet", "--json"]

        def tool_build(argv: list[str]) -> float:
            t0 = time.perf_counter()
            res = subprocess.run(argv, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if res.returncode != 0:
                sys.exit(f"builder build failed ({res.returncode}):\n{res.stderr[-3000:]}")
            (cell,) = json.loads(res.stdout)
            steps.append({s["step"]: s["seconds"] for s in cell["steps"]})
            return wall

        # the warm-up records the cell's runtime pins (BuildKit's cache may serve it: it is not timed)
        subprocess.run(tool_argv("-warm-up"), check=True, stdout=subprocess.DEVNULL)
        (pins_file,) = (work / "pins").glob("*.txt")
        tool, raw = [], []
        steps: list[dict] = []
        raw_steps: list[dict] = []
        for i in range(rounds):
            # the raw side runs exactly the commands builder would, on the Dockerfile builder rendered
            cmds = dry_run_commands(*common, "--no-cache", "--wheelhouse", str(work / f"rwh{i}"),
                                    "--work-dir", str(work / f"rw{i}"))
            wheel_cmd, runtime_cmd = (c for c in cmds if c[:3] == ["docker", "buildx", "build"])
            rendered = builder("render", "--matrix", str(FIXTURE_MATRIX), "--arch", "80,90").stdout
            (Path(wheel_cmd[wheel_cmd.index("-f") + 1]).parent / "context").mkdir(parents=True, exist_ok=True)
            Path(wheel_cmd[wheel_cmd.index("-f") + 1]).write_text(rendered)
            # its image under a name of its own (builder's is the cell's tag)
            name = f"builder-bench/overhead:raw-{secrets.token_hex(4)}"
            out_at = runtime_cmd.index("--output") + 1
            runtime_cmd[out_at] = ",".join(f"name={name}" if kv.startswith("name=") else kv
                                           for kv in runtime_cmd[out_at].split(","))
            archive = next(kv.split("=", 1)[1] for kv in runtime_cmd[out_at].split(",") if kv.startswith("dest="))

            def raw_build() -> float:
                wheel = timed(wheel_cmd)
                out = Path(wheel_cmd[wheel_cmd.index("--output") + 1].split("dest=", 1)[1])
                stage_wheels(out, Path(next(a.split("=", 1)[1] for a in runtime_cmd if a.startswith("wheels="))),
                             pins_file)
                runtime = timed(runtime_cmd)
                load = timed(["docker", "load", "--input", archive])
                raw_images.append(name)
                raw_steps.append({"wheel": wheel, "runtime + load": runtime + load})
                return wheel + runtime + load

            argv = tool_argv(str(i), "--no-cache")
            if i % 2 == 0:
                tool.append(tool_build(argv)); raw.append(raw_build())
            else:
                raw.append(raw_build()); tool.append(tool_build(argv))
            print(f"round {i + 1}: builder {tool[-1]:.1f} s (compile {steps[-1]['compile']:.1f}, image "
                  f"{steps[-1]['image']:.1f}), raw buildx {raw[-1]:.1f} s (wheel {raw_steps[-1]['wheel']:.1f}, "
                  f"runtime + load {raw_steps[-1]['runtime + load']:.1f})", flush=True)
        t, r = statistics.median(tool), statistics.median(raw)
        paired = statistics.median(a / b for a, b in zip(tool, raw))
        print(f"median builder build {t:.1f} s, raw docker buildx build {r:.1f} s, overhead ratio {t / r:.3f}x "
              f"over {rounds} round{'s' if rounds > 1 else ''} (goal <= 1.05x); median of the rounds' own ratios "
              f"{paired:.3f}x (steadier when the host's load drifts between rounds)")
    finally:
        for name in raw_images:
            subprocess.run(["docker", "image", "rm", name], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
