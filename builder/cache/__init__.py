"""The wheel cache: one protocol, several stores. A compiled wheel is stored under its cache key (plan
computes it from everything that shaped the wheel) and never compiled again while the key is unchanged.

    lookup(package, key) -> CacheHit | None   is the wheel there? No download; plan calls this.
    fetch(hit, dest)     -> [wheel paths]     bring the wheels of a hit into dest.
    store(package, key, wheels, manifest)     keep audited wheels (the runner stores only what passed).

`local.Wheelhouse` (wheelhouse/ next to the matrix) is the first store; remote stores (an OCI registry,
a PEP 503 index) implement the same three calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CacheHit:
    store: str  # which store answered ("wheelhouse", ...)
    package: str
    key: str
    location: str  # where the entry lives in that store (a directory, a reference)
    wheels: tuple[str, ...]  # wheel file names
    manifest: dict = field(default_factory=dict, compare=False, hash=False)


@runtime_checkable
class WheelCache(Protocol):
    name: str

    def lookup(self, package: str, key: str) -> CacheHit | None: ...

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]: ...

    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit: ...
