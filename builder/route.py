"""route: where a `source = "auto"` package's wheel comes from — the index's published wheel, when for the cell's
archs its audit passes and its torch, CUDA and Python match the cell; else a compile from its pinned source.

Two moments, one set of checks:
- `predict` (resolve, for `plan`): from what is known before any download — the wheel tags matrix.lock records,
  the torch and Requires-Python its metadata states (read by `builder lock`), and what the engine data recorded of
  that very file's device code and CUDA runtime (index_wheels, by sha256). A prediction, and plan says so.
- `decide` (build, before the cell's Dockerfile is rendered): the pinned file is downloaded (or taken from the
  wheel cache), audited for the cell's archs by builder/audit.py, and its own METADATA and DT_NEEDED read. A fact;
  the cell then runs the chosen route under that route's own cache key, and its labels say what was chosen and why.
"""

from __future__ import annotations

import dataclasses
import email.parser
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from . import archs as archs_mod

if TYPE_CHECKING:
    from .audit import AuditReport
    from .engines import Knowledge, Recipe
    # resolve.Package / resolve.Source are named in annotations only (strings, never evaluated): resolve imports
    # this module, and an import back would be a cycle

INDEX, BUILD = "index", "build"
OK, DIFFERS, UNKNOWN = "ok", "differs", "unknown"


@dataclass(frozen=True)
class Check:
    name: str  # "wheel" | "python" | "torch" | "cuda" | "archs"
    verdict: str  # OK | DIFFERS | UNKNOWN
    text: str

    def to_json(self) -> dict:
        return {"check": self.name, "verdict": self.verdict, "text": self.text}


@dataclass(frozen=True)
class Route:
    """The route of one `source = "auto"` package and why."""

    chosen: str  # INDEX | BUILD
    reason: str
    fact: bool  # True: decided by build (after the download and the audit); False: plan's prediction
    index: Source | None  # the published wheel this cell's runtime would install (None: no such wheel)
    build: Source  # the pinned source it compiles from
    checks: tuple[Check, ...] = ()

    @property
    def known(self) -> bool:
        """Every check was decided (a prediction with an unknown is settled by build's audit)."""
        return all(c.verdict != UNKNOWN for c in self.checks)

    @property
    def summary(self) -> str:
        """One line: `index: <reason>` / `build: <reason>`, as plan, build and the labels print it."""
        how = "decided" if self.fact else "predicted" if self.known else "predicted, the download decides"
        return f"{self.chosen} ({how}): {self.reason}"

    def to_json(self) -> dict:
        return {"asked": "auto", "chosen": self.chosen, "fact": self.fact, "known": self.known, "reason": self.reason,
                "index_wheel": self.index.ref if self.index else None, "build_source": self.build.ref,
                "checks": [c.to_json() for c in self.checks]}


def _choose(checks: list[Check], index: Source | None, build: Source, fact: bool) -> Route:
    differ = [c for c in checks if c.verdict == DIFFERS]
    if differ or index is None:
        return Route(BUILD, "; ".join(c.text for c in differ), fact, index, build, tuple(checks))
    unknown = [c for c in checks if c.verdict == UNKNOWN]
    oks = [c.text for c in checks if c.verdict == OK]
    reason = "; ".join(oks)
    if unknown:
        reason += ("; " if reason else "") + "unknown before the download: " + "; ".join(c.text for c in unknown)
    return Route(INDEX, reason, fact, index, build, tuple(checks))


def no_wheel(r: Recipe, why: str, build: Source) -> Route:
    """No published wheel can be taken (none on the index, none for this Python / OS / machine): compile. Known
    from the index's file list alone, so plan's prediction is already the fact."""
    return Route(BUILD, why, True, None, build, (Check("wheel", DIFFERS, why),))


# -- the checks ----------------------------------------------------------------------------------------------
def _python_check(requires_python: str | None, python: str, filename: str) -> Check:
    tags = parse_wheel_filename(filename)[3]
    abi = sorted({t.interpreter for t in tags})
    spelled = f"its tags ({', '.join(abi)}) install on Python {python}"
    if requires_python is None:
        return Check("python", OK, spelled)
    if not requires_python:
        return Check("python", OK, spelled + " (no Requires-Python)")
    try:
        fits = Version(python + ".0") in SpecifierSet(requires_python)
    except InvalidSpecifier:
        return Check("python", UNKNOWN, f"its Requires-Python {requires_python!r} cannot be read")
    if not fits:
        return Check("python", DIFFERS, f"it requires Python {requires_python}, the cell has Python {python}")
    return Check("python", OK, f"{spelled}, Requires-Python {requires_python}")


