"""builder's overhead over raw `docker buildx build` of the same rendered Dockerfile (goal ≤ 1.05×).

Both sides do the same work from scratch (--no-cache, an empty wheelhouse): compile the fixture's wheel
stage, then build the runtime image. builder adds rendering, planning, the parallelism rule, log files, the
fatbin audit, the wheelhouse store and the closing table. Runs alternate so that neither side always goes
first; the figure is the ratio of the medians.

    .venv/bin/python benchmarks/build_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CA, FIXTURE_MATRIX, builder, dry_run_commands, ensure_local_bases, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    rounds = ap.parse_args().rounds
    ensure_local_bases()
    work = Path(tempfile.mkdtemp(prefix="builder-bench-"))
    try:
        common = ["--matrix", str(FIXTURE_MATRIX), "--arch", "80,90", "--ca-bundle", CA, "--no-cache",
                  "--max-jobs", "2", "--nvcc-threads", "1"]
        tool, raw = [], []
        for i in range(rounds):
            wh, wd = work / f"wh{i}", work / f"w{i}"
            tool_argv = [sys.executable, "-m", "builder.cli", "build", *common, "--wheelhouse", str(wh), "--work-dir", str(wd),
                         "--log-dir", str(work / f"logs{i}"), "--quiet"]
            # the raw side runs exactly the commands builder would, on the Dockerfile builder rendered
            rwh, rwd = work / f"rwh{i}", work / f"rw{i}"
            cmds = dry_run_commands(*common, "--wheelhouse", str(rwh), "--work-dir", str(rwd))
            rendered = builder("render", "--matrix", str(FIXTURE_MATRIX), "--arch", "80,90").stdout
            cell_dirs = {Path(c[c.index("-f") + 1]).parent for c in cmds}
            for d in cell_dirs:
                (d / "context").mkdir(parents=True, exist_ok=True)
                (d / "Dockerfile").write_text(rendered)

            def raw_build() -> float:
                t = 0.0
                wheel_cmd, runtime_cmd = cmds
                t += timed(wheel_cmd)
                out = Path(wheel_cmd[wheel_cmd.index("--output") + 1].split("dest=", 1)[1])
                stage = Path(next(a.split("=", 1)[1] for a in runtime_cmd if a.startswith("wheels=")))
                stage.mkdir(parents=True, exist_ok=True)
                for w in out.glob("*.whl"):
                    shutil.copy2(w, stage / w.name)
                t += timed(runtime_cmd)
                return t

            if i % 2 == 0:
                tool.append(timed(tool_argv)); raw.append(raw_build())
            else:
                raw.append(raw_build()); tool.append(timed(tool_argv))
            print(f"round {i + 1}: builder {tool[-1]:.1f} s, raw buildx {raw[-1]:.1f} s", flush=True)
        t, r = statistics.median(tool), statistics.median(raw)
        print(f"median builder build {t:.1f} s, raw docker buildx build {r:.1f} s, overhead ratio {t / r:.3f}x (goal <= 1.05x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
