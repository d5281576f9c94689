"""What the two halves of test_publish.py share: tests/unit/image/test_publish.py (its tests that need no Docker)
and tests/docker/image/test_publish.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations


from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
MATRIX = FIXTURE / "matrix.toml"
MATRIX_PUBLISH = FIXTURE / "matrix-publish.toml"
CELL = "cuda-ext-1.0.0-cu130-py311-sm80.90"
CELL_90 = "cuda-ext-1.0.0-cu130-py311-sm90"
