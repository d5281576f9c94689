"""Smoke results: one Result per image × strategy × layer (L0 and L1 are per image), and their three forms —
JSON, JUnit XML (for CI test tabs) and a table for humans."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

LAYERS = ("L0", "L1", "JIT", "L2", "L3")
LAYER_NAMES = {
    "L0": "metadata",
    "L1": "imports, audit and serving modules inside the image",
    "JIT": "what the engine compiles at its first request, compiled inside the image without a GPU",
    "L2": "the engine's own argument parser",
    "L3": "GPU boot, one completion, speculative decoding",
}
PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Result:
    layer: str
    strategy: str | None  # None: the layer is about the whole image (L0, L1, JIT)
    status: str
    reason: str = ""
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)
    log: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_json(self) -> dict:
        return {"layer": self.layer, "strategy": self.strategy, "status": self.status, "reason": self.reason or None,
                "seconds": round(self.seconds, 2), "figures": self.figures, "log": self.log}


@dataclass
class SmokeReport:
    subject: str  # the image, or "process:<python>"
    cell: str
    launcher: str
    strategies: tuple[str, ...]
    results: list[Result] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    digest: str = ""  # the image read (NAME@sha256:..., or its ID): what ran, whatever its tag names now
    image_id: str = ""  # the ID of the image that ran

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results)

    def get(self, layer: str, strategy: str | None) -> Result | None:
        return next((r for r in self.results if r.layer == layer and r.strategy == strategy), None)

    def add(self, result: Result) -> Result:
        self.results.append(result)
        return result

    def summary(self) -> str:
        """One line: what passed, what failed, what was skipped (the build's step reason)."""
        counts = {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}
        first = next((r for r in self.results if r.failed), None)
        text = f"layers: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"
        if first:
            text += f"; {first.layer}{' ' + first.strategy if first.strategy else ''}: {first.reason.splitlines()[0]}"
        else:
            skipped = sorted({f"{r.layer}: {r.reason.splitlines()[0]}" for r in self.results if r.status == SKIP})
            if skipped:
                text += "; " + "; ".join(skipped[:3])
        return text

    def to_json(self) -> dict:
        return {
            "subject": self.subject,
            **({"digest": self.digest, "image_id": self.image_id} if self.digest or self.image_id else {}),
            "cell": self.cell,
            "launcher": self.launcher,
            "strategies": list(self.strategies),
            "result": "ok" if self.ok else "failed",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round(self.seconds, 1),
            "results": [r.to_json() for r in self.results],
        }


def junit_xml(reports: list[SmokeReport]) -> str:
    suites = ET.Element("testsuites", name="builder smoke")
    for rep in reports:
        suite = ET.SubElement(suites, "testsuite", name=f"smoke {rep.cell}", timestamp=time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.gmtime(rep.started)), hostname=rep.launcher)
        fails = skips = 0
        for r in rep.results:
            case = ET.SubElement(suite, "testcase", classname=f"smoke.{rep.cell}",
                                 name=f"{r.layer} {r.strategy or 'image'}: {LAYER_NAMES[r.layer]}",
                                 time=f"{r.seconds:.2f}")
            if r.status == FAIL:
                fails += 1
                ET.SubElement(case, "failure", message=r.reason.splitlines()[0] if r.reason else "failed").text = r.reason
            elif r.status == SKIP:
                skips += 1
                ET.SubElement(case, "skipped", message=r.reason)
            out = [f"subject: {rep.subject}"]
            if r.figures:
                out.append("figures: " + json.dumps(r.figures, sort_keys=True))
            if r.log:
                out.append(f"log: {r.log}")
            ET.SubElement(case, "system-out").text = "\n".join(out)
        suite.set("tests", str(len(rep.results)))
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))
        suite.set("errors", "0")
        suite.set("time", f"{rep.seconds:.2f}")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _cell(r: Result | None) -> str:
    if r is None:
        return "-"
    return {PASS: "pass", FAIL: "FAIL", SKIP: "skip"}[r.status]


def _figures(r: Result | None) -> str:
    if r is None or not r.figures:
        return ""
    f = r.figures
    parts = []
    for key, fmt in (("boot_s", "boot {:.0f}s"), ("ttft_s", "ttft {:.2f}s"), ("latency_s", "latency {:.2f}s"),
                     ("output_tokens_per_s", "{:.1f} tok/s"), ("drafts", "drafts {}"), ("draft_tokens", "draft tokens {}"),
                     ("accepted_tokens", "accepted {}"), ("accept_length", "accept length {}")):
        if f.get(key) is not None:
            parts.append(fmt.format(f[key]))
    return ", ".join(parts)


def table(reports: list[SmokeReport]) -> str:
    rows = [("image / cell", "strategy", *LAYERS, "L3 figures")]
    for rep in reports:
        for s in rep.strategies or ("-",):
            rows.append((rep.cell, s, _cell(rep.get("L0", None)), _cell(rep.get("L1", None)),
                         _cell(rep.get("JIT", None)), _cell(rep.get("L2", s)), _cell(rep.get("L3", s)), _figures(rep.get("L3", s))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip() for row in rows]
    for rep in reports:
        notes = [r for r in rep.results if r.status != PASS]
        if notes:
            lines.append(f"{rep.cell} ({rep.subject}, {rep.launcher}):")
        for r in notes:
            first, *rest = (r.reason or "").splitlines() or [""]
            lines.append(f"  {r.layer} {r.strategy or 'image':<8} {r.status:<4}  {first}")
            lines += [f"      {line}" for line in rest[:12]]
            if r.log and r.failed:
                lines.append(f"      engine log: {r.log}")
    return "\n".join(lines)


def write(reports: list[SmokeReport], out_dir: Path) -> tuple[Path, Path]:
    """smoke.json and smoke.xml (JUnit) under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / "smoke.json"
    js.write_text(json.dumps([r.to_json() for r in reports], indent=2) + "\n")
    xml = out_dir / "smoke.xml"
    xml.write_text(junit_xml(reports))
    return js, xml
