"""What the two halves of test_serve_jit.py share: tests/unit/render/test_serve_jit.py (its tests that need no
Docker) and tests/docker/render/test_serve_jit.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
