"""Redaction speed (builder/redact.py): seconds to redact 10 MB of each hostile shape, against the old expressions
(tests/redact_reference.py keeps them) on 40 KB. Goal: under 1 s per shape.

    .venv/bin/python benchmarks/redact.py           # 10 MB per shape; the old expressions on 40 KB (each capped)
    .venv/bin/python benchmarks/redact.py --quick   # 1 MB per shape; the old ones on 1 KB, capped at 2 s (the suite's mode)

Each shape is repeated to the size, then credentials follow (the rewrites must reach them). The old expressions
run in a child process, stopped at the cap: on 40 KB most of them take minutes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from builder import redact  # noqa: E402
from tests.unit.net.test_redact import SHAPES, TAIL  # noqa: E402

OLD = """
import resource, sys, time
sys.path.insert(0, {repo!r})
from tests.redact_reference import reference
text = {shape!r} * ({size} // len({shape!r})) + {tail!r}
resource.setrlimit(resource.RLIMIT_CPU, (int(time.process_time() + {cap}) + 1, resource.RLIM_INFINITY))
t0 = time.process_time()
reference(text)
print(time.process_time() - t0)
"""


def old_seconds(shape: str, size: int, cap: float) -> float | None:
    """CPU seconds the old expressions take on `size` characters of `shape`; None past `cap` (the child's CPU
    limit: it is killed there, its start-up not counted)."""
    res = subprocess.run([sys.executable, "-c", OLD.format(repo=str(REPO), shape=shape, size=size, tail=TAIL, cap=cap)],
                         capture_output=True, text=True, check=False)
    seconds = float(res.stdout.split()[-1]) if res.returncode == 0 else None
    return seconds if seconds is not None and seconds <= cap else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 MB per shape, the old expressions on 1 KB")
    ap.add_argument("--cap", type=float, default=60.0, help="seconds the old expressions may run per shape")
    args = ap.parse_args()
    size, old_size = (1 << 20, 1000) if args.quick else (10 << 20, 40000)
    cap = min(args.cap, 2.0) if args.quick else args.cap
    print(f"{'shape':16} {'redact ' + str(size >> 20) + ' MB':>14} {'old, ' + str(old_size // 1000) + ' KB':>14}")
    worst, old_worst = 0.0, 0.0
    for name, shape in SHAPES.items():
        text = shape * (size // len(shape)) + TAIL
        t0 = time.process_time()
        out = redact.redact(text)
        took = time.process_time() - t0
        assert "s3cr3t" not in out
        old = old_seconds(shape, old_size, cap)
        worst, old_worst = max(worst, took), max(old_worst, old if old is not None else cap)
        print(f"{name:16} {took:12.3f} s {old:12.3f} s" if old is not None else f"{name:16} {took:12.3f} s {'> ' + format(cap, 'g'):>12} s")
    print(f"redact {size >> 20} MB: slowest shape {worst:.3f} s CPU (goal < 1 s); the old expressions on "
          f"{old_size // 1000} KB: slowest {'> ' if old_worst >= cap else ''}{old_worst:.1f} s")


if __name__ == "__main__":
    main()
