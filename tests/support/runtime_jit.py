"""What the two halves of test_runtime_jit.py share: tests/unit/render/test_runtime_jit.py (its tests that need no
Docker) and tests/docker/render/test_runtime_jit.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from builder import plan, render
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import REPO

LOCAL = REPO / "tests" / "fixtures" / "local-engines"


def vllm_cell():
    m = load(LOCAL / "matrix.toml")
    (cell,) = [c for c in select(m, Selection()) if c.engine == "vllm"]
    assert cell.runtime_jit, "the vLLM 0.33.0 cell compiles kernels at run time"
    return m, cell, render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
