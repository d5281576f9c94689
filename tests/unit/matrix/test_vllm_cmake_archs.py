"""vLLM selects its archs in its own CMake (cuda_archs_loose_intersection, per target): plan predicts that, the
cache key follows it, and the audit expects what the build makes (issue 32, item 3)."""

from __future__ import annotations

import pytest

from builder import archs as A
from builder import matrix as M
from builder import plan as P
from builder import resolve
from builder.audit import audit_recorded

from tests.helpers import MATRIX

QUTLASS_NOTE = "QuTLASS: built for sm_100f only (10.x and 12.x both asked; qutlass.cmake picks one family)"
# vLLM 0.33.0 CMakeLists.txt 124-129: CUDA_SUPPORTED_ARCHS with nvcc 13.0 ... 13.3
SUPPORTED_13_0 = ["7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0"]


def vllm(archs: tuple[int, ...]):
    m = M.load(MATRIX)
    cells = resolve.select(m, M.Selection(engines=("vllm",), archs=archs))
    cell = next(c for c in cells if c.version == "0.33.0")
    return cell, next(p for p in cell.packages if p.name == "vllm")


def key(archs: tuple[int, ...]) -> str:
    cell, pkg = vllm(archs)
    return P.cache_key(cell, pkg)


# -- the function, step by step (cmake/utils.cmake 400-501) -----------------------------------------------------
@pytest.mark.pure
@pytest.mark.parametrize("src, tgt, out", [
    # the whole-build filter: same major, the highest supported minor not above the target
    (SUPPORTED_13_0, ["10.3"], ["10.0"]),
    (SUPPORTED_13_0, ["12.1"], ["12.0"]),
    (SUPPORTED_13_0, ["10.0", "10.3"], ["10.0"]),
    (SUPPORTED_13_0, ["8.0", "9.0"], ["8.0", "9.0"]),
    (SUPPORTED_13_0, ["8.9", "8.8"], ["8.9", "8.7"]),
    (SUPPORTED_13_0, ["7.0"], []),  # nothing of major 7 at or below 7.0: dropped
    # per-target lists: x.y[af] whose x.y is a target is taken as written
    (["10.0f"], ["10.0", "12.0"], ["10.0f"]),
    (["12.0f"], ["10.0", "12.0"], ["12.0f"]),
    (["9.0a", "10.0f"], ["8.0", "9.0"], ["9.0a"]),
    (["10.0f"], ["8.0", "9.0"], []),
    # an 'f' source with no exact target takes the first target of its major, as the target is written
    (["12.0f"], ["12.1"], ["12.1"]),
    # +PTX matches across majors and is put back
    (["8.0+PTX"], ["9.0"], ["8.0+PTX"]),
    (["8.0+PTX"], ["10.0", "12.0"], ["8.0+PTX"]),
    # the function's own header example claims "8.0;8.6;9.0;9.0a"; its code consumes target 9.0 with 9.0a first
    (["7.5", "8.0", "8.6", "9.0", "9.0a"], ["8.0", "8.9", "9.0"], ["9.0a", "8.0", "8.6"]),
])
def test_loose_intersection_is_vllms_function(src, tgt, out):
    assert A.loose_intersection(src, tgt) == out


@pytest.mark.pure
def test_cmake_codes_are_what_set_gencode_flags_for_srcs_writes():
    assert A.cmake_codes("10.0f") == ("sm_100f",)
    assert A.cmake_codes("9.0a") == ("sm_90a",)
    assert A.cmake_codes("8.0+PTX") == ("sm_80", "compute_80")


# -- plan: SASS and knobs through vLLM's own filter -------------------------------------------------------------
@pytest.mark.pure
@pytest.mark.parametrize("archs, knob, sass", [
    ((103,), "10.0", ("sm_100",)),
    ((121,), "12.0", ("sm_120",)),
    ((100, 103), "10.0", ("sm_100",)),
    ((100, 120), "10.0 12.0", ("sm_100", "sm_120")),
    ((80, 90), "8.0 9.0", ("sm_80", "sm_90")),  # unchanged
])
def test_plan_predicts_sass_through_vllms_intersection(archs, knob, sass):
    cell, pkg = vllm(archs)
    assert dict(pkg.knobs) == {"TORCH_CUDA_ARCH_LIST": knob}
    assert pkg.built_sass == sass
    assert pkg.built_archs == tuple(int(s[3:]) for s in sass)
    assert pkg.recipe.arch_problems(archs, cell.cuda) == []
    text = P.format_plan(P.plan_cells([cell], None))
    line = next(ln for ln in text.splitlines() if "vllm==0.33.0" in ln)
    assert f"SASS {','.join(sass)} " in line and f"TORCH_CUDA_ARCH_LIST={knob!r}" in line
    assert cell.archs == archs  # the cell (id, tag, audit) still names the GPUs asked for


