"""The local wheelhouse in front of remote stores: one WheelCache for the runner.

- lookup: the wheelhouse first; then each remote in order. The first usable entry wins; when none is usable the
  bad one comes back (the compile step discards it and compiles). A remote that does not answer raises
  EnvironmentProblem (exit 3): a configured shared cache that is down is reported before anything runs, never
  silently turned into hours of local compiles (`--no-remote` builds with the wheelhouse only, on purpose).
- fetch of a remote hit (pull-through): download into wheelhouse/.pulls/ (verified while it streams), store
  into the wheelhouse (atomic, verified again), then hand out the local files. A remote that goes away
  mid-pull raises EnvironmentProblem naming it; the temporary download is removed and no entry is written.
- store (write-through; the runner stores only what passed its audit): the wheelhouse first, then every remote
  that takes pushes. A failed push is a warning in the step's notes (the wheel is built, audited and cached
  locally; `builder wheels push` retries), and what each remote answered (the artifact's digest, the index
  files) is recorded in the local manifest under "remotes".
- discard of a remote entry never deletes remote data: the entry is skipped for the rest of this run and the
  reason reported; a registry entry is overwritten by the rebuilt wheel's push.
- lock: the wheelhouse's per-key file lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from . import CacheHit
from .local import Wheelhouse
from ..errors import BuilderError, EnvironmentProblem

PULLS = ".pulls"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class TieredCache:
    name = "wheelhouse"

    def __init__(self, local: Wheelhouse, remotes: list, say: Callable[[str], None] | None = None):
        self.local = local
        self.remotes = list(remotes)
        self.say = say or (lambda s: None)
        self._bad: set[tuple[str, str, str]] = set()  # (store, package, key) discarded in this run
        self.pulled: list[dict] = []  # what fetch pulled: store, package, key, bytes, seconds

    def remote(self, name: str):
        for r in self.remotes:
            if r.name == name:
                return r
        raise KeyError(name)

    # -- reading ------------------------------------------------------------------------------------------
    def lookup(self, package: str, key: str, archs: tuple[int, ...]) -> CacheHit | None:
        hit = self.local.lookup(package, key, archs)
        if hit is not None and hit.usable:
            return hit
        bad = hit
        for r in self.remotes:
            if (r.name, package, key) in self._bad:
                continue
            found = r.lookup(package, key, archs)
            if found is None:
                continue
            if found.usable:
                return found
            bad = bad or found
        return bad

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]:
        if not hit.remote:
            return self.local.fetch(hit, dest)
        remote = self.remote(hit.store)
        started = time.monotonic()
        pulls = self.local.root / PULLS
        pulls.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f"{hit.package}-{hit.key[:12]}-", dir=pulls))
        try:
            try:
                wheels = remote.fetch(hit, stage)
            except EnvironmentProblem as exc:
                raise EnvironmentProblem(
                    f"pulling {hit.package} (key {hit.key[:16]}) from {remote.label} failed: {exc}. Nothing was "
                    "written to the wheelhouse (its entries are as they were); rerun once the remote answers, "
                    "or --no-remote to compile instead") from None
            size = sum(w.stat().st_size for w in wheels)
            manifest = {**hit.manifest, "pulled": {"from": remote.label, "location": hit.location, "at": now()}}
            entry = self._store_pulled(hit, wheels, manifest)
        except OSError as exc:
            if exc.errno is None:
                raise
            # e.g. a full disk, while downloading into the staging directory or copying into the entry: name the
            # wheelhouse (the staging directory is removed below, the remote still has the wheels)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise OSError(exc.errno, f"pulling {hit.package} (key {hit.key[:16]}) from {remote.label} into the "
                                     f"wheelhouse failed: {os.strerror(exc.errno)}; nothing was written to it (its "
                                     "entries are as they were)" + (": free space there and rerun" if full else ""),
                          str(self.local.root)) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        seconds = time.monotonic() - started
        self.pulled.append({"store": remote.name, "package": hit.package, "key": hit.key, "bytes": size,
                            "seconds": round(seconds, 3)})
        self.say(f"pulled {hit.package} (key {hit.key[:16]}) from {remote.label}: {size / 1e6:.1f} MB in "
                 f"{seconds:.1f} s, every sha256 verified; now in {self.local.root}")
        hit.manifest.clear()
        hit.manifest.update(entry.manifest)  # the hit now describes exactly the files handed out
        return self.local.fetch(entry, dest)

    def _store_pulled(self, hit: CacheHit, wheels: list[Path], manifest: dict) -> CacheHit:
        """Store what was pulled, unless a concurrent build (pulling or compiling the same key without this
        process's lock) got there first: then its entry is used."""
        for attempt in (1, 2):
            there = self.local.lookup(hit.package, hit.key, ())
            if there is not None and there.usable:
                return there
            try:
                return self.local.store(hit.package, hit.key, wheels, manifest, keep_usable=True)
            except OSError:  # the other store renamed its entry into place between our look and our rename
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- writing ------------------------------------------------------------------------------------------
    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit:
        entry = self.local.store(package, key, wheels, manifest)
        files = [Path(entry.location) / n for n in entry.wheels]
        pushed, notes = {}, []
        for r in self.remotes:
            if not r.push_enabled:
                continue
            try:
                remote_hit = r.store(package, key, files, entry.manifest)
            except (BuilderError, OSError) as exc:
                notes.append(f"WARNING: pushing {package} (key {key[:16]}) to {r.label} failed: {exc}. The wheel is "
                             "in the local wheelhouse; `builder wheels push` pushes it later")
                continue
            pushed[r.name] = {"label": r.label, "location": remote_hit.location, "at": now(),
                              **({"digest": remote_hit.manifest["registry"]["digest"]} if "registry" in remote_hit.manifest else {})}
            notes.append(f"pushed {package} (key {key[:16]}) to {remote_hit.location}")
        if pushed:
            entry = self.local.annotate(package, key, {"remotes": {**entry.manifest.get("remotes", {}), **pushed}})
        return CacheHit(entry.store, entry.package, entry.key, entry.location, entry.wheels, entry.manifest,
                        entry.problem, notes=tuple(notes))

    def discard(self, hit: CacheHit, why: str) -> str:
        if not hit.remote:
            return self.local.discard(hit, why)
        self._bad.add((hit.store, hit.package, hit.key))
        return self.remote(hit.store).discard(hit, why)

    @contextlib.contextmanager
    def lock(self, package: str, key: str, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
        with self.local.lock(package, key, waiting):
            yield


def open_remotes(specs) -> list:
    """The stores for RemoteSpecs (config.py), named by kind ("registry", "index"; "index-2" for a second one)."""
    from .index import IndexStore
    from .registry import RegistryStore

    out, seen = [], {}
    for spec in specs:
        seen[spec.kind] = seen.get(spec.kind, 0) + 1
        name = spec.kind if seen[spec.kind] == 1 else f"{spec.kind}-{seen[spec.kind]}"
        out.append((RegistryStore if spec.kind == "registry" else IndexStore)(spec, name))
    return out


def cache_for(local: Wheelhouse, specs, say: Callable[[str], None] | None = None):
    """The wheelhouse alone when no remote is configured, else the wheelhouse in front of the remotes."""
    return TieredCache(local, open_remotes(specs), say) if specs else local
