"""wheelhouse/: the local wheel cache, one directory per (package, cache key).

An entry is written to a temporary directory and renamed into place only once complete, so an
interrupted build never leaves a half entry that a later plan would call a hit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

MANIFEST = "builder-wheel.json"


class Wheelhouse:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry_dir(self, package: str, key: str) -> Path:
        return self.root / package / key

    def lookup(self, package: str, key: str) -> list[Path] | None:
        """The wheels of a complete entry, or None."""
        d = self.entry_dir(package, key)
        manifest = d / MANIFEST
        if not manifest.is_file():
            return None
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return None
        wheels = [d / w for w in meta.get("wheels", [])]
        if not wheels or not all(w.is_file() for w in wheels):
            return None
        return wheels

    def store(self, package: str, key: str, source_dir: Path, meta: dict) -> list[Path]:
        """Move the wheels found in source_dir into the entry (atomically)."""
        wheels = sorted(Path(source_dir).glob("*.whl"))
        if not wheels:
            raise FileNotFoundError(f"no wheel in {source_dir}")
        final = self.entry_dir(package, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        try:
            for w in wheels:
                shutil.copy2(w, tmp / w.name)
            (tmp / MANIFEST).write_text(json.dumps({**meta, "wheels": [w.name for w in wheels]}, indent=2, sort_keys=True))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return [final / w.name for w in wheels]
