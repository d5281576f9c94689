"""report: the closing table of a build and its --json form, from the runner's per-step results."""

from __future__ import annotations

from .compile_cache import describe
from .progress import duration
from .runner import CellOutcome
from .steps import Status


def outcome_json(o: CellOutcome) -> dict:
    digest = o.artifact("image", "digest")
    return {
        "cell": o.cell.id,
        "builder": o.builder,  # with --builder A,B,...: where it was built; else null
        "result": "ok" if o.ok else "failed",
        "seconds": round(o.seconds, 1),
        "image": o.cell.ref if o.artifact("image", "image") else None,
        "digest": digest or None,
        "built": o.packages(reused=False),
        "reused": o.packages(reused=True),
        "error": o.error or None,
        "log": str(o.log) if o.log else None,
        "steps": [r.to_json() for r in o.results],
        "smoke": smoke_json(o),
    }


def _smoke_result(o: CellOutcome):
    return next((r for r in o.results if r.step == "smoke"), None)


def smoke_json(o: CellOutcome) -> dict | None:
    """The smoke step's status and reason (skipped with --no-smoke says so), or None when it did not exist."""
    r = _smoke_result(o)
    return None if r is None else {"status": r.status.value, "reason": r.reason or None,
                                   "report": r.artifacts.get("report")}


def smoke_cell(o: CellOutcome) -> str:
    """The smoke column: ok, FAILED, or skipped with its reason's first words."""
    r = _smoke_result(o)
    if r is None:
        return "-"
    if r.status is Status.SKIPPED:
        why = (r.reason or "").removeprefix("skipped: ").removeprefix("not run: ").split(" (")[0]
        return f"skipped: {why}"
    return "ok" if r.status is Status.OK else "FAILED"


def compile_times(o: CellOutcome) -> str:
    """Each compile's actual time next to the estimate plan made from earlier builds."""
    out = []
    for r in o.results:
        c = r.artifacts.get("compile") if r.step == "compile" else None
        if isinstance(c, dict):
            est = f"est {duration(c['estimate_s'])}" if c.get("estimate_s") is not None else "no estimate"
            cached = describe(c.get("sccache"))
            out.append(f"{r.subject} {duration(c['seconds'])} ({est}{'; ' + cached if cached else ''})")
    return ", ".join(out)


def format_table(outcomes: list[CellOutcome], planned: int) -> str:
    fanned = any(o.builder for o in outcomes)  # --builder A,B,...: a builder column
    rows = [("cell",) + (("builder",) if fanned else ()) + ("result", "time", "image", "digest", "wheels built",
                                                              "wheels reused", "compile time (estimate)", "smoke")]
    for o in outcomes:
        digest = o.artifact("image", "digest")
        rows.append((
            o.cell.id,
            *((o.builder or "-",) if fanned else ()),
            "ok" if o.ok else "FAILED",
            f"{o.seconds:.0f}s",
            o.cell.ref if o.artifact("image", "image") else "(not tagged)",
            (digest[:19] + "…") if digest else "-",
            ", ".join(o.packages(reused=False)) or "-",
            ", ".join(o.packages(reused=True)) or "-",
            compile_times(o) or "-",
            smoke_cell(o),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip() for row in rows]
    for o in outcomes:  # what each source = "auto" package took and why (decided after the download and audit)
        for r in o.results:
            if r.step == "route" and r.status is Status.OK:
                lines.append(f"{o.cell.id}: {r.subject} auto → {r.reason}")
    for o in outcomes:
        smoke = _smoke_result(o)
        if o.ok and smoke is not None and smoke.status is not Status.FAILED and smoke.reason:
            lines.append(f"{o.cell.id}: smoke {smoke.status.value}: {smoke.reason.splitlines()[0].removeprefix('skipped: ')}")
        if o.ok:
            continue
        lines.append(f"{o.cell.id}: {o.error} (log: {o.log})")
        for r in o.results:
            if r.status is not Status.OK:
                lines.append(f"  {r.step:<8} {r.subject:<24} {r.status.value:<8} {r.reason.splitlines()[0] if r.reason else ''}")
    if len(outcomes) < planned:
        interrupted = any(o.interrupted for o in outcomes)
        why = "interrupted" if interrupted else ("stopped after a failed cell on its builder" if fanned else
                                                 "stopped after the first failed cell") + " (--keep-going goes on)"
        lines.append(f"{why}: {planned - len(outcomes)} more planned cell(s) not run")
    return "\n".join(lines)
