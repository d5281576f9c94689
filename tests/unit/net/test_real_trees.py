"""The engines' real trees through a git host (issue 47), where one is set up: BUILDER_GIT_HOST_ROOT names a
scripts/git-host ROOT holding at least github.com/sgl-project/sglang with upstream's tag v0.5.18 (docs/testing.md
says how it is made from repository snapshots). Slow: it reads real trees of hundreds of MB.

`builder lock` through the host pins the SGLang cell of tests/fixtures/real-trees and reads sglang-kernel's fetch
plan from the real python/sglang/kernels/aot CMake files at the tag's commit: the same document builder ships in
builder/data/fetchplans/, and `plan` shows no UNPINNED line for the cell. `scripts/git-host check` then says, per
source of that plan, whether the host can serve it byte for byte (the result depends on what the ROOT holds: the
test requires only that the tree itself is served and that every line is a verdict)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import deps, gitmirror, lock
from builder.engines import load_knowledge
from builder.lockfile import Lock
from builder.matrix import load
from tests.helpers import REPO

ROOT_ENV = "BUILDER_GIT_HOST_ROOT"
FIXTURE = REPO / "tests" / "fixtures" / "real-trees"
V0518 = "71de97b264b04dcd514cf904003028aefe9775c8"  # upstream's annotated tag v0.5.18 (tagger: SGLang's release manager)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_git_mirrors")]


@pytest.fixture
def served():
    root = os.environ.get(ROOT_ENV)
    if not root or not (Path(root) / "github.com" / "sgl-project" / "sglang.git").is_dir():
        pytest.skip(f"skipped because no git host of the real trees is set up ({ROOT_ENV}: docs/testing.md)")
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "git-host"), "serve", root, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().split("http://127.0.0.1:")[1].split("/")[0])
        yield root, f"http://127.0.0.1:{port}/github.com/"
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def test_lock_pins_the_cell_and_reads_the_kernels_plan_from_the_real_aot_tree(served, tmp_path, monkeypatch):
    root, mirror = served
    gitmirror.activate((("https://github.com/", mirror),))
    shutil.copy(FIXTURE / "matrix.toml", tmp_path / "matrix.toml")
    monkeypatch.setattr(deps, "PLAN_DIR", tmp_path / "plans")
    (tmp_path / "plans").mkdir()
    deps._plan_doc.cache_clear()
    deps.deps_context.cache_clear()
    m = load(tmp_path / "matrix.toml")
    said: list[str] = []
    fresh = lock.run_lock(m.raw, Lock(tmp_path / "matrix.lock", {}), m.defaults["index"], said.append, load_knowledge())
    packages = fresh.data["packages"]
    assert packages["sglang==0.5.18"]["git"] == {"repository": "https://github.com/sgl-project/sglang",
                                                 "tag": "v0.5.18", "commit": V0518}, said
    assert packages["sglang==0.5.18"]["pins"] == {"sglang-kernel": "0.4.6.post1"}
    assert packages["sglang-kernel==0.4.6.post1"]["git"]["commit"] == V0518
    written = json.loads((tmp_path / "plans" / "sglang-kernel-0.4.6.post1.json").read_text())
    shipped = json.loads((REPO / "builder" / "data" / "fetchplans" / "sglang-kernel-0.4.6.post1.json").read_text())
    assert written == shipped
    assert written["git"] == {"repository": "https://github.com/sgl-project/sglang", "commit": V0518,
                              "subdir": "python/sglang/kernels/aot"}
    assert {s["name"] for s in written["sources"]} == {"repo-cutlass", "repo-fmt", "repo-triton", "repo-flashinfer",
                                                        "repo-flash-attention", "repo-flashmla", "repo-flashmla-cutlass"}
    assert all(s["kind"] == "url" and s["url_hash"].startswith("SHA256=") for s in written["sources"])

    out = subprocess.run([sys.executable, "-m", "builder.cli", "plan", "--matrix", str(FIXTURE / "matrix.toml")],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "UNPINNED" not in out.stdout + out.stderr, out.stdout + out.stderr

    check = subprocess.run([sys.executable, str(REPO / "scripts" / "git-host"), "check", root,
                            str(REPO / "builder" / "data" / "fetchplans" / "sglang-kernel-0.4.6.post1.json")],
                           capture_output=True, text=True)
    verdicts = [line.split()[0] for line in check.stdout.splitlines() if line.startswith("  ")]
    assert len(verdicts) == 8 and set(verdicts) <= {"ok", "MISS"}, check.stdout
    assert check.stdout.splitlines()[1].startswith(f"  ok   (tree): github.com/sgl-project/sglang @ {V0518[:12]}")
    assert check.returncode == (0 if verdicts.count("ok") == 8 else 1)
