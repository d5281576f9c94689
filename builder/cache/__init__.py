"""The wheel cache: one protocol, several stores. A compiled wheel is stored under its cache key (plan
computes it from everything that shaped the wheel) and never compiled again while the key is unchanged —
and never trusted blindly: every file is recorded with its sha256 and size, and every reuse checks them.

    lookup(package, key, archs) -> CacheHit | None
        Is an entry there? Cheap (no download, no hashing): the manifest is read and checked (files listed
        with sha256 and size, an audit that passed for `archs`). An entry that is present but unusable comes
        back as a hit with `problem` set; plan shows it as "build", the compile step discards it.
    fetch(hit, dest) -> [wheel paths]
        Bring the wheels of a hit into dest and verify each file's sha256 and size against the manifest
        (streaming). Raises CacheCorrupt on a mismatch; nothing unverified is ever returned. A store whose
        lookup can only see a summary (an index: the manifest travels inside the wheel) completes
        hit.manifest once the files are verified, so it describes exactly the files returned.
    store(package, key, wheels, manifest) -> CacheHit
        Keep audited wheels (the runner stores only what passed its audit), atomically.
    discard(hit, why)
        Take a bad entry out of service: the local store moves it aside (quarantine), never deletes it.
    lock(package, key, waiting)
        A context manager holding the key's lock from compile to store, so two builds of one wheel compile
        it once (the second waits, then finds the entry).

`local.Wheelhouse` (wheelhouse/ next to the matrix) is the first store; remote stores (`registry.RegistryStore`:
an OCI registry, one artifact per key; `index.IndexStore`: a PEP 503 index, wheels with a local version label)
implement the same calls, and `tiered.TieredCache` puts them behind the local one (pull-through on fetch,
write-through on store). `config` reads which remotes to use ([defaults.cache], --cache-remote) and their
credentials. A remote that does not answer raises EnvironmentProblem (exit 3), never a silent miss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Protocol, runtime_checkable

from ..errors import BuilderError
from ..files import sha256_file

MANIFEST_FORMAT = 2


class CacheCorrupt(BuilderError):
    """A cached entry whose files do not match its manifest (tampered, truncated, bit-flipped)."""


@dataclass(frozen=True)
class CacheHit:
    store: str  # which store answered ("wheelhouse", "registry", "index")
    package: str
    key: str
    location: str  # where the entry lives in that store (a directory, a reference, a URL)
    wheels: tuple[str, ...]  # wheel file names
    manifest: dict = field(default_factory=dict, compare=False, hash=False)
    problem: str = ""  # set when the entry is there but must not be used (plan: build; compile: discard)
    remote: bool = False  # a remote store's entry (plan: "pull"); fetching it pulls it into the wheelhouse
    notes: tuple[str, ...] = field(default=(), compare=False)  # what a store has to say (e.g. a push that failed)

    @property
    def usable(self) -> bool:
        return not self.problem


@runtime_checkable
class WheelCache(Protocol):
    name: str

    def lookup(self, package: str, key: str, archs: tuple[int, ...]) -> CacheHit | None: ...

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]: ...

    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit: ...

    def discard(self, hit: CacheHit, why: str) -> str: ...

    def lock(self, package: str, key: str, waiting: Callable[[str], None] | None = None) -> ContextManager[None]: ...


# -- what every store checks ----------------------------------------------------------------------------
def file_records(wheels: list[Path]) -> dict[str, dict]:
    """{file name: {"sha256", "bytes"}} for a manifest."""
    return {w.name: {"sha256": sha256_file(w), "bytes": w.stat().st_size} for w in wheels}


def manifest_problem(manifest: object, archs: tuple[int, ...]) -> str:
    """Why a manifest does not describe a usable entry for `archs` ("" when it does)."""
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object"
    files = manifest.get("files")
    wheels = manifest.get("wheels")
    if not isinstance(wheels, list) or not wheels or not isinstance(files, dict):
        return "the manifest lists no wheel files with their hashes (written by an older builder?)"
    for name in wheels:
        rec = files.get(name) if isinstance(name, str) else None
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str) or not isinstance(rec.get("bytes"), int):
            return f"the manifest records no sha256 and size for {name!r}"
        if "/" in name or name.startswith("."):
            return f"the manifest names an unsafe file {name!r}"
    audit = manifest.get("audit")
    if not isinstance(audit, dict) or audit.get("ok") is not True:
        return "its recorded audit did not pass"
    audited = audit.get("archs")
    if not isinstance(audited, list) or not set(archs) <= set(audited):
        return f"its audit was for archs {audited}, not {list(archs)}"
    return ""


def verify_files(files: list[Path], manifest: dict) -> str:
    """Why the files do not match the manifest's records ("" when every sha256 and size matches)."""
    records = manifest["files"]
    names = {f.name for f in files}
    for name in manifest["wheels"]:
        if name not in names:
            return f"{name} is missing"
    for f in files:
        rec = records.get(f.name)
        if rec is None:
            return f"{f.name} is not in the manifest"
        size = f.stat().st_size
        if size != rec["bytes"]:
            return f"{f.name}: {size} bytes, the manifest says {rec['bytes']}"
        digest = sha256_file(f)
        if digest != rec["sha256"]:
            return f"{f.name}: sha256 {digest[:16]}…, the manifest says {rec['sha256'][:16]}…"
    return ""
