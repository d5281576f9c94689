"""Git sources against a local repository with SGLang's layout (GitHub cannot be reached here).

The Docker half of tests/unit/matrix/test_git_source.py: its docstring says the rest."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from builder import plan, render
from builder.docker import BuildxCall, stream
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import REPO
from tests.support import git_source as support
from tests.support.git_source import KERNEL_DIR, VERSION, git

# fixtures shared with the other half, found by pytest under these names
repo = support.repo

LOCAL = REPO / "tests" / "fixtures" / "local-engines" / "matrix.toml"

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# --------------------------------------------------------------------------- Docker: the rendered SGLang stages


def _local_cell(m, root: Path, commit: str, *, setuptools_scm: bool):
    """The SGLang 0.5.23 cell on the local base (engine data and lock as shipped), its source pointed at the local
    repository (inside the toolchain image), without torch and without the Rust toolchain the stand-in does not
    need."""
    (cell,) = select(m, Selection(profiles=("local-sglang",)))
    pkg = next(p for p in cell.packages if p.name == "sglang")
    recipe = dataclasses.replace(pkg.recipe, rust_toolchain="", setuptools_scm=setuptools_scm)
    source = dataclasses.replace(pkg.source, repository=f"file:///srv/{root.name}", commit=commit)
    pkg = dataclasses.replace(pkg, recipe=recipe, source=source)
    return dataclasses.replace(cell, torch="", packages=(pkg,))


@pytest.fixture(scope="module", autouse=True)
def _remove_the_toolchain_images():
    """The toolchain images _build tags (named by the Dockerfile's hash: a template change makes new ones) go with
    the module: left behind, every change of the templates kept another 1.8 GB pair in the daemon."""
    yield
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "builder-test/toolchain-with-repo"],
                         capture_output=True, text=True).stdout.split()
    if out:
        subprocess.run(["docker", "rmi", "-f", *out], capture_output=True)


def _build(tmp: Path, text: str, root: Path, local_bases, target: str, out: Path | None) -> tuple[int, str]:
    context = tmp / "context"
    context.mkdir(exist_ok=True)
    dockerfile = tmp / "Dockerfile"
    dockerfile.write_text(text)
    secrets = (("ca", str(HOST_CA)),) if HOST_CA.is_file() else ()
    base = (("BASE_DEVEL_IMAGE", local_bases["cuda_devel"]), ("BASE_RUNTIME_IMAGE", local_bases["cuda_base"]))
    # 1. the rendered toolchain stage as an image; 2. it plus the repository at /srv; 3. that image stands in for
    # the toolchain stage of the same Dockerfile, so the rendered source stage fetches from the repository
    tag = f"builder-test/toolchain-with-repo:{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    log = (tmp / "build.log").open("a")
    echo = lambda line: print(line, flush=True)  # noqa: E731
    stream(BuildxCall(dockerfile=dockerfile, context=context, target="toolchain", build_args=base, secrets=secrets,
                      tags=(f"{tag}-base",), load=True).argv(), log, echo)
    repo_ctx = tmp / "repo-context"
    if not repo_ctx.exists():
        repo_ctx.mkdir()
        shutil.copytree(root, repo_ctx / root.name, symlinks=True)
    (tmp / "Dockerfile.repo").write_text(f"FROM {tag}-base AS repo\nCOPY {root.name} /srv/{root.name}\n")
    stream(BuildxCall(dockerfile=tmp / "Dockerfile.repo", context=repo_ctx, target="repo", tags=(tag,), load=True)
           .argv(), log, echo)
    call = BuildxCall(dockerfile=dockerfile, context=context, target=target, build_args=base, secrets=secrets,
                      contexts=(("toolchain", f"docker-image://{tag}"),), output=f"type=local,dest={out}" if out else None)
    proc = subprocess.run(call.argv(), capture_output=True, text=True)
    log.write(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_rendered_sglang_stages_build_the_pinned_version_from_a_setuptools_scm_checkout(
        repo, local_bases, tmp_path):
    root, commit = repo
    m = load(LOCAL)
    cell = _local_cell(m, root, commit, setuptools_scm=True)
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    assert f'ENV SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SGLANG="{VERSION}"' in text
    assert "WORKDIR /src/python" in text
    out = tmp_path / "out"
    code, output = _build(tmp_path, text, root, local_bases, "wheels-sglang", out)
    assert code == 0, output[-4000:]
    (wheel,) = sorted(out.glob("*.whl"))
    assert wheel.name == f"sglang-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        assert f"__version__ = version = '{VERSION}'" in z.read("sglang/_version.py").decode()


def test_without_the_pretended_version_the_wheel_check_stops_a_dev_version_build(repo, local_bases, tmp_path):
    """What issue 7 found: a depth-1 fetch of the commit has no tag, so setuptools-scm makes a dev version
    (0.1.devN+g<commit> from the git metadata here; its fallback_version 0.0.0.dev0 without any) — the build
    stage's wheel check refuses it instead of handing the runtime a wheel that sglang==0.5.23 rejects."""
    root, commit = repo
    m = load(LOCAL)
    cell = _local_cell(m, root, commit, setuptools_scm=False)
    text = render.render(plan.plan_cells([cell], None)[0], m.defaults["index"])
    assert "SETUPTOOLS_SCM_PRETEND_VERSION" not in text
    code, output = _build(tmp_path, text, root, local_bases, "wheels-sglang", tmp_path / "out")
    assert code != 0
    built = re.search(rf"AssertionError: built sglang (\S+), the lock pins sglang {re.escape(VERSION)}", output)
    assert built, output[-3000:]
    assert Version(built.group(1)).is_devrelease and Version(built.group(1)) != Version(VERSION)


# --------------------------------------------------------------------------- the kernel tree's own version


def _kernel_cell(m, root: Path, commit: str, subdir: str = ""):
    """The SGLang 0.5.23 cell, its sglang-kernel 0.4.10's git source pointed at the local repository (and at another
    directory of it than the engine data's, when `subdir` is given)."""
    (cell,) = select(m, Selection(profiles=("local-sglang",)))
    packages = tuple(dataclasses.replace(p, source=dataclasses.replace(p.source, repository=f"file:///srv/{root.name}",
                                                                       commit=commit, subdir=subdir or p.source.subdir))
                     if p.name == "sglang-kernel" else p for p in cell.packages)
    return dataclasses.replace(cell, packages=packages)


def test_the_source_stage_holds_the_kernel_trees_version_to_the_pinned_one(repo, local_bases, tmp_path):
    """sglang-kernel is released from SGLang's repository: the tag names an SGLang release, and the kernel version
    its tree carries is whatever python/sglang/kernels/aot/pyproject.toml said then. The rendered source stage reads
    it at the pinned commit: the release's tree passes; a commit whose tree is another kernel version (here the next
    bump, 0.4.11) stops the build in the source stage, before any dependency is fetched or anything compiles, naming
    both versions and the file; and a directory the tree does not have (sgl-kernel/, where the engine data pointed
    before the kernel moved) stops it saying "no such file", naming the path, not that the file names no version."""
    root, commit = repo
    m = load(LOCAL)
    text = render.render(plan.plan_cells([_kernel_cell(m, root, commit)], None)[0], m.defaults["index"])
    assert f"{KERNEL_DIR}/pyproject.toml names the version" in text and f"WORKDIR /src/{KERNEL_DIR}" in text
    code, output = _build(tmp_path, text, root, local_bases, "src-sglang-kernel", None)
    assert code == 0, output[-3000:]
    assert f"{KERNEL_DIR}/pyproject.toml: sglang-kernel 0.4.10, as pinned" in output, output[-3000:]

    text = render.render(plan.plan_cells([_kernel_cell(m, root, commit, subdir="sgl-kernel")], None)[0],
                         m.defaults["index"])
    code, output = _build(tmp_path, text, root, local_bases, "src-sglang-kernel", None)
    assert code != 0
    # what the check printed (BuildKit's "#<step> <seconds> " prefix), not the RUN line it echoes
    said = [line.split(" ", 2)[2] for line in output.splitlines() if re.match(r"#\d+ \d+\.\d+ ", line)]
    assert f"no such file: sgl-kernel/pyproject.toml at {commit}: the engine data source_subdir / source_version " \
           "name a path this tree does not have" in said, output[-3000:]
    assert not [line for line in said if "names no [project] version" in line]

    bumped = tmp_path / "bumped" / root.name
    shutil.copytree(root, bumped, symlinks=True)
    kernel = bumped / KERNEL_DIR / "pyproject.toml"
    kernel.write_text(kernel.read_text().replace('version = "0.4.10"', 'version = "0.4.11"'))
    git("commit", "-q", "-am", "bump sgl-kernel to 0.4.11", cwd=bumped)
    other = git("rev-parse", "HEAD", cwd=bumped)
    text = render.render(plan.plan_cells([_kernel_cell(m, bumped, other)], None)[0], m.defaults["index"])
    code, output = _build(tmp_path / "bumped", text, bumped, local_bases, "src-sglang-kernel", None)
    assert code != 0
    assert (f"the source tree at {other} is sglang-kernel 0.4.11 ({KERNEL_DIR}/pyproject.toml), the lock pins "
            "sglang-kernel 0.4.10: this commit did not release it") in output, output[-3000:]
