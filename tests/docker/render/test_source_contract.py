"""Source contract: the rendered stages of every shipped cell, held against the real source at the pinned version.

The Docker half of tests/unit/render/test_source_contract.py: its docstring says the rest."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder import deps, fetchplan, plan, render
from builder.docker import BuildxCall, stream
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import REPO
from tests.support.source_contract import build_stage, tree_of

pytestmark = pytest.mark.network

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
LOCAL = REPO / "tests" / "fixtures" / "local-engines"
DRIVER = LOCAL / "source_contract.py"


# --------------------------------------------------------------------------- with Docker: up to the compiler


def local_cases() -> dict[str, tuple[str, str]]:
    """name-version → (cell id, package) of the local fixture matrix (the shipped versions on the local base)."""
    m = load(LOCAL / "matrix.toml")
    seen: dict[str, tuple[str, str]] = {}
    for c in select(m, Selection(profiles=("all",))):
        for p in c.packages:
            if p.source.kind == "sdist":
                seen.setdefault(f"{p.name}-{p.version}", (c.id, p.name))
    return dict(sorted(seen.items()))


LOCAL_CASES = local_cases()


def contract_dockerfile(text: str, name: str, configure: bool) -> tuple[str, str]:
    """The rendered Dockerfile, unmodified, plus a stage that repeats build-<name> up to its compile RUN and then
    runs source_contract.py; and the stage that exports its result."""
    body = build_stage(text, name)
    assert body[0] == f"FROM torch AS build-{name}" and "/wheels" in body[-1]
    stage = f"contract-{name}"
    extra = "\n".join([
        "# ---- test only: build-" + name + " as rendered above up to its compile RUN, then the source contract",
        f"FROM torch AS {stage}",
        *body[1:-1],
        f"RUN --mount=type=bind,source={DRIVER.name},target=/usr/local/lib/{DRIVER.name} \\",
        f"    python /usr/local/lib/{DRIVER.name} /out{' --configure' if configure else ''}",
        f"FROM scratch AS {stage}-out",
        f"COPY --from={stage} /out/ /",
    ]) + "\n"
    return text + extra, f"{stage}-out"


@pytest.mark.slow
@pytest.mark.parametrize("cell_id, name", list(LOCAL_CASES.values()), ids=list(LOCAL_CASES))
def test_rendered_stages_run_against_the_real_source_up_to_the_compiler(cell_id, name, local_bases, tmp_path):
    m = load(LOCAL / "matrix.toml")
    (cell,) = [c for c in select(m, Selection(profiles=("all",))) if c.id == cell_id]
    pkg = next(p for p in cell.packages if p.name == name)
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    cmake = (tree_of(pkg) / "CMakeLists.txt").is_file()
    dockerfile_text, target = contract_dockerfile(text, name, configure=cmake)
    context = tmp_path / "context"
    context.mkdir()
    shutil.copy2(DRIVER, context / DRIVER.name)
    (tmp_path / "Dockerfile").write_text(dockerfile_text)
    contexts = []
    d = deps.for_package(pkg)
    if d:  # the fetched sources come from GitHub, unreachable here: empty checkouts stand in for them, with the
        # overrides file the fetch script would write (the configure stops where it first needs their contents)
        empty = tmp_path / "no-deps"
        (empty / "opt" / "rust").mkdir(parents=True)
        sources = deps.with_fetchcontent_overrides(deps.plan_sources(pkg.name, pkg.version),
                                                   tuple(n for n, _ in pkg.recipe.fetch_overrides), cell.id)
        for s in sources:
            (empty / deps.DEPS_DIR.lstrip("/") / s.name / (s.override_subpath or "")).mkdir(parents=True)
        if dict(d["env"]).get("CMAKE_TOOLCHAIN_FILE") == deps.TOOLCHAIN_FILE:
            (empty / deps.TOOLCHAIN_FILE.lstrip("/")).write_text(fetchplan.cmake_overrides_file(sources, deps.DEPS_DIR))
        contexts.append((f"deps-{name}", str(empty)))
    out = tmp_path / "out"
    call = BuildxCall(dockerfile=tmp_path / "Dockerfile", context=context, target=target,
                      build_args=(("MAX_JOBS", "1"), ("NVCC_THREADS", "1")),
                      secrets=(("ca", str(HOST_CA)),) if HOST_CA.is_file() else (),
                      contexts=tuple(contexts), output=f"type=local,dest={out}")
    log = tmp_path / "build.log"
    with log.open("w") as fh:
        stream(call.argv(), fh, lambda line: print(line, flush=True))
    result = json.loads((out / "contract.json").read_text())
    print(json.dumps({k: v for k, v in result.items() if k != "configure"}, indent=2))

    # the build requirements installed (the RUN above succeeded) and pip prepares the pinned version
    meta = result["metadata"]
    assert "error" not in meta, meta.get("error")
    assert canonicalize_name(meta["name"]) == canonicalize_name(pkg.recipe.pypi)
    assert Version(Version(meta["version"]).public) == Version(pkg.version), meta
    # the stage's knobs are what the data says, and they reach the build system
    for var, value in pkg.knobs:
        assert result["env"][var] == value
    if name == "flash-attn":
        (ext,) = result["setup"]["extensions"]
        gencodes = {a for a in ext["nvcc"] if a.startswith("arch=")}
        assert {f"arch=compute_{a},code=sm_{a}" for a in pkg.built_archs} <= gencodes
        if pkg.knobs:  # flash-attn >= 2.7.3: exactly the asked archs
            assert gencodes == {f"arch=compute_{a},code=sm_{a}" for a in pkg.archs}
    if cmake:
        output = result["configure"]["output"]
        print(output[-6000:])
        assert result["configure"]["returncode"] != 0  # it stops where the (empty) fetched sources are needed
        assert "Building CUDA object" not in output and "Building CXX object" not in output
        kit = result["toolkit"]
        if kit["torch_cuda"].split(".")[0] != kit["nvcc"].split(".")[0]:
            # torch 2.4.0 is a CUDA 12.1 build and its CMake config needs nvToolsExt, which CUDA 13 dropped; the
            # local base has only CUDA 13 (no CUDA 12 compiler can be had here), so vLLM's configure stops in
            # find_package(Torch), before its arch list: that check needs a CUDA 12 devel base
            assert "Failed to find nvToolsExt" in output and "Found CUDA: /usr/local/cuda" in output, output[-3000:]
            pytest.skip(f"torch {cell.torch} (CUDA {kit['torch_cuda']}) cannot configure with nvcc {kit['nvcc']}: "
                        "the arch list of this release needs a CUDA 12 base")
        # vLLM's own configure derives its arch list from TORCH_CUDA_ARCH_LIST before it needs any fetched source
        archs = re.findall(r"CUDA target architectures: (\S+)", output)
        assert archs and archs[0] == ";".join(f"{a // 10}.{a % 10}" for a in pkg.archs), output[-3000:]
