"""Bench results: one row per image digest × strategy × workload, as a table, JSON, CSV and a PNG; and
`bench diff`, which flags a regression only beyond the noise of repeated runs."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path

from ... import files, schema
from ...errors import UserError
from . import data

COLUMNS = [  # (key, header, format)
    ("strategy", "strategy", "{}"), ("workload", "workload", "{}"), ("repeats", "n", "{}"),
    ("request_throughput", "req/s", "{:.2f}"), ("request_throughput:range", "req/s min-max", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:.0f}"),
    ("ttft_ms_p50", "TTFT p50", "{:.0f}"), ("ttft_ms_p90", "p90", "{:.0f}"), ("ttft_ms_p99", "p99", "{:.0f}"),
    ("ttft_ms_p99:range", "p99 min-max", "{:.0f}"),
    ("itl_ms_p50", "ITL p50", "{:.1f}"), ("itl_ms_p99", "p99", "{:.1f}"),
    ("tpot_ms_p50", "TPOT p50", "{:.1f}"), ("tpot_ms_p99", "p99", "{:.1f}"),
    ("e2el_ms_p50", "E2E p50", "{:.0f}"), ("e2el_ms_p99", "p99", "{:.0f}"),
    ("e2el_ms_p99:range", "p99 min-max", "{:.0f}"),
    ("request_goodput", "goodput", "{:.2f}"), ("slo_ttft_p99_met", "P99<SLO", "{}"),
    ("spec_acceptance_length", "acc len", "{:.3f}"),
    ("spec_acceptance_rate", "acc rate", "{:.4f}"), ("lossless_match_rate", "lossless", "{:.2f}"),
    ("peak_gpu_memory_mib", "GPU MiB", "{}"), ("boot_s", "boot s", "{:.0f}"), ("first_request_ttft_s", "1st TTFT s", "{:.3f}"),
]
SPREAD_KEYS = ["request_throughput", "output_throughput", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "tpot_ms_p50",
               "e2el_ms_p50", "e2el_ms_p99"]  # the figures whose spread over the repeats a table and CSV show
CSV_KEYS = ["digest", "engine", "engine_version", "gpu", "driver", "cuda", "strategy", "workload", "repeats",
            "request_throughput", "output_throughput", "request_goodput",
            *[f"{m}_ms_p{p}" for m in ("ttft", "itl", "tpot", "e2el") for p in (50, 90, 99)],
            "spec_drafts", "spec_draft_tokens", "spec_accepted", "spec_acceptance_length", "spec_acceptance_rate",
            "lossless_match_rate", "lossless", "slo_ttft_p99_met", "peak_gpu_memory_mib", "boot_s",
            "first_request_ttft_s", "comparable",
            *[f"{k}_{end}" for k in SPREAD_KEYS for end in ("min", "max", "stdev")], "argv"]
NOT_COMPARABLE = "not comparable"  # a row of fewer repeats than `bench diff` needs (data: [diff] min_repeats)


def min_repeats() -> int:
    return int(data()["diff"]["min_repeats"])


def spread_of(row: dict, key: str) -> dict:
    """min, max and the sample standard deviation of one figure over the row's measured repeats."""
    vals = [r[key] for r in row.get("runs", []) if isinstance(r.get(key), (int, float))]
    if not vals:
        return {}
    return {"min": min(vals), "max": max(vals), "stdev": round(statistics.stdev(vals), 4) if len(vals) > 1 else 0.0}


def comparable_row(row: dict) -> bool:
    return len(row.get("runs", [])) >= min_repeats()


def _fmt(fmt: str, v) -> str:
    if v is None:
        return "-"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _cell(row: dict, key: str, fmt: str) -> str:
    """A table cell: the figure, or for KEY:range the min-max of its repeats; n gets a * when not comparable."""
    if key.endswith(":range"):
        s = spread_of(row, key.split(":")[0])
        return f"{_fmt(fmt, s['min'])}-{_fmt(fmt, s['max'])}" if s else "-"
    if key == "repeats" and row.get("repeats") is not None and not comparable_row(row):
        return f"{row['repeats']}*"
    return _fmt(fmt, row.get(key))


