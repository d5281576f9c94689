"""Git mirrors inside a real BuildKit build: a RUN that fetches the upstream URL through `with-ca` (the script every
rendered Dockerfile installs) reaches the mirror named in secret "gitmirrors", a git daemon on 127.0.0.1; a second
build through another mirror is a cache hit (the mirror is no part of the layer's key), and neither the image's
history nor its layers hold the mirror."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from builder import docker, gitmirror
from tests.helpers import git_daemon

GH = "https://github.com/"
UPSTREAM = "https://github.com/acme/widget"  # unreachable here: only the mirror answers

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("no_git_mirrors")
BASE = "debian:bookworm-slim"




@pytest.fixture
def served(tmp_path):
    with git_daemon(tmp_path) as info:
        yield info


def test_a_build_fetches_through_the_mirror_secret_and_keeps_it_out_of_the_image(served, local_bases, tmp_path):
    # the local CUDA devel base has git (it was an image another test left behind, found by name, else a skip)
    base = local_bases["cuda_devel"]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "dockerfiles"))
    with_ca = env.get_template("macros.j2").module.with_ca_script()
    (tmp_path / "ctx").mkdir()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"FROM {base}\n{with_ca}\n"
                          "RUN --mount=type=secret,id=ca --mount=type=secret,id=gitmirrors \\\n"
                          f"    with-ca git ls-remote {UPSTREAM}.git refs/tags/v1.0^{{}} > /ls-remote.txt \\\n"
                          # the commit is the identity: a fresh repository (a new commit) is a fresh layer key
                          f" && grep -q {served['commit']} /ls-remote.txt\n")
    tag = "builder-test/git-mirror:probe"

    def build(mirror: str) -> str:
        gitmirror.activate(((GH, mirror),))
        call = docker.BuildxCall(dockerfile=dockerfile, context=tmp_path / "ctx", target="", tags=(tag,), load=True,
                                 secret_envs=((gitmirror.SECRET_ID, gitmirror.SECRET_ENV),), extra=("--network", "host"))
        argv = [a for a in call.argv() if a not in ("--target", "")]
        assert not any("127.0.0.1" in a for a in argv)
        proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    port = served["port"]
    build(f"git://127.0.0.1:{port}/github/")
    got = subprocess.run(["docker", "run", "--rm", tag, "cat", "/ls-remote.txt"], capture_output=True, text=True,
                         check=True).stdout
    assert got.split()[0] == served["commit"]  # resolved by the mirror: the upstream host is unreachable here
    log = build(f"git://localhost:{port}/github/")  # another mirror of the same repository
    step = next(line.split()[0] for line in log.splitlines() if "git ls-remote" in line and line.startswith("#"))
    assert f"{step} CACHED" in log, log[-3000:]  # the fetch's layer is a cache hit: the mirror is no part of its key
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag],
                             capture_output=True, text=True, check=True).stdout
    inspect = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True, check=True).stdout
    saved = subprocess.run(["docker", "run", "--rm", tag, "sh", "-c", "grep -rl 127.0.0.1: / --exclude-dir=proc "
                            "--exclude-dir=sys --exclude-dir=dev 2>/dev/null | grep -v ^/etc/hosts || true"],
                           capture_output=True, text=True).stdout
    for text in (history, inspect, saved):
        assert f":{port}/github" not in text and "insteadOf" not in text
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


# --------------------------------------------------------------------------- a cell's stages through two mirrors


def _repo(path: Path, files: dict[str, str], tag: str = "") -> str:
    from tests.support.git_source import git

    path.mkdir(parents=True)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git("init", "-q", "-b", "main", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "-q", "-m", "one", cwd=path)
    if tag:
        git("tag", "-a", tag, "-m", tag, cwd=path)
    return git("rev-parse", "HEAD", cwd=path)


def test_one_cell_through_two_mirrors_gives_one_wheel_and_its_deps_stage_fetches_archives_by_hash(
        local_bases, tmp_path, monkeypatch):
    """The SGLang cell's stages with every git source upstream (https://github.com/..., unreachable here) and two
    mirrors of one scripts/git-host on 127.0.0.1 (two URLs, as two mirrors of a team would be): `lock` pins the tag
    and reads sglang-kernel's fetch plan through the first; the rendered Dockerfile and the cache keys are the same
    under either; the sglang wheel built through each is one wheel, byte for byte; the deps stage downloads the
    kernel's CUTLASS archive through the second by its URL_HASH (GitHub's archive bytes, made by the git host) and
    fetches fmt by commit. The build reaches a loopback mirror only with the host's network (common_build_args)."""
    import dataclasses
    import hashlib

    from builder import deps, lock, plan, render
    from builder.matrix import Selection, load
    from builder.resolve import select
    from tests.helpers import git_host
    from tests.support import git_source as support

    # a fresh commit per run: every fetch below is a fresh layer, not a cache hit of an earlier run
    cutlass_commit = _repo(tmp_path / "cutlass", {"include/cutlass/cutlass.h": f"#define CUTLASS {os.urandom(8).hex()}\n"})
    fmt_commit = _repo(tmp_path / "fmt", {"include/fmt/core.h": "#define FMT 1\n"})
    tar = subprocess.run(["git", "archive", "--format=tar", f"--prefix=cutlass-{cutlass_commit}/", cutlass_commit],
                         cwd=tmp_path / "cutlass", capture_output=True, check=True).stdout
    cutlass_sha = hashlib.sha256(subprocess.run(["gzip", "-n"], input=tar, capture_output=True, check=True).stdout).hexdigest()
    cmake = support.KERNEL_CMAKE.format(sha=cutlass_sha).replace(
        "https://example.invalid/cutlass-4.2.1.tar.gz", f"https://github.com/NVIDIA/cutlass/archive/{cutlass_commit}.tar.gz")
    flashmla = support.KERNEL_CMAKE_FLASHMLA.replace("553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28", fmt_commit)
    kernel = support.KERNEL_DIR
    with git_host(tmp_path / "h") as host:
        script = ROOT / "scripts" / "git-host"
        for upstream, path in (("https://github.com/NVIDIA/cutlass", "cutlass"), ("https://github.com/fmtlib/fmt", "fmt")):
            subprocess.run([sys.executable, str(script), "add", str(host["root"]), upstream, str(tmp_path / path)],
                           check=True, capture_output=True)
        _repo(tmp_path / "sglang", {"python/pyproject.toml": support.PYPROJECT,
                                    "python/sglang/__init__.py": "__version__ = '0'\n",
                                    f"{kernel}/CMakeLists.txt": cmake, f"{kernel}/cmake/utils.cmake": support.KERNEL_CMAKE_UTILS,
                                    f"{kernel}/cmake/flashmla.cmake": flashmla,
                                    f"{kernel}/pyproject.toml": support.KERNEL_PYPROJECT}, tag=f"v{support.VERSION}")
        subprocess.run([sys.executable, str(script), "add", str(host["root"]), "https://github.com/sgl-project/sglang",
                        str(tmp_path / "sglang")], check=True, capture_output=True)
        port = host["port"]
        mirrors = [f"http://127.0.0.1:{port}/github.com/", f"http://localhost:{port}/github.com/"]

        gitmirror.activate(((GH, mirrors[0]),))
        commit, why = lock.resolve_git_commit("https://github.com/sgl-project/sglang", f"v{support.VERSION}")
        assert commit and not why, why
        monkeypatch.setattr(deps, "PLAN_DIR", tmp_path / "plans")
        (tmp_path / "plans").mkdir()
        deps._plan_doc.cache_clear()
        deps.deps_context.cache_clear()
        git_entry = {"repository": "https://github.com/sgl-project/sglang", "tag": f"v{support.VERSION}", "commit": commit}
        said: list[str] = []
        assert lock.refresh_fetch_plan_git("sglang-kernel", "0.4.10", git_entry, kernel, said.append), said

        m = load(ROOT / "tests" / "fixtures" / "local-engines" / "matrix.toml")
        (cell,) = select(m, Selection(profiles=("local-sglang",)))
        packages = []
        for p in cell.packages:
            recipe = dataclasses.replace(p.recipe, rust_toolchain="") if p.name == "sglang" else p.recipe
            packages.append(dataclasses.replace(p, recipe=recipe, source=dataclasses.replace(
                p.source, repository="https://github.com/sgl-project/sglang", commit=commit)))
        cell = dataclasses.replace(cell, torch="", packages=tuple(packages))

        def rendered() -> tuple[str, tuple]:
            (p,) = plan.plan_cells([cell], None)
            return render.render(p, m.defaults["index"]), tuple(w.key for w in p.wheels)

        texts = []
        for mirror in mirrors:
            gitmirror.activate(((GH, mirror),))
            texts.append(rendered())
        assert texts[0] == texts[1]  # one Dockerfile, one key per package: the mirror is no input
        text = texts[0][0]
        assert str(port) not in text and "localhost" not in text
        assert f"https://github.com/NVIDIA/cutlass/archive/{cutlass_commit}.tar.gz" in text

        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text(text)
        (tmp_path / "ctx").mkdir()
        base = (("BASE_DEVEL_IMAGE", local_bases["cuda_devel"]), ("BASE_RUNTIME_IMAGE", local_bases["cuda_base"]),
                ("SOURCE_DATE_EPOCH", "1700000000"))
        ca = Path("/etc/ssl/certs/ca-certificates.crt")

        def build(mirror: str, target: str, out: Path | None, *, fresh: bool = False) -> str:
            from types import SimpleNamespace

            from builder.steps import common_build_args

            gitmirror.activate(((GH, mirror),))
            ctx = SimpleNamespace(opts=SimpleNamespace(source_date_epoch="", ca_bundle=None, no_cache=False, builder=None,
                                                       layer_cache=None),
                                  cell=SimpleNamespace(packages=(), id="c"), dockerfile=dockerfile, context_dir=tmp_path / "ctx")
            extra = common_build_args(ctx)["extra"] + (("--no-cache",) if fresh else ())
            assert "--network" in extra  # a loopback mirror: the build takes the host's network
            call = docker.BuildxCall(dockerfile=dockerfile, context=tmp_path / "ctx", target=target, build_args=base,
                                     secrets=(("ca", str(ca)),) if ca.is_file() else (),
                                     secret_envs=((gitmirror.SECRET_ID, gitmirror.SECRET_ENV),), extra=extra,
                                     output=f"type=local,dest={out}" if out else None)
            proc = subprocess.run(call.argv(), capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-4000:]
            return proc.stderr

        wheels = []
        for n, mirror in enumerate(mirrors):
            out = tmp_path / f"out{n}"
            build(mirror, "wheels-sglang", out, fresh=n == 1)  # the second from nothing, through the other mirror
            (wheel,) = sorted(out.glob("*.whl"))
            wheels.append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
        assert wheels[0] == wheels[1] and wheels[0][0] == f"sglang-{support.VERSION}-py3-none-any.whl"
        log = build(mirrors[1], "deps-sglang-kernel", None)
        assert ".repo-cutlass.archive: OK" in log, log[-3000:]
        assert "GET /github.com/NVIDIA/cutlass/archive/" not in log  # the git host's own log is not the build's
