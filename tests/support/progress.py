"""What the two halves of test_progress.py share: tests/unit/builds/test_progress.py (its tests that need no Docker)
and tests/docker/builds/test_progress.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
