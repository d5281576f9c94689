"""What the two halves of test_jit_modules.py share: tests/unit/render/test_jit_modules.py (its tests that need no
Docker) and tests/docker/render/test_jit_modules.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from builder import plan, render

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "cuda-ext"
JIT_MATRIX = FIXTURE / "matrix-jit-modules.toml"


def rendered(m, cell) -> str:
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    return text[text.index(" AS runtime"):]
