"""`builder wheels push` / `builder wheels pull`: move entries between the local wheelhouse and the remote
stores, by cell selection or by key, verifying every file on the way."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import CacheCorrupt, verify_files
from .local import PACKAGE_NAME
from .tiered import TieredCache
from ..errors import UserError


@dataclass(frozen=True)
class Target:
    package: str
    key: str
    archs: tuple[int, ...]
    version: str = "?"

    @property
    def label(self) -> str:
        return f"{self.package}=={self.version} (key {self.key[:16]})"


def from_plans(plans) -> list[Target]:
    seen, out = set(), []
    for p in plans:
        for w in p.wheels:
            if (w.package.name, w.key) not in seen:
                seen.add((w.package.name, w.key))
                out.append(Target(w.package.name, w.key, tuple(w.package.cache_archs), w.package.version))
    return out


def from_keys(specs: tuple[str, ...], cache: TieredCache, known: list[Target]) -> list[Target]:
    """`KEY`, a prefix of 8+ hex characters, or `PACKAGE:KEY`, matched against the local wheelhouse's entries
    and the keys of every cell of the matrix."""
    local = [Target(p, k, (), str((cache.local.read_manifest(p, k) or {}).get("version", "?"))) for p, k in cache.local.entries()]
    out = []
    for spec in specs:
        package, _, key = spec.rpartition(":")
        if len(key) < 8 or len(key) > 64 or any(c not in "0123456789abcdef" for c in key):
            raise UserError(f"--key {spec!r}: give a cache key (at least its first 8 hex characters), optionally as PACKAGE:KEY")
        if package and not PACKAGE_NAME.fullmatch(package):  # `../../x:KEY` would name a path, not a package
            raise UserError(f"--key {spec!r}: {package!r} is not a package name (lowercase letters, digits, '.', '_', '-')")
        found = {(t.package, t.key): t for t in known + local
                 if t.key.startswith(key) and (not package or t.package == package)}
        if not found:
            if package and len(key) == 64:
                out.append(Target(package, key, ()))
                continue
            raise UserError(f"--key {spec!r}: no entry of the wheelhouse and no cell of the matrix has that key "
                            "(give PACKAGE:FULL-KEY for a key only a remote knows)")
        if len(found) > 1:
            raise UserError(f"--key {spec!r} matches {len(found)} entries: give more of the key")
        out.extend(found.values())
    return out


def push(cache: TieredCache, targets: list[Target], force: bool, say: Callable[[str], None]) -> tuple[int, int]:
    """Push each target's local entry to every remote that takes pushes. Returns (pushed, failed)."""
    pushed = failed = 0
    for t in targets:
        hit = cache.local.lookup(t.package, t.key, t.archs)
        if hit is None:
            say(f"skip   {t.label}: not in the wheelhouse")
            continue
        why = hit.problem or verify_files([Path(hit.location) / n for n in hit.wheels], hit.manifest)
        if why:
            say(f"BAD    {t.label}: {why} (not pushed; `builder wheels verify --quarantine` moves it aside)")
            failed += 1
            continue
        files = [Path(hit.location) / n for n in hit.wheels]
        done = {}
        for r in cache.remotes:
            if not r.push_enabled:
                continue
            there = None if force else r.lookup(t.package, t.key, t.archs)
            if there is not None and there.usable:
                say(f"ok     {t.label}: already in {r.label} ({there.location})")
                continue
            remote_hit = r.store(t.package, t.key, files, hit.manifest)
            done[r.name] = {"label": r.label, "location": remote_hit.location,
                            **({"digest": remote_hit.manifest["registry"]["digest"]} if "registry" in remote_hit.manifest else {})}
            say(f"pushed {t.label} to {remote_hit.location}")
            pushed += 1
        if done:
            cache.local.annotate(t.package, t.key, {"remotes": {**hit.manifest.get("remotes", {}), **done}})
    return pushed, failed


def pull(cache: TieredCache, targets: list[Target], say: Callable[[str], None]) -> tuple[int, int, int]:
    """Bring each target into the wheelhouse from the first remote that has a good copy.
    Returns (pulled, missing, bad)."""
    pulled = missing = bad = 0
    scratch = Path(tempfile.mkdtemp(prefix="builder-pull-"))
    try:
        for t in targets:
            local = cache.local.lookup(t.package, t.key, t.archs)
            if local is not None and local.usable:
                say(f"ok     {t.label}: already in the wheelhouse")
                continue
            hit = cache.lookup(t.package, t.key, t.archs)
            if hit is None or not hit.remote:
                say(f"miss   {t.label}: in no remote store")
                missing += 1
                continue
            if not hit.usable:
                say(f"BAD    {t.label}: {hit.location}: {hit.problem}; {cache.discard(hit, hit.problem)}")
                bad += 1
                continue
            try:
                cache.fetch(hit, scratch / t.key)
            except CacheCorrupt as exc:
                say(f"BAD    {t.label}: {exc}; {cache.discard(hit, str(exc))}")
                bad += 1
                continue
            say(f"pulled {t.label} from {hit.location}")
            pulled += 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return pulled, missing, bad
