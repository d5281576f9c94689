"""`builder verify-repro CELL`: build the cell twice from nothing — an empty wheelhouse each time and no
BuildKit layer cache — and compare what came out: every wheel's sha256 and the runtime image's digest. On a
mismatch it says what differs: the zip members of a wheel (contents, timestamps, order) and, per image layer,
the files added, removed or changed (builder/image/oci.py).

Both builds use the same SOURCE_DATE_EPOCH, sources, base images and runtime pins (the cell's
runtime-pins/<cell>.txt when there is one; otherwise the first build resolves them before it installs anything,
as any first build does, and the second installs exactly those), so any difference is one the build itself put
there.
"""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .image import oci
from .cache.local import Wheelhouse
from .plan import plan_cells
from .resolve import Cell
from .steps import BuildOptions

RUNS = ("first", "second")
STEP_NAMES = ("compile", "audit", "cache", "image")


@dataclass
class Run:
    name: str
    ok: bool
    error: str = ""
    digest: str = ""
    archive: Path | None = None
    wheels: dict[str, dict[str, str]] = field(default_factory=dict)  # package → {file: sha256}
    wheel_dirs: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0
    log: Path | None = None
    dockerfile: str = ""  # as rendered for this build


@dataclass
class Verdict:
    cell: str
    runs: list[Run]
    differences: list[str]

    @property
    def built(self) -> bool:
        return len(self.runs) == len(RUNS) and all(r.ok for r in self.runs)

    @property
    def reproducible(self) -> bool:
        return self.built and not self.differences

    def to_json(self) -> dict:
        return {
            "cell": self.cell,
            "reproducible": self.reproducible,
            "runs": [{"name": r.name, "ok": r.ok, "error": r.error or None, "digest": r.digest or None,
                      "wheels": r.wheels, "seconds": round(r.seconds, 1), "log": str(r.log) if r.log else None}
                     for r in self.runs],
            "differences": self.differences,
        }


def _zip_entries(path: Path) -> dict[str, tuple]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: (i.CRC, i.file_size, i.date_time, i.external_attr, i.compress_type) for i in zf.infolist()}


def wheel_differences(a: Path, b: Path, limit: int = 40) -> list[str]:
    """The zip members two builds of one wheel disagree on, and how."""
    ea, eb = _zip_entries(a), _zip_entries(b)
    out = []
    if list(ea) != list(eb) and set(ea) == set(eb):
        out.append("  members in a different order")
    for name in sorted(set(ea) | set(eb)):
        if name not in eb:
            out.append(f"  - {name} (only in the first build)")
        elif name not in ea:
            out.append(f"  + {name} (only in the second build)")
        elif ea[name] != eb[name]:
            what = [w for w, x, y in zip(("contents", "size", "timestamp", "mode", "compression"), ea[name], eb[name]) if x != y]
            shown = f" {ea[name][2]} → {eb[name][2]}" if "timestamp" in what else ""
            out.append(f"  ~ {name}: {', '.join(what)}{shown}")
    return out[:limit] + ([f"  … and {len(out) - limit} more"] if len(out) > limit else [])


