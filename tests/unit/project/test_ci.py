"""The CI workflows, checked by real linters: actionlint (expressions, contexts, job graph, action versions, and
shellcheck on every run: script) and the GitHub workflow JSON schema (check-jsonschema, offline) — and the
shape the issue asks for: one job per cell from `builder matrix`, runner labels from the matrix, the registry
caches, smoke on GPU runners, publish only on release tags."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' brings it")
    return str(found)


def actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("actionlint"), "-no-color", "-shellcheck", tool("shellcheck"), *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.pure
def test_there_are_workflows_to_check():
    assert WORKFLOWS, "no .github/workflows/*.yml"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint_with_shellcheck(workflow):
    res = actionlint(workflow)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_workflow_schema(workflow):
    res = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(workflow)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_linters_catch_real_mistakes(tmp_path):
    """A misspelt key, a job that needs a job that does not exist, an unquoted variable in a run: script and a
    context that does not exist are each reported: the checks above can fail."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\n"
        "on: push\n"
        "jobs:\n"
        "  a:\n"
        "    runs-on: ubuntu-latest\n"
        "    needs: nosuchjob\n"
        "    steps:\n"
        "      - run: echo $UNQUOTED_VAR > ${{ github.nosuchfield }}\n"
        "  b:\n"
        "    runs_on: ubuntu-latest\n"
        "    steps:\n"
        "      - run: true\n")
    res = actionlint(bad)
    assert res.returncode == 1
    out = res.stdout
    assert "nosuchjob" in out
    assert "runs_on" in out
    assert "SC2086" in out  # shellcheck ran on the run: script
    assert "nosuchfield" in out
    schema = subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(bad)],
                            capture_output=True, text=True, timeout=120)
    assert schema.returncode == 1


def _images_workflow() -> dict:
    from ruamel.yaml import YAML  # check-jsonschema's YAML reader (YAML 1.2: `on` stays a string)

    return YAML(typ="safe").load((REPO / ".github" / "workflows" / "images.yml").read_text())


@pytest.mark.pure
def test_images_workflow_fans_out_per_cell_with_the_matrix_runner_labels():
    wf = _images_workflow()
    jobs = wf["jobs"]
    assert "scripts/builder matrix" in jobs["plan"]["steps"][-1]["run"]
    for name, runner in (("compile", "${{ matrix.runner }}"), ("smoke", "${{ matrix.gpu_runner }}")):
        job = jobs[name]
        assert job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.cells) }}"
        assert job["runs-on"] == runner
        assert job["strategy"]["fail-fast"] is False
    assert jobs["smoke"]["needs"] == ["plan", "compile"]
    compile_run = " ".join(s.get("run", "") for s in jobs["compile"]["steps"])
    assert "--no-smoke" in compile_run and "--cache-remote \"registry:$BUILDER_REGISTRY/wheels\"" in compile_run
    assert "--layer-cache \"$BUILDER_REGISTRY/buildcache\"" in compile_run
    smoke_run = " ".join(s.get("run", "") for s in jobs["smoke"]["steps"])
    assert "scripts/builder publish" in smoke_run and "scripts/builder build" in smoke_run
    # a fresh runner takes an unchanged cell's image from the registry (publish from its own --registry)
    assert "--reuse-from \"$BUILDER_REGISTRY\"" in compile_run
    assert "scripts/builder build \"${args[@]}\" --reuse-from \"$BUILDER_REGISTRY\"" in smoke_run
    # publish only on release tags (or when asked by hand)
    assert wf["on"]["push"] == {"tags": ["v*"]}
    assert jobs["smoke"]["env"]["PUBLISH"] == "${{ startsWith(github.ref, 'refs/tags/v') || inputs.publish }}"
    # secrets reach the steps that push as environment variables, never a command line
    assert "secrets." not in compile_run + smoke_run
    assert wf["permissions"] == {"contents": "read"}


def test_builder_matrix_gives_each_cell_its_runner_labels(tmp_path):
    """What the workflow fans out over: every cell, with runner labels from matrix.toml [defaults.runners]."""
    out = subprocess.run([sys.executable, "-m", "builder.cli", "matrix", "--profile", "all"], capture_output=True,
                         text=True, cwd=REPO, check=True).stdout
    cells = json.loads(out)["include"]
    assert cells and all(c["runner"] == ["self-hosted", "linux", "x64", "builder-compile"] for c in cells)
    assert all(c["gpu_runner"] == ["self-hosted", "linux", "x64", "gpu"] for c in cells)
    matrix = tmp_path / "matrix.toml"
    matrix.write_text((REPO / "matrix.toml").read_text().replace(
        "[defaults.base_images]", '[defaults.runners]\ncompile = ["self-hosted", "cpu-64"]\n\n[defaults.base_images]', 1))
    (tmp_path / "matrix.lock").write_text((REPO / "matrix.lock").read_text())
    out = subprocess.run([sys.executable, "-m", "builder.cli", "matrix", "--matrix", str(matrix)], capture_output=True,
                         text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert all(c["runner"] == ["self-hosted", "cpu-64"] for c in json.loads(out.stdout)["include"])
    bad = tmp_path / "bad.toml"
    bad.write_text(matrix.read_text().replace('["self-hosted", "cpu-64"]', '"self-hosted cpu-64"'))
    (tmp_path / "bad.lock").write_text("")
    res = subprocess.run([sys.executable, "-m", "builder.cli", "matrix", "--matrix", str(bad)], capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 2 and "defaults.runners.compile" in res.stderr
