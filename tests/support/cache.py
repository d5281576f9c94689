"""What the two halves of test_cache.py share: tests/unit/cache/test_cache.py (its tests that need no Docker) and
tests/docker/cache/test_cache.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
