"""profiles.<name>.source = { <package> = "index" }: take a package's published wheel from the index instead of
compiling it, pinned by the sha256 matrix.lock records, with the audit deciding whether it carries the cell's
archs. Here: validation, the wheel a cell's Python / OS / machine takes, plan, render and `lock` against the
real PyPI; tests/docker/builds/test_index_source_build.py builds and audits through a real local index on the real daemon."""

from __future__ import annotations

import platform
import tomllib

import pytest
import tomli_w

from builder import resolve
from builder.lockfile import Lock
from builder.matrix import Selection, load
from builder.plan import format_plan, plan_cells
from builder.render import render

from tests.helpers import REPO, run_cli, write_matrix

PROFILE = """
[defaults]
profile = "upstream"
archs = [80, 90]

[profiles.upstream]
cuda = "13.0.3"
os = "ubuntu24.04"
python = "3.12"
engines = {{ vllm = "0.33.0" }}
strategies = ["MTP2", "MTP7", "DFlash2"]
source = {source}
"""
FILES = "https://files.example/packages/"
X86 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def with_wheels(tmp, names: list[str], source: str = '{ vllm = "index" }', text: str = PROFILE):
    """The shipped lock, its vllm 0.33.0 entry given these wheels (a fake sha256 each), and a matrix."""
    path = write_matrix(tmp, text.format(source=source))
    data = tomllib.loads((REPO / "matrix.lock").read_text())
    data["packages"]["vllm==0.33.0"]["wheels"] = [
        {"filename": n, "url": FILES + n, "sha256": f"{i:064x}"} for i, n in enumerate(names, 1)]
    (tmp / "matrix.lock").write_text(tomli_w.dumps(data))
    return path


def cells(path, monkeypatch, machine: str = "x86_64"):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    return resolve.select(load(path), Selection())


