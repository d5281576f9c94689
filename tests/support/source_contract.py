"""What the two halves of test_source_contract.py share: tests/unit/render/test_source_contract.py (its tests that
need no Docker) and tests/docker/render/test_source_contract.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import os
import shutil
import tarfile
from functools import cache
from pathlib import Path

from builder import plan, render
from builder.lock import _download
from builder.matrix import Selection, load
from builder.pypi import SimpleIndex
from builder.resolve import select

from tests.helpers import MATRIX
from tests.helpers import instructions, stage_lines


# --------------------------------------------------------------------------- the shipped cells and their sources


@cache
def shipped():
    m = load(MATRIX)
    cells = select(m, Selection(profiles=("all",)))
    return m, {c.id: render.render(plan.plan_cells([c], None)[0], m.defaults["index"]) for c in cells}, cells


@cache
def source_tree(url: str, sha256: str, filename: str) -> Path:
    """The sdist, downloaded once into the user cache (sha256-checked) and unpacked next to it."""
    sdist = _download(SimpleIndex(shipped()[0].defaults["index"]), url, sha256, filename)
    root = sdist.parent / "unpacked"
    if not root.is_dir():  # unpacked apart, then renamed: the suite's other worker may unpack the same sdist now
        tmp = sdist.parent / f"unpacked.part-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        try:
            tmp.rename(root)
        except OSError:  # the other one renamed its tree first: the same bytes
            shutil.rmtree(tmp, ignore_errors=True)
    (top,) = root.iterdir()
    return top


def tree_of(pkg) -> Path:
    return source_tree(pkg.source.url, pkg.source.sha256, pkg.source.filename)


def build_stage(text: str, name: str) -> list[str]:
    return instructions(stage_lines(text, f"build-{name}"))
