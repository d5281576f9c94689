"""What the two halves of test_min_gcc.py share: tests/unit/matrix/test_min_gcc.py (its tests that need no Docker)
and tests/docker/matrix/test_min_gcc.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from tests.helpers import REPO

LOCAL = REPO / "tests" / "fixtures" / "local-engines" / "matrix.toml"
