"""wheelhouse/: the local wheel cache, one directory per (package, cache key) holding the wheels and a
manifest (builder-wheel.json: every file's sha256 and size, the key inputs, the audit result, who built it
and when).

- An entry is written to a temporary directory and renamed into place only once complete, so an
  interrupted build never leaves a half entry that a later plan would call a hit; temporary directories a
  killed build left behind are removed by the next store of that key (under the key's lock).
- Every reuse is verified: the manifest when plan looks (cheap), every file's sha256 when the wheels are
  fetched. A bad entry is moved to wheelhouse/.quarantine/ (never silently deleted) and rebuilt.
- `lock(package, key)` is a file lock per key: a second build of the same wheel waits for the first one's
  compile and then reuses its entry instead of compiling again.
- Entries follow the umask (shared wheelhouses work for every user of the group).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .. import files
from . import CacheCorrupt, CacheHit, manifest_problem, verify_files

MANIFEST = "builder-wheel.json"
QUARANTINE = ".quarantine"
STALE_TEMPORARY_S = 3600  # a store's temporary directory older than this was left by a build that died
LOCKS = ".locks"
# what builder itself names under the wheelhouse; nothing else there is ever moved or removed
PACKAGE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
KEY_NAME = re.compile(r"[0-9a-f]{64}")
TEMP_NAME = re.compile(r"\.[0-9a-f]{12}-[a-z0-9_]{8}")  # store()'s mkdtemp
QUARANTINED_NAME = re.compile(r"[0-9a-f]{64}-[0-9]{8}T[0-9]{6}-[0-9]+")  # discard()'s destination
MANIFEST_MAX_BYTES = 16 << 20


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Wheelhouse:
    name = "wheelhouse"

    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, package: str, key: str) -> Path:
        return self.root / package / key

    # -- reading ----------------------------------------------------------------------------------------
    def read_manifest(self, package: str, key: str) -> dict | None:
        path = self.entry_dir(package, key) / MANIFEST
        try:
            if path.is_symlink() or (path.exists() and not path.is_file()):
                return {"__unreadable__": f"{path.name} is not a regular file"}
            raw = files.read_regular(path, MANIFEST_MAX_BYTES)  # a FIFO or device: refused, never opened to be read
            if len(raw) > MANIFEST_MAX_BYTES:
                return {"__unreadable__": f"{path.name} is larger than {MANIFEST_MAX_BYTES} bytes"}
            meta = json.loads(raw)
        except FileNotFoundError:
            return None
        except RecursionError:  # absurdly nested JSON: one bad entry, not a crash of every verb
            return {"__unreadable__": f"{path.name}: nested too deeply"}
        except (OSError, ValueError) as exc:
            return {"__unreadable__": f"{path.name}: {exc}"}
        return meta if isinstance(meta, dict) else {"__unreadable__": f"{path.name}: not a JSON object"}

    def not_own(self, package: str, key: str, meta: dict | None = None) -> str:
        """Why the directory <package>/<key> is not provably one of builder's entries ("" when it is: a real
        directory with key- and package-shaped names whose manifest names that very package and key). Only such
        entries are ever moved or removed."""
        d = self.entry_dir(package, key)
        if not PACKAGE_NAME.fullmatch(package) or not KEY_NAME.fullmatch(key):
            return f"{d} is not named <package>/<64-hex key>"
        if d.is_symlink() or not d.is_dir():
            return f"{d} is not a directory"
        meta = self.read_manifest(package, key) if meta is None else meta
        if meta is None:
            return f"{d} has no {MANIFEST}"
        if "__unreadable__" in meta:
            return f"{d}: {meta['__unreadable__']}"
        if meta.get("package") != package or meta.get("key") != key:
            return (f"{d}: its {MANIFEST} is for {str(meta.get('package'))[:80]} key {str(meta.get('key'))[:16]}, "
                    "not for this directory (a copied or moved entry?)")
        return ""

    def lookup(self, package: str, key: str, archs: tuple[int, ...]) -> CacheHit | None:
        """The entry for this key, or None; an entry that is there but unusable comes back with `problem`."""
        d = self.entry_dir(package, key)
        meta = self.read_manifest(package, key)
        if meta is None:
            return None
        problem = meta.get("__unreadable__", "") if isinstance(meta, dict) else ""
        problem = problem or manifest_problem(meta, archs)
        if not problem and (meta.get("package") != package or meta.get("key") != key):
            problem = (f"its manifest is for {str(meta.get('package'))[:80]} key {str(meta.get('key'))[:16]}, "
                       "not this key (a copied or moved entry?)")
        names = tuple(meta.get("wheels", ())) if not problem else ()
        if not problem:
            for name in names:
                f = d / name
                if not f.is_file():
                    problem = f"{name} is missing"
                elif f.stat().st_size != meta["files"][name]["bytes"]:
                    problem = f"{name}: {f.stat().st_size} bytes, the manifest says {meta['files'][name]['bytes']}"
                if problem:
                    break
        return CacheHit(self.name, package, key, str(d), names, meta if isinstance(meta, dict) else {}, problem)

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]:
        """Hard-link (or copy) the entry's wheels into dest, then verify every sha256 against the manifest."""
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        for name in hit.wheels:
            src, dst = Path(hit.location) / name, dest / name
            if dst.exists():
                dst.unlink()
            try:
                os.link(src, dst)
            except FileNotFoundError:
                raise CacheCorrupt(f"{self.name} entry {hit.package} {hit.key[:16]}: {name} is missing") from None
            except OSError:
                shutil.copy2(src, dst)
            out.append(dst)
        why = verify_files(out, hit.manifest)
        if why:
            for f in out:
                f.unlink(missing_ok=True)
            raise CacheCorrupt(f"{self.name} entry {hit.package} {hit.key[:16]}: {why}")
        return out

    def entries(self) -> Iterator[tuple[str, str]]:
        """(package, key) of every directory named like an entry (<package>/<64-hex key>, no symlink), sorted;
        whether it really is one is `not_own`'s question. Anything else under the wheelhouse is not builder's."""
        if not self.root.is_dir():
            return
        for pkg_dir in sorted(p for p in self.root.iterdir()
                              if PACKAGE_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()):
            for entry in sorted(e for e in pkg_dir.iterdir()
                                if KEY_NAME.fullmatch(e.name) and e.is_dir() and not e.is_symlink()):
                yield pkg_dir.name, entry.name

    # -- writing ----------------------------------------------------------------------------------------
    def store(self, package: str, key: str, wheels: list[Path], manifest: dict, keep_usable: bool = False) -> CacheHit:
        """Copy the wheels into the entry for this key, atomically, with the manifest. `keep_usable`: an entry
        that is already there and usable (a concurrent pull of the same key renamed it into place first) is
        kept and returned, not replaced."""
        if not wheels:
            raise ValueError(f"nothing to store for {package} (no wheel)")
        final = self.entry_dir(package, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._clean_temporaries(package, key)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        names = [w.name for w in wheels]
        mask = _umask()
        try:
            for w in wheels:
                shutil.copyfile(w, tmp / w.name)
                os.chmod(tmp / w.name, 0o666 & ~mask)
            manifest = {**manifest, "package": package, "key": key, "wheels": names}  # what makes it builder's entry
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            os.chmod(tmp / MANIFEST, 0o666 & ~mask)
            os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it 0700
            why = verify_files([tmp / n for n in names], manifest)
            if why:  # the copy is not what was audited: never let it become an entry
                raise CacheCorrupt(f"storing {package} {key[:16]}: {why}")
            if final.exists() or final.is_symlink():
                there = self.lookup(package, key, ()) if keep_usable else None
                if there is not None and there.usable:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return there
                foreign = self.not_own(package, key)
                if foreign:
                    raise CacheCorrupt(f"cannot store {package} {key[:16]}: {foreign}; builder moves only its own "
                                       "entries: move it away by hand")
                self.discard(CacheHit(self.name, package, key, str(final), ()), "replaced by a new build")
            os.rename(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.filename is not None or exc.errno is None:
                raise
            # e.g. a full disk: say where, and where the compiled wheels still are
            raise OSError(exc.errno, f"storing {package} (key {key[:16]}) in the wheelhouse failed: {exc.strerror}; "
                                     f"the wheels are still in {wheels[0].parent}", str(final.parent)) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CacheHit(self.name, package, key, str(final), tuple(names), manifest)

    def annotate(self, package: str, key: str, extra: dict) -> CacheHit:
        """Add keys to an entry's manifest (e.g. where a push put it), atomically; the files are untouched."""
        d = self.entry_dir(package, key)
        meta = {**json.loads((d / MANIFEST).read_text()), **extra}
        fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}-", dir=d)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(meta, indent=2, sort_keys=True))
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, d / MANIFEST)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return CacheHit(self.name, package, key, str(d), tuple(meta.get("wheels", ())), meta)

    def discard(self, hit: CacheHit, why: str) -> str:
        """Move an entry to wheelhouse/.quarantine/<package>/<key>-<time>/ with a note saying why; returns
        where it went."""
        src = Path(hit.location)
        if not src.exists():
            return ""
        foreign = self.not_own(hit.package, hit.key) if src == self.entry_dir(hit.package, hit.key) else \
            f"{src} is not an entry directory of {self.root}"
        if foreign:
            return ""  # not provably builder's: left where it is (the caller says so)
        dest = self.root / QUARANTINE / hit.package / f"{hit.key}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(src, dest)
        (dest / "QUARANTINED").write_text(why + "\n")
        return str(dest)

    def _clean_temporaries(self, package: str, key: str) -> None:
        """Temporary directories of this key left by a build that died mid-store. Only old ones: a pull stores
        without the key's lock, so a young one may be a concurrent store still copying into it."""
        for stale in (self.root / package).glob(f".{key[:12]}-*"):
            if TEMP_NAME.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                with contextlib.suppress(OSError):
                    if time.time() - stale.stat().st_mtime > STALE_TEMPORARY_S:
                        shutil.rmtree(stale, ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, package: str, key: str, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the key's file lock; says once (through `waiting`) when another build holds it."""
        locks = self.root / LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        path = locks / f"{package}-{key}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting:
                    waiting(f"waiting for another build of {package} (key {key[:16]}) to finish")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
