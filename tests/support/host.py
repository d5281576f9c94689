"""What the two halves of test_host.py share: tests/unit/deploy/test_host.py (its tests that need no Docker) and
tests/docker/deploy/test_host.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from tests.helpers import REPO

FIX = REPO / "tests" / "fixtures" / "host"
