"""profiles.<name>.source = { <package> = "auto" }: plan's prediction of the route (index wheel or compile) from
matrix.lock's wheel tags and per-wheel metadata and the engine data's record of the file's device code (index_wheels,
read by builder/audit.py from the real PyPI file), its reason, a cache key per route, the labels, and bad values.
The build side (download, audit, decision) runs on the real daemon in tests/docker/builds/test_auto_source_build.py; the real
vLLM 0.33.0 wheel is audited by the slow test at the end."""

from __future__ import annotations

import json
import platform
import tomllib

import pytest
import tomli_w

from builder import resolve
from builder.matrix import Selection, load
from builder.plan import format_plan, plan_cells, route_keys
from builder.render import render

from tests.helpers import REPO, run_cli, write_matrix

VLLM = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_SHA = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"  # the PyPI file (engine data)
PROFILE = """
[defaults]
profile = "upstream"
archs = [80, 90]
{knowledge}
[profiles.upstream]
cuda = "13.0.3"
os = "ubuntu24.04"
python = "{python}"
engines = {{ vllm = "0.33.0" }}
strategies = ["MTP2", "MTP7", "DFlash2"]
source = {source}
"""


def matrix(tmp, monkeypatch, *, wheels=None, source='{ vllm = "auto" }', python="3.12", knowledge=""):
    """The shipped lock with vLLM 0.33.0's x86_64 wheel recorded as `builder lock` records it (sha256, its metadata's
    torch pin and Requires-Python), or `wheels` instead."""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    path = write_matrix(tmp, PROFILE.format(source=source, python=python, knowledge=knowledge))
    data = tomllib.loads((REPO / "matrix.lock").read_text())
    data["packages"]["vllm==0.33.0"]["wheels"] = wheels if wheels is not None else [
        {"filename": VLLM, "url": "https://files.example/" + VLLM, "sha256": VLLM_SHA, "torch": "2.14.0",
         "requires_python": "<3.15,>=3.11"}]
    (tmp / "matrix.lock").write_text(tomli_w.dumps(data))
    return path


def the_package(path, archs=None):
    (cell,) = resolve.select(load(path), Selection(archs=archs))
    (pkg,) = [p for p in cell.packages if p.name == "vllm"]
    return cell, pkg


def test_the_vllm_cell_at_80_90_is_predicted_to_take_the_index_wheel(tmp_path, monkeypatch):
    cell, pkg = the_package(matrix(tmp_path, monkeypatch))
    assert cell.id == "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90-auto"  # one id whatever build decides
    r = pkg.route
    assert r.chosen == "index" and not r.fact and r.known and pkg.from_index and not pkg.compiled_here
    assert r.reason == ("its tags (cp38) install on Python 3.12, Requires-Python <3.15,>=3.11; it pins torch==2.14.0, "
                        "the cell's; its binaries need libcudart.so.13, the cell's CUDA 13.0.3; the audit of its "
                        "recorded device code (engine data) passes for sm_80, sm_90: 9 binaries with device code (by "
                        "PTX only, JIT-compiled by the driver at first load: _vllm_fa2_C.abi3.so on sm_90)")
    text = format_plan(plan_cells([cell], None))
    assert "source auto → index (predicted): its tags (cp38)" in text
    keys = route_keys(cell, pkg)
    assert keys["index"] != keys["build"] and f"keys   index {keys['index'][:16]}  build {keys['build'][:16]}" in text
    (plan,) = plan_cells([cell], None)
    assert plan.wheels[0].key == keys["index"]  # the predicted route's key


@pytest.mark.parametrize("archs,reason", [
    # QuTLASS ships sm_100f only; the engine data scopes it to 10.x and 12.x GPUs, so a 12.0 or 12.1 request needs it
    ((80, 90, 120), "fails for sm_80, sm_90, sm_120: _qutlass_C.abi3.so lacks sm_120"),
    ((80, 90, 121), "fails for sm_80, sm_90, sm_121: _qutlass_C.abi3.so lacks sm_121"),
])
def test_an_arch_the_wheel_lacks_is_predicted_to_compile(tmp_path, monkeypatch, archs, reason):
    cell, pkg = the_package(matrix(tmp_path, monkeypatch), archs)
    assert pkg.route.chosen == "build" and pkg.compiled_here
    assert pkg.route.reason == "the audit of its recorded device code (engine data) " + reason
    assert not pkg.route.fact  # a prediction: build downloads and audits the file to decide
    (plan,) = plan_cells([cell], None)
    assert plan.wheels[0].key == route_keys(cell, pkg)["build"]


