"""Source contract: the rendered stages of every shipped cell, held against the real source at the pinned version.

Issue 7 found that no engine cell would get through a real build (a requirements file vLLM 0.33.0 no longer has,
a version check setuptools-scm sources can never pass, a missing FlashInfer) because no test ran a template
against the source it builds. These tests do, for every package version the index serves as an sdist (vLLM
0.33.0, 0.6.3.post1, 0.5.5, flash-attn 2.8.3 and 2.6.3, SGLang 0.3.2), with the sdists the lock pins
(downloaded once, sha256-checked, cached like `builder lock` caches them):

- without Docker (network): every file a build stage reads is in the source, its build requirements parse and
  pin no other torch, the source builds the pinned name and version, every arch knob and build switch the stage
  sets is read by the build system (or by the subproject or library named here), and the engine facts behind
  the data (FA4's import rewrite, the Rust frontend switch, the V2 model runner) are still what the data says;
- with Docker on the local CUDA 13 base (slow: torch installs): the rendered source stage and build stage up to
  its compile RUN, then tests/fixtures/local-engines/source_contract.py in that stage: the build requirements
  install, pip prepares the pinned version from the source, and vLLM's own configure prints the arch list.

Git sources (SGLang >= 0.5.11, sglang-kernel, FlashInfer 0.1.6) cannot be reached here: tests/docker/matrix/test_git_source.py
runs the same stages against a local repository with SGLang's layout; the real check needs the git host.
"""

from __future__ import annotations

import email.parser
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.lock import _download
from builder.pypi import SimpleIndex

from tests.helpers import env_of
from tests.support.source_contract import build_stage, shipped, tree_of

pytestmark = pytest.mark.network


def sdist_cases() -> list[tuple[str, str]]:
    """(cell id, package) for the first cell that compiles each sdist package version."""
    _, _, cells = shipped()
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for c in cells:
        for p in c.packages:
            if p.source.kind == "sdist":
                seen.setdefault((p.name, p.version), (c.id, p.name))
    return sorted(seen.values(), key=lambda t: t[1])


CASES = sdist_cases()
IDS = [f"{pkg}-{next(p.version for c in shipped()[2] if c.id == cid for p in c.packages if p.name == pkg)}"
       for cid, pkg in CASES]


def cell_and_package(cell_id: str, name: str):
    _, texts, cells = shipped()
    cell = next(c for c in cells if c.id == cell_id)
    return cell, next(p for p in cell.packages if p.name == name), texts[cell_id]


def build_files(tree: Path) -> dict[str, str]:
    """setup.py and every CMake file of a source tree: what its build system reads."""
    files = [tree / "setup.py", tree / "CMakeLists.txt", *sorted((tree / "cmake").rglob("*.cmake"))]
    return {str(f.relative_to(tree)): f.read_text(errors="replace") for f in files if f.is_file()}


# --------------------------------------------------------------------------- without Docker


@pytest.mark.pure
@pytest.mark.parametrize("cell_id, name", CASES, ids=IDS)
def test_every_file_the_build_stage_reads_is_in_the_source(cell_id, name):
    cell, pkg, text = cell_and_package(cell_id, name)
    tree = tree_of(pkg)
    stage = "\n".join(build_stage(text, name))
    workdir = re.search(r"^WORKDIR /src/?(\S*)$", stage, re.M).group(1)
    root = tree / workdir if workdir else tree
    read = re.findall(r"sed -E '/\^\\s\*\(#\|\$\|-\)/d' (\S+) >>", stage)  # requirements files
    read += dict.fromkeys(re.findall(r"grep -qF -- '[^']*' (\S+)", stage))  # files a patch edits (checks twice)
    assert read == list(pkg.recipe.build_requirements) + [p["file"] for p in pkg.recipe.patches_for(cell.torch)]
    missing = [f for f in read if not (root / f).is_file()]
    assert not missing, f"{pkg.name} {pkg.version}: the build stage reads {missing}, which its sdist does not have"
    for patch in pkg.recipe.patches_for(cell.torch):
        assert patch["replace"] in (root / patch["file"]).read_text(), f"{patch['file']}: no {patch['replace']!r}"
    assert (root / "setup.py").is_file() or (root / "pyproject.toml").is_file()


