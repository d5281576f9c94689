"""Small helpers shared by the tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from click.testing import CliRunner

from builder.cli import main

REPO = Path(__file__).resolve().parent.parent
MATRIX = REPO / "matrix.toml"


def run_cli(*args: str, cwd: Path | None = None):
    """Invoke the real click entry point in-process; returns click's Result."""
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, list(args), catch_exceptions=False)
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def write_matrix(tmp: Path, text: str, lock_from: Path = REPO / "matrix.lock") -> Path:
    """A matrix file in tmp, next to a copy of the real lock file."""
    path = tmp / "matrix.toml"
    path.write_text(textwrap.dedent(text))
    if lock_from is not None:
        (tmp / "matrix.lock").write_text(lock_from.read_text())
    return path
