"""What the two halves of test_repro.py share: tests/unit/image/test_repro.py (its tests that need no Docker) and
tests/docker/image/test_repro.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations


from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
