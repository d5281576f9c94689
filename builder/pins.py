"""Runtime pins: the exact pure-Python dependency set of a cell, resolved once and reused.

The first successful build of a cell resolves the engine's dependencies from the index and records
`pip freeze` of the runtime image in runtime-pins/<cell-id>.txt next to the matrix (commit it, like a lock
file), each release with the sha256 of every file the index has for it (`--hash=sha256:...`). Every later build
installs from a hash-locked requirements file: those lines plus the cell's own audited wheels with their
hashes (`pip install --require-hashes`), so the image gets the same files, byte for byte, or the build stops.
A pins file without hashes (written before, or for a release the index does not list) is used as
constraints instead. Delete the file (or `build --refresh-pins`) to resolve again. Packages builder compiles
are the cell's own wheels and left out; torch is pinned by the cell and, in the hashed file, by its hashes.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

from . import docker
from .errors import UserError
from .resolve import Cell

DIR_NAME = "runtime-pins"
FILE_IN_CONTEXT = "runtime-pins.txt"  # a pins file of versions only: constraints
HASHED_IN_CONTEXT = "runtime-requirements.txt"  # (its name is also in dockerfiles/stages/runtime.j2)


def from_freeze(freeze: str, cell: Cell, keep_torch: bool = False) -> list[str]:
    """`name==version` lines of what pip installed from the index (not the cell's own wheels, nor torch unless
    asked)."""
    own = {canonicalize_name(p.recipe.pypi) for p in cell.packages} | {canonicalize_name(p.name) for p in cell.packages}
    own |= {"pip", "setuptools", "wheel"} | (set() if keep_torch else {"torch"})
    out = []
    for line in freeze.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.strip())
        if m and canonicalize_name(m.group(1)) not in own:
            out.append(f"{canonicalize_name(m.group(1))}=={m.group(2)}")
    return sorted(out)


def hashed(text: str) -> bool:
    return "--hash=sha256:" in text


def with_hashes(lines: list[str], index) -> tuple[list[str], str]:
    """Each `name==version` with `--hash=sha256:...` for every file the index lists for that release (any of
    them may be the one pip picks), or ([], why) when one release is not on the index."""
    out = []
    for line in lines:
        name, _, version = line.partition("==")
        try:
            digests = sorted({f.sha256 for f in index.release_files(name, version) if f.sha256})
        except UserError as exc:
            return [], str(exc)
        if not digests:
            return [], f"{name} {version}: the index lists no sha256"
        out.append(line + "".join(f" --hash=sha256:{d}" for d in digests))
    return out, ""


def requirements(pins_text: str, wheels: list[tuple[str, str]]) -> str:
    """The hash-locked requirements file the runtime stage installs: the pinned releases and the cell's own
    wheels (file in the build context, sha256)."""
    lines = [l for l in pins_text.splitlines() if l.strip() and not l.startswith("#")]
    return "".join(f"{l}\n" for l in lines) + "".join(f"/wheels/{name} --hash=sha256:{sha}\n" for name, sha in wheels)


def record(image: str, cell: Cell, path: Path, index_url: str | None = None) -> tuple[Path, str]:
    """Write the pins file; returns it and, when its lines carry no hashes, why."""
    freeze = docker.run_in_image(image, "python", "-m", "pip", "freeze", "--all")
    lines, why = from_freeze(freeze, cell), "no index to read hashes from"
    if index_url:
        from .pypi import SimpleIndex

        locked, why = with_hashes(from_freeze(freeze, cell, keep_torch=True), SimpleIndex(index_url))
        if locked:
            lines = locked
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `builder build` from the first build of {cell.id}; "
              + ("hash-locked requirements for the next ones.\n" if hashed("".join(lines)) else
                 f"constraints for the next ones (no hashes: {why}).\n"))
    tmp = path.with_suffix(".part")
    tmp.write_text(header + "".join(f"{line}\n" for line in lines))
    tmp.rename(path)
    return path, "" if hashed("".join(lines)) else why
