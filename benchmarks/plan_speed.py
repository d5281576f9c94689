"""`builder plan` over the whole shipped matrix, as a user runs it (a fresh process, no Docker): goal < 1 s.

    .venv/bin/python benchmarks/plan_speed.py
    .venv/bin/python benchmarks/plan_speed.py --quick   # one run (the test suite's mode)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run")
    runs = 1 if ap.parse_args().quick else 5
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--profile", "all"], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    print(f"builder plan --profile all (4 cells): median {statistics.median(times) * 1000:.0f} ms, "
          f"max {max(times) * 1000:.0f} ms over {len(times)} runs (goal < 1000 ms)")


if __name__ == "__main__":
    main()