def test_a_turing_gpu_is_refused_on_both_routes(tmp_path, monkeypatch):
    # FlashAttention 2 ships sm_80 + compute_80: nothing for a Turing GPU in the index wheel, and a compile makes the
    # same (its FA2_ARCHS "8.0+PTX" selects nothing below 8.0): plan refuses before any compile, not its audit after
    with pytest.raises(resolve.UserError, match=r"_vllm_fa2_C \(loaded on every GPU\) compiles sm_80, compute_80 .* "
                                                 r"none of which runs on sm_75"):
        the_package(matrix(tmp_path, monkeypatch), (75, 80))


def test_sm_110_is_covered_by_ptx_only(tmp_path, monkeypatch):
    _, pkg = the_package(matrix(tmp_path, monkeypatch), (80, 90, 110))
    assert pkg.route.chosen == "index"
    assert "passes for sm_80, sm_90, sm_110" in pkg.route.reason
    assert "_C_stable_libtorch.abi3.so on sm_110" in pkg.route.reason  # compute_90 PTX, JIT-compiled


OTHER_SHA = "ab" * 32
CUDA12 = f"""
[index_wheels."{OTHER_SHA}"]
file = "{VLLM}"
package = "vllm==0.33.0"
cuda = "12"
[index_wheels."{OTHER_SHA}".binaries]
"vllm/_C.abi3.so" = ["sm_80", "sm_90"]
"""


@pytest.mark.parametrize("case,wheel,python,reason", [
    ("torch", {"torch": "2.13.0"}, "3.12", "it pins torch==2.13.0, the cell has torch 2.14.0"),
    ("no torch pin", {"torch": ""}, "3.12",
     "its metadata pins no exact torch, and its binaries are built against one torch's C++ ABI (the cell has torch 2.14.0)"),
    ("requires-python", {"requires_python": ">=3.13"}, "3.12", "it requires Python >=3.13, the cell has Python 3.12"),
    ("cuda", {"sha256": OTHER_SHA}, "3.12", "its binaries need libcudart.so.12, the cell has CUDA 13.0.3"),
])
def test_a_pin_that_differs_is_predicted_to_compile(tmp_path, monkeypatch, case, wheel, python, reason):
    (tmp_path / "more.toml").write_text(CUDA12)
    w = {"filename": VLLM, "url": "https://files.example/" + VLLM, "sha256": VLLM_SHA, "torch": "2.14.0",
         "requires_python": "<3.15,>=3.11", **wheel}
    _, pkg = the_package(matrix(tmp_path, monkeypatch, wheels=[w], python=python,
                                knowledge='knowledge = ["more.toml"]'))
    assert pkg.route.chosen == "build", pkg.route
    assert reason in pkg.route.reason, pkg.route.reason


def test_no_wheel_for_the_cells_python_is_known_before_any_download(tmp_path, monkeypatch):
    w = {"filename": "vllm-0.33.0-cp313-cp313-manylinux_2_28_x86_64.whl", "url": "https://files.example/x.whl",
         "sha256": "cd" * 32, "torch": "2.14.0", "requires_python": ""}
    _, pkg = the_package(matrix(tmp_path, monkeypatch, wheels=[w]))
    assert pkg.route.chosen == "build" and pkg.route.fact and pkg.route.index is None
    assert pkg.route.reason == ("no wheel of vllm 0.33.0 on the index installs on Python 3.12 / ubuntu24.04 (it "
                                "publishes vllm-0.33.0-cp313-cp313-manylinux_2_28_x86_64.whl)")
    _, pkg = the_package(matrix(tmp_path, monkeypatch, wheels=[]))
    assert pkg.route.reason == "the index publishes no Linux wheel of vllm 0.33.0"