@pytest.mark.pure
@pytest.mark.parametrize("cell_id, name", CASES, ids=IDS)
def test_build_requirements_parse_and_pin_no_other_torch(cell_id, name):
    cell, pkg, _ = cell_and_package(cell_id, name)
    tree = tree_of(pkg)
    reqs: list[str] = []
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        reqs += tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", [])
    for f in pkg.recipe.build_requirements:
        reqs += [ln.strip() for ln in (tree / f).read_text().splitlines()
                 if ln.strip() and not ln.strip().startswith(("#", "-"))]
    parsed = [Requirement(r) for r in reqs + list(pkg.recipe.build_requirements_list)]
    torch_pins = {str(r.specifier) for r in parsed if canonicalize_name(r.name) == "torch" and r.specifier}
    # the stage drops these lines and builds against the image's torch: they must agree with it
    for spec in torch_pins:
        assert Version(cell.torch) in Requirement(f"torch{spec}").specifier, (pkg.name, spec, cell.torch)


@pytest.mark.pure
@pytest.mark.parametrize("cell_id, name", CASES, ids=IDS)
def test_the_source_is_the_pinned_name_and_version(cell_id, name):
    """The wheel check at the end of the build stage compares with these; an sdist carries them in PKG-INFO."""
    _, pkg, text = cell_and_package(cell_id, name)
    info = email.parser.Parser().parsestr((tree_of(pkg) / "PKG-INFO").read_text())
    assert canonicalize_name(info["Name"]) == canonicalize_name(pkg.recipe.pypi)
    assert Version(info["Version"]) == Version(pkg.version)
    last = build_stage(text, name)[-1]
    assert f'canonicalize_name("{pkg.recipe.pypi}")' in last and f'Version("{pkg.version}")' in last


# Knobs a build stage sets that the package's own build files need not read, who reads them, what in the package's
# build files shows it uses that reader, and whether the package's own build files must NOT read the knob.
READ_ELSEWHERE = {
    # torch's cpp_extension (setup.py extensions) and its CMake config (find_package(Torch)) turn it into -gencode
    "TORCH_CUDA_ARCH_LIST": ("torch", re.compile(r"find_package\(Torch|torch\.utils\.cpp_extension"), False),
    # vLLM's own CMake never reads it; the vllm-flash-attn subproject vLLM 0.6.2-0.6.x builds does, at the commit
    # those releases pin (CMakeLists.txt reads ENV{VLLM_FA_CMAKE_GPU_ARCHES} in a parent build: checked in a mirror
    # of vllm-project/flash-attention, which cannot be fetched here)
    "VLLM_FA_CMAKE_GPU_ARCHES": ("vllm-flash-attn", re.compile(r"vllm-project/flash-attention\.git"), True),
}


@pytest.mark.pure
@pytest.mark.parametrize("cell_id, name", CASES, ids=IDS)
def test_every_switch_the_stage_sets_is_read_by_the_build(cell_id, name):
    _, pkg, text = cell_and_package(cell_id, name)
    files = build_files(tree_of(pkg))
    env = env_of(build_stage(text, name))
    if not pkg.recipe.compiled:
        assert env == {}, f"{pkg.name} builds no device code, yet its stage sets {env}"
        return
    assert files, "no setup.py or CMake files"
    for var in env:
        if var in READ_ELSEWHERE:
            who, used, not_own = READ_ELSEWHERE[var]
            if not_own:
                assert not any(var in t for t in files.values()), f"{pkg.name} {pkg.version} reads {var} itself now"
            assert any(used.search(t) for t in files.values()), f"{pkg.name} {pkg.version} does not use {who}"
        elif var.startswith(("SETUPTOOLS_SCM_", "CMAKE_")) or var == "NVCC_APPEND_FLAGS":
            continue  # read by setuptools-scm / CMake / nvcc themselves
        else:  # a build switch of the data, or a fetch-plan override: the package's build files read it
            assert any(var in t for t in files.values()), f"{pkg.name} {pkg.version}: nothing reads {var}"


