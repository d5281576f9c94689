"""wheelhouse/: the local wheel cache, one directory per (package, cache key) holding the wheels and a
manifest (builder-wheel.json: key inputs, audit result, wheel names).

An entry is written to a temporary directory and renamed into place only once complete, so an
interrupted build never leaves a half entry that a later plan would call a hit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from . import CacheHit

MANIFEST = "builder-wheel.json"


class Wheelhouse:
    name = "wheelhouse"

    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, package: str, key: str) -> Path:
        return self.root / package / key

    def lookup(self, package: str, key: str) -> CacheHit | None:
        """The complete entry for this key, or None."""
        d = self.entry_dir(package, key)
        manifest = d / MANIFEST
        if not manifest.is_file():
            return None
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return None
        names = meta.get("wheels", []) if isinstance(meta, dict) else []
        if not names or not all(isinstance(n, str) and (d / n).is_file() for n in names):
            return None
        return CacheHit(self.name, package, key, str(d), tuple(names), meta)

    def fetch(self, hit: CacheHit, dest: Path) -> list[Path]:
        """Hard-link (or copy) the entry's wheels into dest."""
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        for name in hit.wheels:
            src, dst = Path(hit.location) / name, dest / name
            if dst.exists():
                dst.unlink()
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
            out.append(dst)
        return out

    def store(self, package: str, key: str, wheels: list[Path], manifest: dict) -> CacheHit:
        """Copy the wheels into the entry for this key, atomically."""
        if not wheels:
            raise ValueError(f"nothing to store for {package} (no wheel)")
        final = self.entry_dir(package, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        names = [w.name for w in wheels]
        try:
            for w in wheels:
                shutil.copy2(w, tmp / w.name)
            (tmp / MANIFEST).write_text(json.dumps({**manifest, "wheels": names}, indent=2, sort_keys=True))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CacheHit(self.name, package, key, str(final), tuple(names), manifest)