def _torch_check(pin: str | None, cell_torch: str, r: Recipe) -> Check:
    bound = "torch" in r.bound_to or "C++ against torch" in r.holds
    have = f"torch {cell_torch}" if cell_torch else "no torch"
    if pin is None:
        return Check("torch", UNKNOWN, "the torch its metadata pins is not recorded (run `builder lock`)")
    if pin:
        if cell_torch and Version(pin) == Version(cell_torch):
            return Check("torch", OK, f"it pins torch=={pin}, the cell's")
        return Check("torch", DIFFERS, f"it pins torch=={pin}, the cell has {have}")
    if bound:
        return Check("torch", DIFFERS, f"its metadata pins no exact torch, and its binaries are built against one "
                                       f"torch's C++ ABI (the cell has {have})")
    return Check("torch", OK, "it needs no torch")


def _cuda_check(majors: set[int] | None, cell_cuda: str, r: Recipe, where: str) -> Check:
    want = int(cell_cuda.split(".")[0])
    if majors is None:
        return Check("cuda", UNKNOWN, "the CUDA runtime its binaries need is not known before the download")
    if not majors:
        if r.compiled:
            return Check("cuda", DIFFERS, f"no binary {where}needs a CUDA runtime (libcudart.so.N), so its CUDA "
                                          f"cannot be matched to the cell's {cell_cuda}")
        return Check("cuda", OK, "no binary needs a CUDA runtime")
    spelled = ", ".join(f"libcudart.so.{m}" for m in sorted(majors))
    if majors != {want}:
        return Check("cuda", DIFFERS, f"its binaries {where}need {spelled}, the cell has CUDA {cell_cuda}")
    return Check("cuda", OK, f"its binaries {where}need {spelled}, the cell's CUDA {cell_cuda}")


def _archs_check(report: AuditReport | None, archs: tuple[int, ...], r: Recipe, what: str) -> Check:
    asked = ", ".join(map(archs_mod.sm, archs))
    if not r.compiled:
        return Check("archs", OK, "no device code expected")
    if report is None:
        return Check("archs", UNKNOWN, "the engine data has no record of this file's device code; build's audit decides")
    if report.errors:
        return Check("archs", DIFFERS, f"{what} cannot read it: {report.errors[0].error}")
    if not report.has_device_code:
        return Check("archs", DIFFERS, f"{what} finds no device code in it")
    if not report.ok:
        missing = "; ".join(f"{b.path.split('!', 1)[-1].rsplit('/', 1)[-1]} lacks "
                            f"{', '.join(map(archs_mod.sm, b.missing))}" for b in report.failures)
        return Check("archs", DIFFERS, f"{what} fails for {asked}: {missing}")
    jit: dict[str, list[str]] = {}
    for b in report.binaries:
        for res in b.results:
            if res.covered and res.how.startswith("PTX"):
                jit.setdefault(b.path.split("!", 1)[-1].rsplit("/", 1)[-1], []).append(archs_mod.sm(res.arch))
    note = (" (by PTX only, JIT-compiled by the driver at first load: "
            + ", ".join(f"{name} on {'/'.join(a)}" for name, a in jit.items()) + ")") if jit else ""
    n = sum(b.has_device_code for b in report.binaries)
    return Check("archs", OK, f"{what} passes for {asked}: {n} binaries with device code{note}")


# -- plan: the prediction -----------------------------------------------------------------------------------
def predict(kn: Knowledge, r: Recipe, wheel: dict, index: Source, build: Source, cell_torch: str, cuda: str,
            python: str, archs: tuple[int, ...]) -> Route:
    """What build will choose, from the lock (tags, metadata) and the engine data's record of the file."""
    from .audit import audit_recorded

    known = kn.index_wheel(wheel["sha256"])
    checks = [_python_check(wheel.get("requires_python"), python, wheel["filename"])]
    checks.append(_torch_check(wheel.get("torch"), cell_torch, r))
    if known is not None:
        majors = {int(x) for x in known["cuda"].split(",") if x}
        checks.append(_cuda_check(majors, cuda, r, ""))
        report = audit_recorded(wheel["filename"], known["binaries"], list(archs), r.arch_scoped)
        checks.append(_archs_check(report, archs, r, "the audit of its recorded device code (engine data)"))
    else:
        local = re.search(r"\+cu(\d{2,3})", wheel["filename"])  # a local version label like +cu130
        majors = {int(local.group(1)[:-1])} if local else None
        if local or r.compiled:
            checks.append(_cuda_check(majors, cuda, r, "(its version label) ") if local else
                          Check("cuda", UNKNOWN, "the CUDA runtime its binaries need is not known before the download"))
        checks.append(_archs_check(None, archs, r, ""))
    return _choose(checks, index, build, fact=False)