def test_a_file_the_engine_data_does_not_know_is_left_to_builds_audit(tmp_path, monkeypatch):
    w = {"filename": VLLM, "url": "https://files.example/" + VLLM, "sha256": "ef" * 32, "torch": "2.14.0",
         "requires_python": "<3.15,>=3.11"}
    _, pkg = the_package(matrix(tmp_path, monkeypatch, wheels=[w]))
    assert pkg.route.chosen == "index" and not pkg.route.known
    assert pkg.route.summary.startswith("index (predicted, the download decides): ")
    assert "unknown before the download: the CUDA runtime its binaries need is not known before the download; the " \
           "engine data has no record of this file's device code; build's audit decides" in pkg.route.reason


def test_plan_json_labels_and_dry_run_say_the_route(tmp_path, monkeypatch):
    path = matrix(tmp_path, monkeypatch)
    res = run_cli("plan", "--matrix", str(path), "--json")
    assert res.exit_code == 0, res.output
    (cell,) = json.loads(res.output[res.output.index("{"):])["cells"]
    vllm = next(p for p in cell["packages"] if p["name"] == "vllm")
    assert vllm["action"] == "fetch" and vllm["cache_key"] == vllm["route"]["keys"]["index"]
    assert vllm["route"]["asked"] == "auto" and vllm["route"]["chosen"] == "index" and vllm["route"]["fact"] is False
    assert [c["check"] for c in vllm["route"]["checks"]] == ["python", "torch", "cuda", "archs"]
    cell_obj, _ = the_package(path)
    (plan,) = plan_cells([cell_obj], None)
    dockerfile = render(plan, "https://pypi.org/simple")
    assert 'LABEL io.builder.package.vllm.route="index"' in dockerfile
    assert 'LABEL io.builder.package.vllm.route-reason="index (predicted): its tags (cp38)' in dockerfile
    res = run_cli("build", "--matrix", str(path), "--dry-run", "--wheelhouse", str(tmp_path / "wh"), "--only", "vllm-*")
    assert res.exit_code == 0, res.output
    assert "# route vllm==0.33.0: auto → index (predicted): " in res.output
    assert "build downloads the pinned wheel and audits it to decide" in res.output


@pytest.mark.parametrize("source,message", [
    ('{ vllm = "Auto" }', "profiles.upstream.source.vllm: 'Auto' is not one of build, index, auto (did you mean 'auto'?)"),
    ('{ vllm = "automatic" }', "profiles.upstream.source.vllm: 'automatic' is not one of build, index, auto"),
    ('{ vllm = 1 }', "profiles.upstream.source.vllm: expected one of build, index, auto, got an integer 1"),
    ('{ vlm = "auto" }', "unknown package 'vlm' (did you mean 'vllm'?)"),
    ('"auto"', "profiles.upstream.source: expected a table of strings, each one of build, index, auto, got a string 'auto'"),
])
def test_bad_source_values_are_exit_2(tmp_path, monkeypatch, source, message):
    path = matrix(tmp_path, monkeypatch, source=source)
    for verb in ("plan", "build"):
        res = run_cli(verb, "--matrix", str(path), *(["--dry-run"] if verb == "build" else []))
        assert res.exit_code == 2, (verb, res.output)
        assert message in res.output, (verb, res.output)


def test_auto_without_the_wheels_read_by_lock_is_exit_2(tmp_path, monkeypatch):
    path = matrix(tmp_path, monkeypatch)
    data = tomllib.loads((tmp_path / "matrix.lock").read_text())
    del data["packages"]["vllm==0.33.0"]["wheels"]
    (tmp_path / "matrix.lock").write_text(tomli_w.dumps(data))
    res = run_cli("plan", "--matrix", str(path))
    assert res.exit_code == 2
    assert ('matrix.lock: vllm 0.33.0 records no wheels from the index, which profiles.upstream.source.vllm = "auto" '
            "weighs against compiling; run `builder lock`") in res.output


def test_a_bad_index_wheels_record_is_refused(tmp_path, monkeypatch):
    (tmp_path / "more.toml").write_text(CUDA12.replace('"sm_80", "sm_90"', '"sm80"'))
    res = run_cli("plan", "--matrix", str(matrix(tmp_path, monkeypatch, knowledge='knowledge = ["more.toml"]')))
    assert res.exit_code == 2 and "SASS or PTX name" in res.output, res.output


