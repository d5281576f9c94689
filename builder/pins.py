"""Runtime pins: the exact pure-Python dependency set of a cell, resolved once and reused.

The first successful build of a cell resolves the engine's dependencies from the index and records
`pip freeze` of the runtime image in runtime-pins/<cell-id>.txt next to the matrix (commit it, like a lock
file). Every later build passes that file as constraints, so the image gets the same versions; delete the
file (or `build --refresh-pins`) to resolve again. Packages builder compiles, and torch, are pinned by the
cell itself and left out.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

from . import docker
from .resolve import Cell

DIR_NAME = "runtime-pins"
FILE_IN_CONTEXT = "runtime-pins.txt"


def from_freeze(freeze: str, cell: Cell) -> list[str]:
    """`name==version` lines of what pip installed from the index (not the cell's own wheels, nor torch)."""
    own = {canonicalize_name(p.recipe.pypi) for p in cell.packages} | {canonicalize_name(p.name) for p in cell.packages}
    own |= {"torch", "pip", "setuptools", "wheel"}
    out = []
    for line in freeze.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.strip())
        if m and canonicalize_name(m.group(1)) not in own:
            out.append(f"{canonicalize_name(m.group(1))}=={m.group(2)}")
    return sorted(out)


def record(image: str, cell: Cell, path: Path) -> Path:
    lines = from_freeze(docker.run_in_image(image, "python", "-m", "pip", "freeze", "--all"), cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Written by `builder build` from the first build of {cell.id}; constraints for the next ones.\n"
    tmp = path.with_suffix(".part")
    tmp.write_text(header + "".join(f"{line}\n" for line in lines))
    tmp.rename(path)
    return path