# --------------------------------------------------------------------------- engine facts behind the data (vLLM 0.33.0)


def _vllm(version: str):
    cell_id, name = next((c, n) for c, n in CASES if n == "vllm" and cell_and_package(c, n)[1].version == version)
    cell, pkg, text = cell_and_package(cell_id, name)
    return cell, pkg, text, tree_of(pkg)


@pytest.mark.pure
def test_vllm_0_33_rust_frontend_is_required_not_optional():
    """setup.py builds vllm-rs with optional=not VLLM_REQUIRE_RUST_FRONTEND: the stage sets it, so a cargo
    failure fails the build instead of dropping the frontend."""
    _, _, text, tree = _vllm("0.33.0")
    setup = (tree / "setup.py").read_text()
    assert 'os.getenv("VLLM_REQUIRE_RUST_FRONTEND", "")' in setup
    assert "optional=not should_require_rust_frontend()" in setup
    assert env_of(build_stage(text, "vllm"))["VLLM_REQUIRE_RUST_FRONTEND"] == "1"


def _fa_project(root: Path) -> Path:
    """A stand-in vllm-flash-attn checkout: no CMake targets, one FA4 cute module importing its own package."""
    fa = root / "fa"
    (fa / "flash_attn" / "cute").mkdir(parents=True)
    (fa / "vllm_flash_attn").mkdir()
    (fa / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.21)\nproject(fa NONE)\n")
    (fa / "flash_attn" / "cute" / "interface.py").write_text("from flash_attn.cute.utils import x\n")
    return fa


def _install_fa4(tree: Path, root: Path, fa: Path, *, cmake_args: list[str], env: dict) -> Path:
    """vLLM's own cmake/external_projects/vllm_flash_attn.cmake, configured and its FA4 component installed."""
    project = root / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(contract NONE)\ninclude(FetchContent)\n"
        f'include("{tree}/cmake/external_projects/vllm_flash_attn.cmake")\n')
    build, prefix = root / "build", root / "prefix"
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root)}
    for argv in (["cmake", "-S", str(project), "-B", str(build), "-DFETCHCONTENT_FULLY_DISCONNECTED=ON", *cmake_args],
                 ["cmake", "--install", str(build), "--component", "_vllm_fa4_cutedsl_C", "--prefix", str(prefix)]):
        proc = subprocess.run(argv, capture_output=True, text=True, env={**base, **env})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return prefix / "vllm" / "vllm_flash_attn" / "cute"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake on this host")
def test_vllm_0_33_fa4_imports_are_rewritten_with_the_override_the_stage_uses(tmp_path):
    """With VLLM_FLASH_ATTN_SRC_DIR vLLM's CMake symlinks FA4's cute/ unrewritten (its imports say flash_attn.cute,
    which the wheel does not have); CMake's FETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN, what the build stage sets, keeps
    the download branch that rewrites them to vllm.vllm_flash_attn.cute."""
    cell, pkg, text, tree = _vllm("0.33.0")
    env = env_of(build_stage(text, "vllm"))
    assert "VLLM_FLASH_ATTN_SRC_DIR" not in env
    flags = [f for f in shlex.split(env["CMAKE_ARGS"]) if "FLASH-ATTN" in f]
    assert flags == ["-DFETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN=/opt/deps/vllm-flash-attn"]

    good = tmp_path / "override"
    fa = _fa_project(good)
    cute = _install_fa4(tree, good, fa, cmake_args=[flags[0].replace("/opt/deps/vllm-flash-attn", str(fa))], env={})
    installed = cute / "interface.py"
    assert not cute.is_symlink() and installed.is_file()
    assert installed.read_text() == "from vllm.vllm_flash_attn.cute.utils import x\n"

    bad = tmp_path / "src-dir"
    fa = _fa_project(bad)
    cute = _install_fa4(tree, bad, fa, cmake_args=[], env={"VLLM_FLASH_ATTN_SRC_DIR": str(fa)})
    assert cute.is_symlink() and (cute / "interface.py").read_text() == "from flash_attn.cute.utils import x\n"