def test_the_engine_datas_record_is_what_the_audit_reads_from_the_shipped_file():
    """The index_wheels entries hold per binary exactly the SASS/PTX names an audit reports (the format the
    prediction re-reads), and every scoped binary of vLLM 0.33.0 is among them."""
    from builder.audit import audit_recorded
    from builder.engines import load_knowledge

    kn = load_knowledge()
    rec = kn.index_wheel(VLLM_SHA)
    assert rec["file"] == VLLM and rec["cuda"] == "13" and len(rec["binaries"]) == 9
    report = audit_recorded(VLLM, rec["binaries"], [80, 90], kn.recipe("vllm", "0.33.0").arch_scoped)
    assert report.ok and sum(b.scope is not None for b in report.binaries) == 6


@pytest.mark.slow
@pytest.mark.network
def test_the_recorded_device_code_of_the_real_vllm_wheel_is_what_its_audit_finds(tmp_path):
    """Slow (a 336 MB download): the real PyPI file, audited by builder/audit.py, holds per binary what the engine
    data records, and needs libcudart.so.13; the audit passes for 80,90 and 80,90,110 (PTX) and fails for 12.0 and
    12.1 on QuTLASS, as plan predicts."""
    import requests

    from builder import audit
    from builder.download import fetch_pinned
    from builder.engines import load_knowledge

    kn = load_knowledge()
    with requests.Session() as s:
        url = next(f["url"] for f in s.get("https://pypi.org/simple/vllm/", timeout=60,
                                           headers={"Accept": "application/vnd.pypi.simple.v1+json"}).json()["files"]
                   if f["filename"] == VLLM)
        wheel = fetch_pinned(s, url, tmp_path / VLLM, VLLM_SHA)
    scopes = kn.recipe("vllm", "0.33.0").arch_scoped
    report = audit.audit(wheel, [80, 90], scopes)
    found = {b.path.split("!", 1)[1]: b.names("sass") + b.names("ptx") for b in report.binaries if b.has_device_code}
    assert found == kn.index_wheel(VLLM_SHA)["binaries"]
    assert set(audit.cuda_majors(audit.wheel_links(wheel))) == {13}
    assert report.ok and audit.audit(wheel, [80, 90, 110], scopes).ok
    for archs in ([80, 90, 120], [80, 90, 121]):
        (fail,) = audit.audit(wheel, archs, scopes).failures
        assert fail.path.endswith("vllm/_qutlass_C.abi3.so")


# -- build's decision on real files: the fixture's kernel library compiled by the real nvcc, no Docker ------------
def fixture_cell(tmp, wheel_path):
    import hashlib

    from tests.helpers import cuda_ext_auto_matrix as fixture_matrix

    path = fixture_matrix(tmp)
    lock = {"format": 1, "packages": {"cuda-ext==1.0.0": {"wheels": [
        {"filename": wheel_path.name, "url": f"http://127.0.0.1:9/packages/{wheel_path.name}",
         "sha256": hashlib.sha256(wheel_path.read_bytes()).hexdigest(), "torch": "", "requires_python": ""}]}}}
    (tmp / "matrix.lock").write_text(tomli_w.dumps(lock))
    (cell,) = resolve.select(load(path), Selection())
    return cell, cell.packages[0]


@pytest.fixture(scope="module")
def variants(nvcc, tmp_path_factory):
    from tests.helpers import cuda_ext_wheel as wheel
    from tests.helpers import saxpy_so

    tmp = tmp_path_factory.mktemp("variants")
    lib = saxpy_so(nvcc, tmp / "libsaxpy.so", (80, 90))
    return {"good": wheel(tmp / "good", lib), "torch": wheel(tmp / "torch", lib, requires=("torch==2.14.0",)),
            "cuda12": wheel(tmp / "cuda12", lib.replace(b"libcudart.so.13", b"libcudart.so.12")),
            "nocode": wheel(tmp / "nocode", b"\x7fELF-not-really")}


