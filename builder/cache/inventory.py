"""`builder wheels`: what the local wheelhouse holds, whether every entry is still what was audited, and
pruning what no cell needs any more."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import archs as archs_mod
from ..audit import audit
from . import CacheHit, manifest_problem, verify_files
from .local import PACKAGE_NAME, QUARANTINE, QUARANTINED_NAME, TEMP_NAME, Wheelhouse
from .tiered import PULLS


@dataclass(frozen=True)
class Entry:
    package: str
    key: str
    path: Path
    manifest: dict  # {} when unreadable

    @property
    def version(self) -> str:
        return str(self.manifest.get("version", "?"))

    @property
    def archs(self) -> list[int]:
        audited = (self.manifest.get("audit") or {}).get("archs") if isinstance(self.manifest.get("audit"), dict) else None
        return [a for a in audited if isinstance(a, int)] if isinstance(audited, list) else []

    @property
    def bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())

    @property
    def built_at(self) -> str:
        by = self.manifest.get("built_by")
        return str(by.get("at", "?")) if isinstance(by, dict) else "?"

    def to_json(self) -> dict:
        return {"package": self.package, "key": self.key, "version": self.version, "archs": self.archs,
                "bytes": self.bytes, "where": str(self.path), "built_at": self.built_at}


def entries(wh: Wheelhouse) -> list[Entry]:
    out = []
    for package, key in wh.entries():
        meta = wh.read_manifest(package, key)
        out.append(Entry(package, key, wh.entry_dir(package, key), meta if isinstance(meta, dict) else {}))
    return out


def verify(wh: Wheelhouse, entry: Entry) -> str:
    """Why an entry must not be used ("" when its files match their hashes and they pass the audit again)."""
    meta = entry.manifest
    if "__unreadable__" in meta or not meta:
        return meta.get("__unreadable__", "no manifest (an interrupted store?)")
    foreign = wh.not_own(entry.package, entry.key, meta)
    if foreign:
        return foreign
    problem = manifest_problem(meta, tuple(entry.archs) or (0,))
    if problem:
        return problem
    files = [entry.path / n for n in meta["wheels"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        return f"{missing[0]} is missing"
    problem = verify_files(files, meta)
    if problem:
        return problem
    scopes = [archs_mod.ArchScope.from_json(s) for s in meta.get("arch_scoped") or ()
              if isinstance(s, dict) and {"files", "archs", "why"} <= set(s)]
    report = audit(entry.path, entry.archs, scopes)
    if not report.ok:
        bad = report.failures[0]
        return f"the audit fails now: {bad.path}: " + (bad.error or "missing " + ", ".join(map(archs_mod.sm, bad.missing)))
    if meta.get("compiled", True) and not report.has_device_code:
        return "no binary carries device code"
    return ""


def quarantine(wh: Wheelhouse, entry: Entry, why: str) -> str:
    """Move an entry aside ("" when it is not provably builder's own: then it stays where it is)."""
    return wh.discard(CacheHit(wh.name, entry.package, entry.key, str(entry.path), ()), why)


def prunable(wh: Wheelhouse, used_keys: set[str] | None, older_than_days: float | None) -> list[tuple[Entry, str]]:
    """Entries to remove and why: keys no selected cell uses, entries older than the limit. Only builder's
    own entries (wh.not_own): a directory that is not provably one is never a candidate."""
    now = time.time()
    out = []
    for e in entries(wh):
        if wh.not_own(e.package, e.key, e.manifest or None):
            continue
        if used_keys is not None and e.key not in used_keys:
            out.append((e, "no selected cell uses this key"))
        elif older_than_days is not None and now - e.path.stat().st_mtime > older_than_days * 86400:
            out.append((e, f"older than {older_than_days:g} days"))
    return out


def leftovers(wh: Wheelhouse, stale_after_s: float = 3600) -> list[Path]:
    """Quarantined entries, and temporary directories of stores and pulls that died (older than an hour: a
    younger one may belong to a build storing right now)."""
    def real_dir(p: Path) -> bool:
        return p.is_dir() and not p.is_symlink()

    out = []
    quarantined = wh.root / QUARANTINE
    if real_dir(quarantined):  # only what discard() put there: <package>/<key>-<time>-<pid>/ with its QUARANTINED note
        for pkg in sorted(quarantined.iterdir()):
            if PACKAGE_NAME.fullmatch(pkg.name) and real_dir(pkg):
                out += sorted(p for p in pkg.iterdir() if QUARANTINED_NAME.fullmatch(p.name) and real_dir(p)
                              and (p / "QUARANTINED").is_file() and not (p / "QUARANTINED").is_symlink())
    if real_dir(wh.root):
        now = time.time()
        pulls = wh.root / PULLS  # downloads from a remote store that a killed build left: <package>-<key12>-<random>
        if real_dir(pulls):
            out += sorted(p for p in pulls.iterdir() if PULL_NAME.fullmatch(p.name) and real_dir(p)
                          and now - p.stat().st_mtime > stale_after_s)
        for pkg in sorted(wh.root.iterdir()):
            if PACKAGE_NAME.fullmatch(pkg.name) and real_dir(pkg):
                out += sorted(p for p in pkg.iterdir() if TEMP_NAME.fullmatch(p.name) and real_dir(p)
                              and now - p.stat().st_mtime > stale_after_s)
    return out


PULL_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?-[0-9a-f]{12}-[a-z0-9_]{8}")  # tiered.fetch's mkdtemp


def remove(path: Path) -> None:
    shutil.rmtree(path)