@pytest.mark.pure
@pytest.mark.parametrize("machine,wheels,chosen", [
    # abi3 for the one machine the images are built on; the aarch64 twin is not it
    ("x86_64", ["vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl", X86], X86),
    ("aarch64", ["vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl", X86], "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"),
    # a wheel built for exactly this CPython beats an abi3 one; another Python's and a glibc newer than
    # Ubuntu 24.04's 2.39 do not install at all
    ("x86_64", [X86, "vllm-0.33.0-cp312-cp312-manylinux_2_28_x86_64.whl", "vllm-0.33.0-cp313-cp313-manylinux_2_28_x86_64.whl",
                "vllm-0.33.0-cp312-cp312-manylinux_2_40_x86_64.whl"], "vllm-0.33.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ("x86_64", [X86, "vllm-0.33.0-cp312-cp312-manylinux2014_x86_64.whl"], "vllm-0.33.0-cp312-cp312-manylinux2014_x86_64.whl"),
])
def test_the_cell_takes_the_wheel_its_python_os_and_machine_install(tmp_path, monkeypatch, machine, wheels, chosen):
    (cell,) = cells(with_wheels(tmp_path, wheels), monkeypatch, machine)
    (pkg,) = cell.packages
    assert pkg.from_index and pkg.source.filename == chosen
    assert pkg.source.url == FILES + chosen and pkg.source.sha256 == f"{wheels.index(chosen) + 1:064x}"
    assert pkg.source.ref == f"index:{chosen}@sha256:{pkg.source.sha256}"
    # nothing is compiled: no knob, no SASS promised before the audit, no CMake dependency to pin
    assert pkg.knobs == () and pkg.built_sass == () and pkg.unpinned() == [] and not pkg.compiled_here
    assert cell.id.endswith("-sm80.90-index") and cell.tag.endswith("-index")


@pytest.mark.pure
def test_no_installable_wheel_is_exit_2_naming_what_the_index_has(tmp_path):
    path = with_wheels(tmp_path, ["vllm-0.33.0-cp313-cp313-manylinux_2_28_x86_64.whl",
                                  "vllm-0.33.0-cp312-cp312-manylinux_2_40_x86_64.whl"])
    res = run_cli("plan", "--matrix", str(path))
    assert res.exit_code == 2, res.output
    assert "profiles.upstream.source.vllm: no wheel of vllm 0.33.0 on the index installs on Python 3.12 / ubuntu24.04" in res.output
    assert "cp313-cp313-manylinux_2_28_x86_64.whl" in res.output and "build it instead" in res.output


@pytest.mark.pure
@pytest.mark.parametrize("source,lock_wheels,message", [
    ('{ vllm = "pypi" }', True, "profiles.upstream.source.vllm: 'pypi' is not one of build, index, auto"),
    ('{ vlm = "index" }', True, "unknown package 'vlm' (did you mean 'vllm'?)"),
    ('{ sglang-kernel = "index" }', True, "profiles.upstream.source: no cell of this profile has the package 'sglang-kernel'"),
    ('"index"', True, "profiles.upstream.source: expected a table of strings, each one of build, index, auto, got a string 'index'"),
    ('{ vllm = "index" }', False, "matrix.lock: no wheels recorded for vllm 0.33.0, which profiles.upstream.source takes "
                                  "from the index; run `builder lock`"),
])
def test_bad_source_tables_are_exit_2_before_anything_runs(tmp_path, source, lock_wheels, message):
    path = with_wheels(tmp_path, [X86] if lock_wheels else [], source=source)
    if not lock_wheels:
        data = tomllib.loads((tmp_path / "matrix.lock").read_text())
        del data["packages"]["vllm==0.33.0"]["wheels"]
        (tmp_path / "matrix.lock").write_text(tomli_w.dumps(data))
    for verb in ("plan", "render", "build"):
        res = run_cli(verb, "--matrix", str(path), *(["--dry-run"] if verb == "build" else []))
        assert res.exit_code == 2, (verb, res.output)
        assert message in res.output, (verb, res.output)


def test_an_os_whose_glibc_is_unknown_is_refused_for_index_wheels_only(tmp_path):
    text = PROFILE.replace('os = "ubuntu24.04"', 'os = "alpine3.20"')
    res = run_cli("plan", "--matrix", str(with_wheels(tmp_path, [X86], text=text)))
    assert res.exit_code == 2
    assert "profiles.upstream.os: the glibc of alpine3.20 is unknown to this toolkit" in res.output
    res = run_cli("plan", "--matrix", str(with_wheels(tmp_path, [X86], source="{}", text=text)))
    assert res.exit_code == 0, res.output


def test_plan_render_and_dry_run_fetch_instead_of_compiling(tmp_path, monkeypatch):
    path = with_wheels(tmp_path, [X86])
    m = load(path)
    (cell,) = cells(path, monkeypatch)
    (plan,) = plan_cells([cell], None)
    (step,) = plan.wheels
    # the key is the file, whatever the cell: another profile taking the same wheel shares the cache entry
    assert step.inputs == {"format": 1, "package": "vllm", "version": "0.33.0", "source": cell.packages[0].source.ref}
    text = format_plan(plan_cells([cell], resolve_cache(tmp_path)))
    assert "fetch  vllm==0.33.0" in text and f"from the index as published ({X86}); the audit decides" in text
    assert "UNPINNED" not in text  # vLLM's CMake dependencies are not fetched for a wheel nobody compiles
    dockerfile = render(plan, m.defaults["index"])
    stages = [line.split()[-1] for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert stages == ["toolchain", "torch", "devel", "runtime-base", "runtime-resolve", "runtime-resolved", "runtime"]  # no src-, build- or wheels-vllm stage
    # what the audit of the fetched wheel finds (builder/image/labels.py), passed in by the image step
    assert 'LABEL io.builder.package.vllm.sass="${BUILDER_AUDIT_VLLM_SASS}"' in dockerfile
    assert f'LABEL io.builder.package.vllm.source="index:{X86}@sha256:' in dockerfile
    res = run_cli("build", "--matrix", str(path), "--dry-run", "--wheelhouse", str(tmp_path / "wh"))
    assert res.exit_code == 0, res.output
    assert f"# download vllm==0.33.0 from the index, sha256 {1:064x}: {FILES}{X86}" in res.output
    assert "--target wheels-vllm" not in res.output


def resolve_cache(tmp):
    from builder.cache.local import Wheelhouse

    return Wheelhouse(tmp / "wheelhouse")


# the same engine version compiled here, in a second profile of the same matrix
WITH_COMPILED_TWIN = PROFILE + """
[profiles.compiled]
cuda = "13.0.3"
os = "ubuntu24.04"
python = "3.12"
engines = {{ vllm = "0.33.0" }}
"""


@pytest.mark.pure
def test_compiled_and_index_profiles_of_one_engine_live_in_one_matrix(tmp_path, monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    path = with_wheels(tmp_path, [X86], text=WITH_COMPILED_TWIN)
    ids = [c.id for c in resolve.select(load(path), Selection(profiles=("all",)))]
    assert ids == ["vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90-index", "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90"]


def test_lock_records_the_releases_linux_wheels_from_the_real_index(tmp_path):
    """`builder lock` against the real PyPI: vLLM 0.33.0's Linux wheels, each with the sha256 PyPI lists."""
    path = write_matrix(tmp_path, PROFILE.format(source='{ vllm = "index" }'), lock_from=None)
    res = run_cli("lock", "--matrix", str(path))
    assert res.exit_code == 0, res.output
    entry = Lock.load(tmp_path / "matrix.lock").get("vllm", "0.33.0")
    names = [w["filename"] for w in entry.wheels]
    assert names == ["vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl", X86]
    x86 = next(w for w in entry.wheels if w["filename"] == X86)
    assert x86["sha256"] == "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
    assert x86["url"].startswith("https://files.pythonhosted.org/") and x86["url"].endswith("/" + X86)
    assert entry.torch == "2.14.0"


@pytest.mark.pure
def test_ci_sends_a_cell_that_compiles_nothing_to_the_light_runner(tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    res = run_cli("matrix", "--matrix", str(with_wheels(tmp_path, [X86], text=WITH_COMPILED_TWIN)), "--profile", "all")
    assert res.exit_code == 0, res.output
    runners = {c["cell"]: c["runner"] for c in json.loads(res.output)["include"]}
    assert runners == {"vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90-index": ["ubuntu-latest"],
                       "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90": ["self-hosted", "linux", "x64", "builder-compile"]}