def build_twice(cell: Cell, opts: BuildOptions, say: Callable[[str], None], host=None, steps=None) -> list[Run]:
    """The two compared builds (first, second). A cell without runtime pins has them resolved by the first build
    (before its install, as any first build does) and the second installs the pins the first recorded: both
    install exactly the same hash-locked files."""
    from . import runner

    steps = steps or tuple(s for s in runner.STEPS if s.name in STEP_NAMES)
    root = opts.work_dir / "verify-repro" / cell.id
    if root.exists():
        shutil.rmtree(root)
    pins_seed = opts.pins_dir / f"{cell.id}.txt" if opts.pins_dir else None
    if pins_seed is None or not pins_seed.is_file():
        say(f"[{cell.id}] verify-repro: no runtime pins yet; the first build resolves them and the second installs "
            "exactly those")
    runs: list[Run] = []
    for name in RUNS:
        base = root / name
        pins_dir = base / "pins"
        pins_dir.mkdir(parents=True)
        if pins_seed is not None and pins_seed.is_file():
            shutil.copy2(pins_seed, pins_dir / pins_seed.name)
        run_opts = dataclasses.replace(opts, work_dir=base / "work", log_dir=opts.log_dir / "verify-repro" / name,
                                       pins_dir=pins_dir, no_cache=True, keep_going=False, refresh_pins=False,
                                       publish=None, layer_cache=None)
        wheelhouse = Wheelhouse(base / "wheelhouse")  # empty: every wheel is compiled
        (plan,) = plan_cells([cell], wheelhouse)
        say(f"[{cell.id}] verify-repro: {name} build, no cache")
        (outcome,) = runner.run_cells([plan], wheelhouse, run_opts, say, host, steps)
        run = Run(name=name, ok=outcome.ok and bool(outcome.artifact("image", "digest")), error=outcome.error,
                  digest=outcome.artifact("image", "digest"), seconds=outcome.seconds, log=outcome.log)
        archive = outcome.artifact("image", "archive")
        rendered = run_opts.work_dir / cell.id / "Dockerfile"
        run.dockerfile = rendered.read_text() if rendered.is_file() else ""
        run.archive = Path(archive) if archive else None
        for r in outcome.results:
            if r.step == "compile" and r.passed:
                run.wheels[r.subject] = {w["file"]: w["sha256"] for w in r.artifacts.get("wheels", [])}
                run.wheel_dirs[r.subject] = run_opts.work_dir / cell.id / f"out-{r.subject}"
        if not run.ok:
            runs.append(run)
            break
        runs.append(run)
        if pins_seed is None or not pins_seed.is_file():
            pins_seed = pins_dir / f"{cell.id}.txt"  # what the first build resolved: the second installs it
    return runs


def compare(cell: Cell, runs: list[Run]) -> Verdict:
    if len(runs) < 2 or not all(r.ok for r in runs):
        return Verdict(cell.id, runs, [])
    first, second = runs
    lines: list[str] = []
    if first.dockerfile != second.dockerfile:  # a template or the lock changed while the two builds ran
        import difflib

        changed = [l for l in difflib.unified_diff(first.dockerfile.splitlines(), second.dockerfile.splitlines(),
                                                   "first/Dockerfile", "second/Dockerfile", lineterm="", n=0)]
        lines.append("the Dockerfile changed between the two builds (templates or matrix.lock edited meanwhile):")
        lines += ["  " + l for l in changed[:20]]
    for pkg in sorted(set(first.wheels) | set(second.wheels)):
        a, b = first.wheels.get(pkg, {}), second.wheels.get(pkg, {})
        if a == b:
            continue
        for f in sorted(set(a) | set(b)):
            if a.get(f) != b.get(f):
                lines.append(f"wheel {f}: sha256 {(a.get(f) or 'missing')[:16]} vs {(b.get(f) or 'missing')[:16]}")
                pa, pb = first.wheel_dirs[pkg] / f, second.wheel_dirs[pkg] / f
                if pa.is_file() and pb.is_file():
                    lines += wheel_differences(pa, pb)
    if first.digest != second.digest:
        lines.append(f"image: {first.digest} vs {second.digest}")
        if first.archive and second.archive:
            lines += ["  " + line for line in oci.diff(first.archive, second.archive)]
    return Verdict(cell.id, runs, lines)


def verify(cell: Cell, opts: BuildOptions, say: Callable[[str], None], host=None, steps=None) -> Verdict:
    return compare(cell, build_twice(cell, opts, say, host, steps))


def format_verdict(v: Verdict) -> str:
    lines = []
    for r in v.runs:
        wheels = ", ".join(f"{f} {h[:12]}" for files in r.wheels.values() for f, h in files.items())
        state = f"image {r.digest}" if r.ok else f"FAILED: {r.error}"
        lines.append(f"{r.name:<6} {r.seconds:5.0f}s  {state}" + (f"; wheels: {wheels}" if wheels else ""))
    if not v.built:
        lines.append(f"{v.cell}: could not build it twice (log: {v.runs[-1].log})")
    elif v.reproducible:
        lines.append(f"{v.cell}: REPRODUCIBLE — two builds from nothing gave {v.runs[0].digest}")
    else:
        lines.append(f"{v.cell}: NOT REPRODUCIBLE")
        lines += v.differences
    return "\n".join(lines)