def table(doc: dict) -> str:
    env = doc["environment"]
    head = (f"{env.get('subject')}  digest {env.get('digest')}\n{env.get('engine')} {env.get('engine_version')}, "
            f"GPU {env.get('gpu')}, driver {env.get('driver')}, CUDA {env.get('cuda')}; client {doc.get('client')}; "
            f"SLO TTFT < {doc.get('slo', {}).get('ttft_ms')} ms")
    rows = [[h for _, h, _ in COLUMNS]] + [[_cell(r, k, f) for k, _, f in COLUMNS] for r in doc["rows"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [head] + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    for r in doc["rows"]:
        if not comparable_row(r):
            lines.append(f"{r['strategy']}: {NOT_COMPARABLE}: n = {len(r.get('runs', []))} measured run(s); a figure to "
                         f"compare needs at least {min_repeats()} (--repeats)")
        if str(r.get("lossless", "")).startswith("FLAGGED"):
            lines.append(f"{r['strategy']}: {r['lossless']}")
        if r.get("spec_cross_check"):
            lines.append(f"{r['strategy']}: spec-decode counters vs the client's figure: {r['spec_cross_check']}")
    for f in doc.get("failures", []):
        lines.append(f"{f['strategy']}: FAILED {f['why']}")
    return "\n".join(lines)


def to_csv(doc: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_KEYS, extrasaction="ignore")
    w.writeheader()
    env = doc["environment"]
    for r in doc["rows"]:
        spreads = {f"{k}_{end}": v for k in SPREAD_KEYS for end, v in spread_of(r, k).items()}
        w.writerow({**{k: env.get(k) for k in ("digest", "engine", "engine_version", "gpu", "driver", "cuda")},
                    **r, **spreads, "comparable": comparable_row(r), "argv": " ".join(r.get("argv", []))})
    return buf.getvalue()


def _pyplot():
    """matplotlib.pyplot drawing with matplotlib's own fonts only (DejaVu Sans): the PNG looks the same on every
    host, and the first import on a fresh host scans no system fonts (no `fc-list`, no font files read). That
    shorter font list is kept in builder's own cache directory, so the user's matplotlib cache (and their
    matplotlibrc) are left as they are. A matplotlib the process imported already is used as it is."""
    import os
    import sys

    if "matplotlib" in sys.modules:
        import matplotlib.pyplot as plt

        return plt
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "builder" / "matplotlib"
    saved = {k: os.environ.get(k) for k in ("MPLCONFIGDIR", "MPL_IGNORE_SYSTEM_FONTS")}
    os.environ.update(MPLCONFIGDIR=str(cache), MPL_IGNORE_SYSTEM_FONTS="1")  # read once, at the import
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return plt


def plot(docs: list[dict], dest: Path) -> Path:
    """Latency against throughput per strategy (each repeat a point), and P99 TTFT / ITL per strategy."""
    try:
        plt = _pyplot()
    except ImportError:
        raise UserError("the PNG needs matplotlib: pip install 'builder[bench]' (or `builder bench plot RESULT.json` "
                        "where it is installed)") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    labels, ttft, itl = [], [], []
    for doc in docs:
        who = f"{doc['environment'].get('engine')} {doc['environment'].get('engine_version')}"
        for r in doc["rows"]:
            pts = [(x.get("output_throughput"), x.get("e2el_ms_p99")) for x in r.get("runs", [])]
            pts = [(a, b) for a, b in pts if a is not None and b is not None]
            if pts:
                ax1.scatter([a for a, _ in pts], [b / 1000 for _, b in pts], label=f"{who} {r['strategy']}", s=40)
            labels.append(f"{who}\n{r['strategy']}")
            ttft.append(r.get("ttft_ms_p99") or 0)
            itl.append(r.get("itl_ms_p99") or 0)
    ax1.set_xlabel("output tokens/s")
    ax1.set_ylabel("E2E latency p99 (s)")
    ax1.set_title("latency against throughput (each point one run)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    xs = range(len(labels))
    ax2.bar([x - 0.2 for x in xs], ttft, width=0.4, label="TTFT p99 (ms)")
    ax2.bar([x + 0.2 for x in xs], itl, width=0.4, label="ITL p99 (ms)")
    ax2.set_xticks(list(xs), labels, fontsize=8)
    ax2.set_title("P99 TTFT and ITL per strategy")
    slo = (docs[0].get("slo") or {}).get("ttft_ms") if docs else None
    if slo:
        ax2.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"TTFT SLO {slo:g} ms")
    ax2.legend(fontsize=8)
    fig.suptitle(", ".join(sorted({f"GPU {d['environment'].get('gpu')}, workload {d['rows'][0]['workload']}"
                                    for d in docs if d["rows"]})), fontsize=10)
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def write(doc: dict, out_dir: Path, png: bool = True) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "csv": out_dir / "bench.csv", "table": out_dir / "bench.txt"}
    paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
    paths["csv"].write_text(to_csv(doc))
    paths["table"].write_text(table(doc) + "\n")
    if png:
        try:
            paths["png"] = plot([doc], out_dir / "bench.png")
        except UserError as exc:
            paths["png_missing"] = Path(str(exc))
    return paths


def load(path: str) -> dict:
    """A bench.json checked by its shape (schema.BENCH_RESULT): the file and the field named when it is not one."""
    doc = files.load_json(Path(path), "bench result")
    schema.check(f"{path}: not a bench result", doc, schema.BENCH_RESULT)
    return doc


def _workload(doc: dict) -> dict:
    """The workload's definition, without where its prompts were written."""
    return {k: v for k, v in (doc.get("workload") or {}).items() if k != "dataset"}


def comparable(old: dict, new: dict) -> list[str]:
    """Why two results do not compare: another engine, GPU, workload, load generator or SLO (a figure of one says
    nothing about the other's). Engine versions and image digests may differ: that is what diff is for."""
    out = []
    for key, what in (("engine", "engine"), ("gpu", "GPU")):
        a, b = old["environment"].get(key), new["environment"].get(key)
        if a != b:
            out.append(f"the results are of another {what} ({a} against {b})")
    if _workload(old) != _workload(new):
        changed = sorted(k for k in set(_workload(old)) | set(_workload(new)) if _workload(old).get(k) != _workload(new).get(k))
        out.append(f"the results are of another workload ({', '.join(changed)} differ)")
    if old.get("client") != new.get("client"):
        out.append(f"the results come from another load generator ({old.get('client')} against {new.get('client')})")
    states = lambda res: {(r["strategy"], r["workload"]): r.get("boot_state") for r in res.get("rows", [])}  # noqa: E731
    old_states, new_states = states(old), states(new)
    for k in sorted(old_states.keys() & new_states.keys()):
        if old_states[k] != new_states[k]:  # a warm boot's figures say nothing of a cold one's
            out.append(f"{k[0]} / {k[1]}: booted {old_states[k] or 'unrecorded'} against {new_states[k] or 'unrecorded'}: "
                       "rows of different boot states (cold / warm / restored) do not compare")
    slo_a, slo_b = (old.get("slo") or {}).get("ttft_ms"), (new.get("slo") or {}).get("ttft_ms")
    if slo_a != slo_b:
        out.append(f"the results have another SLO (TTFT {slo_a} against {slo_b} ms): goodput does not compare")
    return out


def diff(old: dict, new: dict, min_change: float | None = None) -> tuple[list[dict], list[str]]:
    """(one entry per figure of each strategy × workload both runs have, problems). A figure regresses when every
    repeat of the new run is worse than every repeat of the old one (the ranges do not overlap: beyond the noise)
    and the medians differ by more than min_change."""
    cfg = data()["diff"]
    min_change = cfg["min_change"] if min_change is None else min_change
    if not (isinstance(min_change, (int, float)) and math.isfinite(min_change) and min_change >= 0):
        return [], [f"--min-change: {min_change!r} is not a relative change of at least 0"]
    problems = comparable(old, new)
    if problems:
        return [], problems
    lower, higher = set(cfg["lower_is_better"]), set(cfg["higher_is_better"])
    key = lambda r: (r["strategy"], r["workload"])
    old_rows = {key(r): r for r in old["rows"]}
    out = []
    for r in new["rows"]:
        o = old_rows.get(key(r))
        if o is None:
            continue
        for which, row in (("old", o), ("new", r)):
            if len(row.get("runs", [])) < cfg["min_repeats"]:
                problems.append(f"{r['strategy']} / {r['workload']}: the {which} result has {len(row.get('runs', []))} "
                                f"repeat(s); judging a regression needs at least {cfg['min_repeats']} (--repeats)")
        if problems:
            continue
        for fig in sorted(lower | higher):
            a = [x[fig] for x in o["runs"] if isinstance(x.get(fig), (int, float))]
            b = [x[fig] for x in r["runs"] if isinstance(x.get(fig), (int, float))]
            if not a or not b:
                continue
            ma, mb = statistics.median(a), statistics.median(b)
            if ma == 0 and mb != 0:  # no relative change from nothing: "no regression" would be a guess
                problems.append(f"{r['strategy']} / {r['workload']}: the old median of {fig} is 0; a relative change "
                                "from it is undefined")
                continue
            change = (mb - ma) / ma if ma else 0.0
            worse = change > 0 if fig in lower else change < 0
            separated = min(b) > max(a) if fig in lower else max(b) < min(a)
            spread = max((max(a) - min(a)) / ma if ma else 0.0, (max(b) - min(b)) / mb if mb else 0.0)
            out.append({"strategy": r["strategy"], "workload": r["workload"], "figure": fig, "old": ma, "new": mb,
                        "change": round(change, 4), "spread": round(spread, 4),
                        "regression": bool(worse and separated and abs(change) > min_change)})
    if not out and not problems:
        problems.append("the two results share no strategy × workload")
    return out, problems


def diff_table(entries: list[dict]) -> str:
    lines = [f"{'strategy':<8} {'workload':<10} {'figure':<20} {'old':>10} {'new':>10} {'change':>8} {'spread':>7}"]
    for e in entries:
        mark = "  REGRESSION" if e["regression"] else ""
        lines.append(f"{e['strategy']:<8} {e['workload']:<10} {e['figure']:<20} {e['old']:>10.2f} {e['new']:>10.2f} "
                     f"{e['change']:>+8.1%} {e['spread']:>7.1%}{mark}")
    return "\n".join(lines)