@pytest.mark.pure
def test_vllm_dflash2_runs_on_the_v2_model_runner_or_not_at_all():
    """VLLM_USE_V2_MODEL_RUNNER is read before any fallback to V1; the warning a fallback logs is what the boot
    smoke refuses (engine data: strategy env / forbid_log)."""
    cell, pkg, _, tree = _vllm("0.33.0")
    config = (tree / "vllm" / "config" / "vllm.py").read_text()
    prop = config[config.index("def use_v2_model_runner(self)"):]
    prop = prop[:prop.index("\n    def ", 10)]
    assert prop.index("envs.VLLM_USE_V2_MODEL_RUNNER\n") < prop.index("_get_v2_model_runner_unsupported_features()")
    s = pkg.recipe.strategy("DFlash2")
    assert dict(s.env) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert all(line in config for line in s.forbid_log)
    assert '"DFlash2DraftModel"' in (tree / "vllm" / "model_executor" / "models" / "registry.py").read_text()


@pytest.mark.pure
def test_vllm_0_33_has_flashinfer_needs_nvcc_or_the_cubin_package():
    """The runtime check the data adds (has_flashinfer) tests what vllm/utils/flashinfer.py says it tests."""
    cell, pkg, text, tree = _vllm("0.33.0")
    src = (tree / "vllm" / "utils" / "flashinfer.py").read_text()
    body = src[src.index("def has_flashinfer() -> bool:"):src.index("def _installed_version")]
    assert "has_flashinfer_cubin()" in body and "_flashinfer_nvcc_path() is None" in body and '"ninja"' in body
    assert 'os.environ.get("CUDA_HOME")' in src
    assert cell.runtime_jit and "ENV CUDA_HOME=/opt/cuda-jit" in text.split("AS runtime", 1)[1]


# --------------------------------------------------------------------------- engine facts behind the data (SGLang 0.3.2)


@pytest.mark.pure
def test_sglang_0_3_serves_with_flashinfer_and_its_srt_extra():
    cell_id, name = next((c, n) for c, n in CASES if n == "sglang")
    cell, pkg, text = cell_and_package(cell_id, name)
    tree = tree_of(pkg)
    server = (tree / "sglang" / "srt" / "server.py").read_text()
    assert 'assert_pkg_version(\n            "flashinfer",\n            "0.1.6"' in server
    attention = (tree / "sglang" / "srt" / "layers" / "attention_backend.py").read_text()
    assert "    from flashinfer import (" in attention  # module level, under `if not is_hip()`
    # the cell compiles FlashInfer at that version, installs the srt extra, and checks the modules serving imports
    assert any(p.name == "flashinfer" and p.version == "0.1.6" for p in cell.packages)
    runtime = text.split("AS runtime", 1)[1]
    assert '"$(echo /wheels/sglang-[0-9]*.whl)[srt]"' in runtime
    import tomllib

    srt = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["optional-dependencies"]["srt"]
    assert "vllm==0.5.5" in srt
    imports = {canonicalize_name(Requirement(r).name) for r in srt}
    for module in pkg.recipe.serve_modules:
        assert module == "flashinfer" or canonicalize_name(module) in imports or module == "zmq", module
    assert "flashinfer" in pkg.recipe.serve_modules and '"flashinfer"' in runtime


# --------------------------------------------------------------------------- the requirements layout across releases