@pytest.mark.parametrize("variant,archs,chosen,reason", [
    ("good", (80, 90), "index", "the audit of the downloaded wheel passes for sm_80, sm_90: 1 binaries with device code"),
    ("good", (90, 100), "build", "the audit of the downloaded wheel fails for sm_90, sm_100: libsaxpy.so lacks sm_100"),
    ("torch", (80, 90), "build", "it pins torch==2.14.0, the cell has no torch"),
    ("cuda12", (80, 90), "build", "its binaries need libcudart.so.12, the cell has CUDA 13.0.88"),
    ("nocode", (80, 90), "build", "the audit of the downloaded wheel finds no device code in it"),
])
def test_builds_decision_reads_the_downloaded_file(tmp_path, monkeypatch, variants, variant, archs, chosen, reason):
    """route.decide on real wheels: the audit of the file for the cell's archs, its own METADATA and DT_NEEDED."""
    import dataclasses

    from builder import route

    cell, pkg = fixture_cell(tmp_path, variants[variant])
    cell = dataclasses.replace(cell, archs=archs)
    decided, report = route.decide(pkg, cell, variants[variant])
    assert decided.chosen == chosen and decided.fact, decided
    assert reason in decided.reason, decided.reason
    if chosen == "index":
        assert "its binaries need libcudart.so.13, the cell's CUDA 13.0.88" in decided.reason
        assert report.ok


def test_a_wheel_for_another_python_is_ruled_out_before_the_download(tmp_path, monkeypatch, variants):
    import shutil

    from builder import route

    other = variants["good"].with_name("cuda_ext-1.0.0-cp312-cp312-linux_x86_64.whl")
    shutil.copy(variants["good"], other)
    cell, pkg = fixture_cell(tmp_path, other)
    assert pkg.route.chosen == "build" and pkg.route.fact
    settled, report, wheel = route.settle(pkg, cell, lambda p: pytest.fail("nothing is fetched"),
                                          lambda line: pytest.fail(line))
    assert settled.route.reason.startswith("no wheel of cuda-ext 1.0.0 on the index installs on Python 3.11 / bookworm")
    assert report is None and wheel is None and settled.source.kind == "local"


def test_ci_sends_an_auto_cell_to_a_compile_runner_unless_its_route_is_known(tmp_path, monkeypatch):
    """The engine data's record of the very file (by sha256) is what build's audit finds: a light runner. A file it
    does not know may still turn into a compile once build audits it: a compile runner."""
    res = run_cli("matrix", "--matrix", str(matrix(tmp_path, monkeypatch)))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["include"][0]["runner"] == ["ubuntu-latest"]
    w = {"filename": VLLM, "url": "https://files.example/" + VLLM, "sha256": "ef" * 32, "torch": "2.14.0",
         "requires_python": "<3.15,>=3.11"}
    res = run_cli("matrix", "--matrix", str(matrix(tmp_path, monkeypatch, wheels=[w])))
    assert json.loads(res.output)["include"][0]["runner"] == ["self-hosted", "linux", "x64", "builder-compile"]


def test_prune_unused_keeps_both_routes_of_an_auto_package(tmp_path, monkeypatch):
    """Either route's wheel is in use: build may take the other one than plan predicts."""
    from builder.cache import file_records
    from builder.cache.local import Wheelhouse

    path = matrix(tmp_path, monkeypatch)
    cell, pkg = the_package(path)
    wh = Wheelhouse(tmp_path / "wheelhouse")
    whl = tmp_path / VLLM
    whl.write_bytes(b"x")
    keys = route_keys(cell, pkg)
    for key in (*keys.values(), "0" * 64):
        wh.store("vllm", key, [whl], {"format": 1, "package": "vllm", "key": key, "version": "0.33.0",
                                     "files": file_records([whl]), "audit": {"ok": True}})
    res = run_cli("wheels", "prune", "--unused", "--matrix", str(path), "--wheelhouse", str(tmp_path / "wheelhouse"),
                  "--dry-run")
    assert res.exit_code == 0, res.output
    assert "0" * 16 in res.output and keys["index"] not in res.output and keys["build"] not in res.output, res.output
