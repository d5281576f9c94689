"""The test tiers say what they need: `toolchain` is added for every test that uses the nvcc or cuobjdump fixture,
a test marked `pure` cannot start a program (conftest's guard), and test modules share helpers through
tests/helpers.py (and tests/support/: what the halves of a split module share), never by
importing each other."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess

import pytest

from tests.helpers import REPO, ShellOut

TESTS = REPO / "tests"


@pytest.mark.pure
def test_a_pure_test_cannot_start_a_program():
    with pytest.raises(ShellOut, match="subprocess.Popen: \\['true'\\]"):
        subprocess.run(["true"])
    with pytest.raises(ShellOut):
        subprocess.check_output("echo hi", shell=True)
    with pytest.raises(ShellOut, match="os.system"):
        os.system("true")
    with pytest.raises(ShellOut):
        os.posix_spawnp("true", ["true"], os.environ)

    async def spawn():
        await asyncio.create_subprocess_exec("true")

    with pytest.raises(ShellOut):
        asyncio.run(spawn())


def test_an_unmarked_test_still_can():
    assert subprocess.run(["true"]).returncode == 0


def test_a_test_using_cuobjdump_is_marked_toolchain(cuobjdump, request):
    assert request.node.get_closest_marker("toolchain") is not None


@pytest.mark.pure
def test_a_test_without_the_toolchain_fixtures_is_not(request):
    assert request.node.get_closest_marker("toolchain") is None


@pytest.mark.pure
def test_test_modules_import_no_other_test_module_or_conftest():
    found = {}
    for path in sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.module else [a.name for a in node.names]
                if node.level == 0:
                    names = [n[len("tests."):] for n in names if n.startswith("tests.")]
            elif isinstance(node, ast.Import):
                names = [a.name[len("tests."):] for a in node.names if a.name.startswith("tests.")]
            else:
                continue
            bad = [n for n in names if any(part.startswith("test_") or part == "conftest" for part in n.split("."))]
            if bad:
                found[str(path.relative_to(TESTS))] = bad
    assert found == {}