# Which file holds vLLM's build requirements, by release: what the engine data encodes, read from the sdists.
LAYOUT = {
    "0.5.5": (), "0.6.1.post2": (), "0.6.2": ("requirements-build.txt",), "0.7.3": ("requirements-build.txt",),
    "0.8.0": ("requirements/build.txt",), "0.19.1": ("requirements/build.txt",),
    "0.20.0": ("requirements/build/cuda.txt",), "0.23.0": ("requirements/build/cuda.txt",),
    "0.24.0": ("requirements/build/cuda.txt", "requirements/build/rust.txt"),
    "0.33.0": ("requirements/build/cuda.txt", "requirements/build/rust.txt"),
}


@pytest.mark.slow
@pytest.mark.parametrize("version", list(LAYOUT))
def test_vllm_build_requirement_files_by_release(version):
    """The engine data names, per release, the requirements files that release's sdist has (about 10 sdists)."""
    from builder.engines import recipe

    index = SimpleIndex(shipped()[0].defaults["index"])
    sd = index.sdist("vllm", version)
    path = _download(index, sd.url, sd.sha256, sd.filename)
    with tarfile.open(path) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    data = recipe("vllm", version).build_requirements
    assert data == LAYOUT[version]
    assert all(f in names for f in data), sorted(n for n in names if n.startswith("requirements"))
    others = {"requirements-build.txt", "requirements/build.txt", "requirements/build/cuda.txt"} - set(data)
    assert not others & names, f"vllm {version} also has {sorted(others & names)}: the data picked the wrong one"


# --------------------------------------------------------------------------- sglang-kernel: what it really builds


@pytest.mark.slow
def test_sglang_kernel_data_says_what_the_published_0_4_10_wheel_holds(tmp_path):
    """The CMakeLists at the pinned tag cannot be read here, but the x86_64 wheel PyPI serves was built from it
    with the cu130 cell's toolchain (nvcc 13.0.88, torch 2.14.1): the union of SASS over its .so files is what the
    engine data says a CUDA 13 build with ENABLE_BELOW_SM90 makes, and the library every GPU but sm_90 loads
    (sm100/common_ops, sgl_kernel/load_utils.py) holds sm_80: nothing may drop it. ~370 MB download, 1.5 GB unpacked."""
    import zipfile

    from builder.audit import read_fatbin_entries
    from builder.engines import recipe

    index = SimpleIndex(shipped()[0].defaults["index"])
    (f,) = [f for f in index.files("sglang-kernel")
            if f.filename == "sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl"]
    wheel = _download(index, f.url, f.sha256, f.filename)
    sass: dict[str, set[str]] = {}
    with zipfile.ZipFile(wheel) as z:
        assert "torch==2.14.1" in z.read("sglang_kernel-0.4.10.dist-info/METADATA").decode()
        loader = z.read("sgl_kernel/load_utils.py").decode()
        for name in (n for n in z.namelist() if n.endswith(".so")):
            path = Path(z.extract(name, tmp_path))
            sass[name] = {e.name for e in read_fatbin_entries(path) if e.kind == "sass"}
            path.unlink()
    for name, found in sorted(sass.items()):
        print(f"{name}: {', '.join(sorted(found))}")
    union = set().union(*sass.values())
    # what upstream's build makes (engine data `binaries`, per file in tests/unit/matrix/test_sglang_kernel_wheel.py); a build
    # for 80,90 keeps a subset of it through the gencode filter
    upstream = {s for b in recipe("sglang-kernel", "0.4.10").binaries for s in b.sass}
    assert union == upstream
    assert set(recipe("sglang-kernel", "0.4.10").built_sass((80, 90), "13.0.3")) < union
    # sm_90 loads sm90/, every other GPU sm100/ — both are built, and the sm_80 code lives in both
    assert 'if compute_capability == 90:\n        ops_subdir = "sm90"' in loader and 'ops_subdir = "sm100"' in loader
    assert {"sm_80", "sm_90"} <= sass["sgl_kernel/sm100/common_ops.abi3.so"]
    assert {"sm_80", "sm_90"} <= sass["sgl_kernel/sm90/common_ops.abi3.so"]
