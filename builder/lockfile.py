"""matrix.lock, the file: what `builder lock` recorded of each package version (its pins, sdist, git commit,
fetch-plan sources, index wheels) and of the base images, read and checked (schema.LOCK) and written. Resolving a
matrix reads it; the network work that fills it is builder/lock.py's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomli_w

from . import files, redact, schema
from .errors import UserError

LOCK_NAME = "matrix.lock"
LOCK_FORMAT = 1


@dataclass(frozen=True)
class Locked:
    """What the lock file says about one package version."""

    name: str
    version: str
    requires_python: str
    torch: str
    pins: dict
    sdist: dict
    git: dict
    deps: dict  # fetch-plan sources named by tag: name → {repository, tag, commit[, unresolved]}
    wheels: tuple[dict, ...] = ()  # the release's Linux wheels on the index (filename, url, sha256): source = "index"
    wheels_read: bool = False  # whether `lock` read them at all (source = "auto": none read is another fact than none)
    torch_cuda: dict | None = None  # {"major": 12, "from": "nvidia-cuda-runtime-cu12==12.1.105"}: what its torch needs


class Lock:
    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    @classmethod
    def load(cls, path: Path) -> "Lock":
        if not path.exists() and not path.is_symlink():
            return cls(path, {"format": LOCK_FORMAT, "packages": {}})
        data = files.load_toml(path, "lock file", fix="; regenerate it with `builder lock`")
        if data.get("format") != LOCK_FORMAT:
            raise UserError(f"{path}: lock format {redact.describe(data.get('format'), 30)}, expected {LOCK_FORMAT}; run `builder lock`")
        schema.check(str(path), data, schema.LOCK)
        return cls(path, data)

    def get(self, name: str, version: str) -> Locked:
        key = f"{name}=={version}"
        entry = self.data.get("packages", {}).get(key)
        if entry is None:
            raise UserError(f"{self.path.name}: no entry for {key}; run `builder lock` to read its metadata")
        return Locked(
            name=name,
            version=version,
            requires_python=entry.get("requires_python", ""),
            torch=entry.get("torch", ""),
            pins=dict(entry.get("pins", {})),
            sdist=dict(entry.get("sdist", {})),
            git=dict(entry.get("git", {})),
            deps={k: dict(v) for k, v in entry.get("deps", {}).items()},
            wheels=tuple(dict(w) for w in entry.get("wheels", ())),
            wheels_read="wheels" in entry,
            torch_cuda=dict(entry.get("torch_cuda", {})),
        )

    def pinned_base(self, ref: str) -> str:
        """REF@sha256:... when the lock records the digest of base image REF, else REF unchanged."""
        entry = self.data.get("base_images", {}).get(ref, {})
        return f"{ref}@{entry['digest']}" if entry.get("digest") and "@" not in ref else ref

    def write(self) -> None:
        header = (
            "# Written by `builder lock` from the packages' own published metadata. Do not edit by hand:\n"
            "# change matrix.toml and run `builder lock` again.\n"
        )
        self.path.write_text(header + tomli_w.dumps(self.data))


def comparable(data):
    """Lock data without the reasons a tag stayed unresolved (their wording is the git client's, per host), without
    where a base image's digest was read, and without base images no digest is known for."""
    if isinstance(data, dict):
        out = {k: comparable(v) for k, v in data.items() if k != "unresolved"}
        if isinstance(out.get("base_images"), dict):
            out["base_images"] = {k: {"digest": v.get("digest")} for k, v in out["base_images"].items()
                                  if isinstance(v, dict) and v.get("digest")}
            if not out["base_images"]:
                del out["base_images"]
        return out
    return data