# -- build: the decision ------------------------------------------------------------------------------------
def download_cache() -> Path:
    """Where published wheels are kept by their sha256 between builds (as `builder lock` keeps sdists)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "builder" / "wheels"


def fetch_index_wheel(src: Source, note: Callable[[str], None]) -> Path:
    """The pinned published wheel: from the download cache when its bytes still have the pinned sha256, else
    downloaded (streamed and hashed; nothing is kept unless the sha256 is the pinned one)."""
    import requests

    from .net import with_timeouts
    from .download import fetch_pinned

    from .files import sha256_file

    path = download_cache() / src.sha256 / src.filename
    if path.is_file() and sha256_file(path) == src.sha256:
        note(f"{src.filename}: in the download cache {path.parent} (sha256 verified)")
        return path
    note(f"download {src.filename} from the index: {src.url} (sha256 {src.sha256[:16]}…)")
    with with_timeouts(requests.Session()) as session:
        return fetch_pinned(session, src.url, path, src.sha256)


def wheel_metadata(wheel: Path) -> tuple[str, str | None]:
    """(the torch its METADATA pins exactly, "" when none; its Requires-Python) read from the file itself."""
    from .pypi import Metadata

    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        text = zf.read(name).decode("utf-8", "replace") if name else ""
    msg = email.parser.Parser().parsestr(text)
    meta = Metadata(msg.get("Name", ""), msg.get("Version", ""), msg.get("Requires-Python"),
                    tuple(msg.get_all("Requires-Dist") or ()))
    return meta.pin("torch") or "", meta.requires_python or ""


def decide(pkg: Package, cell, wheel: Path) -> tuple[Route, AuditReport]:
    """The fact: the downloaded wheel audited for the cell's archs, its own METADATA and DT_NEEDED read."""
    from .audit import audit, cuda_majors, wheel_links

    route = pkg.route
    r = pkg.recipe
    report = audit(wheel, list(cell.archs), r.arch_scoped)
    torch, requires_python = wheel_metadata(wheel)
    majors = set(cuda_majors(wheel_links(wheel)))
    checks = [_python_check(requires_python, cell.python, route.index.filename),
              _torch_check(torch, cell.torch, r),
              _cuda_check(majors, cell.cuda, r, ""),
              _archs_check(report, cell.archs, r, "the audit of the downloaded wheel")]
    return _choose(checks, route.index, route.build, fact=True), report


def settle(pkg: Package, cell, cached: Callable[[Package], Path | None], note: Callable[[str], None]
           ) -> tuple[Package, AuditReport | None, Path | None]:
    """The package on the route build takes. Without a download where the prediction is already a fact (no wheel
    installs) or the file's own metadata as the index serves it rules the wheel out (torch, Python); else the
    wheel (from the wheel cache when `cached` has it, else the download cache or the index) is audited."""
    route = pkg.route
    if route.index is None:
        return _on(pkg, dataclasses.replace(route, fact=True)), None, None
    ruled_out = [c for c in route.checks if c.verdict == DIFFERS and c.name in ("python", "torch")]
    if ruled_out:
        facts = tuple(dataclasses.replace(c, text=c.text + " (its metadata, as the index serves it)") for c in ruled_out)
        return _on(pkg, Route(BUILD, "; ".join(c.text for c in facts), True, route.index, route.build, facts)), None, None
    index_pkg = dataclasses.replace(pkg, source=route.index)
    wheel = cached(index_pkg) or fetch_index_wheel(route.index, note)
    decided, report = decide(pkg, cell, wheel)
    return _on(pkg, decided), report, wheel


def _on(pkg: Package, route: Route) -> Package:
    return dataclasses.replace(pkg, source=route.index if route.chosen == INDEX else route.build, route=route)


def keep_download(wheel: Path, dest: Path) -> Path:
    """The cached wheel in a build's output directory (a hard link where the filesystem allows)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(wheel, dest)
    except OSError:
        shutil.copy2(wheel, dest)
    return dest

