"""What the two halves of test_serve.py share: tests/unit/deploy/test_serve.py (its tests that need no Docker) and
tests/docker/deploy/test_serve.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def model(tmp_path) -> Path:
    d = tmp_path / "Qwen3.8-27B-FP8"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen3_5"}')
    return d
