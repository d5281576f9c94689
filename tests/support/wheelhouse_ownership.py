"""What the two halves of test_wheelhouse_ownership.py share: tests/unit/cache/test_wheelhouse_ownership.py (its
tests that need no Docker) and tests/docker/cache/test_wheelhouse_ownership.py (those that do). Written by
scripts/layout-tests."""

from __future__ import annotations

from pathlib import Path

from builder.cache import file_records
from builder.cache.local import Wheelhouse

from tests.helpers import REPO
from tests.helpers import a_wheel

FIXTURE_MATRIX = REPO / "tests" / "fixtures" / "cuda-ext" / "matrix.toml"
OWN_GOOD, OWN_BAD, COPIED = "1" * 64, "2" * 64, "3" * 64


def own_entry(wh: Wheelhouse, key: str, tmp: Path) -> Path:
    whl = a_wheel(tmp / f"out-{key[:4]}", key.encode())
    wh.store("demo", key, [whl], {"files": file_records([whl]), "audit": {"ok": True, "archs": [80]},
                                  "compiled": False, "version": "1.0"})
    return wh.entry_dir("demo", key)