@pytest.mark.pure
def test_the_rendered_knob_is_the_list_cmake_keeps():
    from builder.render import package_context

    _, pkg = vllm((103,))
    env = dict(package_context(pkg)["env"])
    assert "10.0" in env["TORCH_CUDA_ARCH_LIST"] and "10.3" not in env["TORCH_CUDA_ARCH_LIST"]


@pytest.mark.pure
def test_an_arch_vllm_cannot_keep_is_refused():
    cell, pkg = vllm((80,))
    problems = pkg.recipe.arch_problems((70,), cell.cuda)
    assert any("keeps no arch for 7.0" in p for p in problems)


# -- the cache key follows the binaries -------------------------------------------------------------------------
@pytest.mark.pure
def test_same_binaries_same_key_and_only_then():
    k100 = key((100,))
    assert key((100, 103)) == k100  # CUDA_ARCHS is 10.0 for both: the same build
    assert key((103,)) == k100
    assert key((121,)) == key((120,))
    assert key((120, 121)) == key((120,))
    # different binaries, different keys
    assert key((100, 120)) != k100
    assert key((90,)) != k100
    assert key((80, 90)) != key((80, 90, 100))


@pytest.mark.pure
def test_80_90_key_inputs_keep_their_shape():
    cell, pkg = vllm((80, 90))
    inputs = P.key_inputs(cell, pkg)
    assert inputs["knobs"] == [["TORCH_CUDA_ARCH_LIST", "8.0 9.0"]]
    assert inputs["built_archs"] == [80, 90]
    assert "gencode_filter" not in inputs  # no new input: keys of cached 80,90 wheels stay valid


# -- QuTLASS: one family per build ------------------------------------------------------------------------------
@pytest.mark.pure
def test_qutlass_is_scoped_to_the_family_qutlass_cmake_builds():
    cell, pkg = vllm((100, 120))
    plans = {bp.binary.target: bp for bp in pkg.recipe.binary_plans(pkg.archs, cell.cuda)}
    assert plans["_qutlass_C"].sass == ("sm_100f",)
    assert plans["_flashkda_C"].sass == ("sm_100f", "sm_120f")  # a list of both families: both
    qutlass = A.scope_for("vllm/_qutlass_C.abi3.so", pkg.arch_scoped)
    assert qutlass.archs == (100, 103)
    assert not qutlass.covers(120)
    text = P.format_plan(P.plan_cells([cell], None))
    assert QUTLASS_NOTE in text
    assert pkg.recipe.predicted_audit(pkg.archs, cell.cuda).ok


@pytest.mark.pure
@pytest.mark.parametrize("archs, sass", [((120,), ("sm_120f",)), ((121,), ("sm_120f",)), ((100,), ("sm_100f",)),
                                         ((103,), ("sm_100f",))])
def test_qutlass_one_family_asked_is_built_for_it(archs, sass):
    cell, pkg = vllm(archs)
    plans = {bp.binary.target: bp for bp in pkg.recipe.binary_plans(pkg.archs, cell.cuda)}
    assert plans["_qutlass_C"].sass == sass
    assert QUTLASS_NOTE not in P.format_plan(P.plan_cells([cell], None))
    static = A.scope_for("vllm/_qutlass_C.abi3.so", pkg.recipe.arch_scoped)
    assert A.scope_for("vllm/_qutlass_C.abi3.so", pkg.arch_scoped).archs == tuple(
        a for a in static.archs if (a // 10) == archs[0] // 10)


@pytest.mark.pure
def test_the_audit_of_what_the_100_120_build_makes_passes_and_a_wrong_build_still_fails():
    cell, pkg = vllm((100, 120))
    made = {"vllm/_qutlass_C.abi3.so": ["sm_100f"], "vllm/_C.abi3.so": ["sm_100", "sm_100f", "sm_120", "sm_120f"]}
    # the static scope (100-121) asked _qutlass_C for 12.0: the hours-long build would have failed its audit
    before = audit_recorded("vllm", made, list(cell.archs), pkg.recipe.arch_scoped)
    assert [b.missing for b in before.failures] == [[120]]
    assert audit_recorded("vllm", made, list(cell.archs), pkg.arch_scoped).ok
    # what the build does not make is still missed: no QuTLASS code for 10.0, or a _C without sm_120
    assert not audit_recorded("vllm", {"vllm/_qutlass_C.abi3.so": ["sm_120f"]}, list(cell.archs), pkg.arch_scoped).ok
    assert not audit_recorded("vllm", {"vllm/_C.abi3.so": ["sm_100"]}, list(cell.archs), pkg.arch_scoped).ok
