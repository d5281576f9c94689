"""Per package and version: how --arch is translated into the knob that really selects archs."""

from __future__ import annotations

import dataclasses

import pytest

from builder.engines import recipe


@pytest.mark.pure
@pytest.mark.parametrize(
    "package, version, archs, knobs, sass",
    [
        # vLLM: TORCH_CUDA_ARCH_LIST (torch's "8.0 9.0" spelling); 0.6.x adds its bundled flash-attn switch
        ("vllm", "0.6.3.post1", (80, 90), {"TORCH_CUDA_ARCH_LIST": "8.0 9.0", "VLLM_FA_CMAKE_GPU_ARCHES": "80-real;90-real"}, (80, 90)),
        ("vllm", "0.6.3.post1", (80,), {"TORCH_CUDA_ARCH_LIST": "8.0", "VLLM_FA_CMAKE_GPU_ARCHES": "80-real"}, (80,)),
        ("vllm", "0.5.5", (80, 86, 90), {"TORCH_CUDA_ARCH_LIST": "8.0 8.6 9.0"}, (80, 86, 90)),
        ("vllm", "0.33.0", (80, 90), {"TORCH_CUDA_ARCH_LIST": "8.0 9.0"}, (80, 90)),
        ("vllm", "0.33.0", (90, 100, 120), {"TORCH_CUDA_ARCH_LIST": "9.0 10.0 12.0"}, (90, 100, 120)),
        # flash-attn 2.6.3 has no switch: always sm_80 + sm_90
        ("flash-attn", "2.6.3", (80,), {}, (80, 90)),
        ("flash-attn", "2.6.3", (80, 90), {}, (80, 90)),
        # flash-attn >= 2.7.3: FLASH_ATTN_CUDA_ARCHS with ';'
        ("flash-attn", "2.7.3", (80, 90), {"FLASH_ATTN_CUDA_ARCHS": "80;90"}, (80, 90)),
        ("flash-attn", "2.8.3", (90,), {"FLASH_ATTN_CUDA_ARCHS": "90"}, (90,)),
        ("flash-attn", "2.8.3", (80, 90, 100, 120), {"FLASH_ATTN_CUDA_ARCHS": "80;90;100;120"}, (80, 90, 100, 120)),
        # a token it does not recognise is served by one it does whose SASS runs there: 8.6/8.9 by sm_80, 10.3 by
        # sm_100 (setup.py writes plain code=sm_100), never dropped in silence
        ("flash-attn", "2.8.3", (86,), {"FLASH_ATTN_CUDA_ARCHS": "80"}, (80,)),
        ("flash-attn", "2.8.3", (80, 89, 90), {"FLASH_ATTN_CUDA_ARCHS": "80;90"}, (80, 90)),
        ("flash-attn", "2.8.3", (103,), {"FLASH_ATTN_CUDA_ARCHS": "100"}, (100,)),
        # sglang-kernel (CMake era): hard-coded; ENABLE_BELOW_SM90 adds sm_80 + sm_89 (+ sm_86 in FA3's flash_ops)
        ("sglang-kernel", "0.4.10", (80, 90), {"ENABLE_BELOW_SM90": "ON"}, (80, 86, 89, 90)),
        ("sglang-kernel", "0.4.10", (90,), {"ENABLE_BELOW_SM90": "OFF"}, (90,)),
        # SGLang itself is Python: nothing to translate, no device code
        ("sglang", "0.5.23", (80, 90), {}, ()),
        ("sglang", "0.3.2", (80, 90), {}, ()),
    ],
)
def test_arch_translation(package, version, archs, knobs, sass):
    r = recipe(package, version)
    assert dict(r.knob_values(archs)) == knobs
    assert r.built_archs(archs) == sass
    assert r.arch_problems(archs) == []


@pytest.mark.pure
def test_flash_attn_always_forces_the_source_build():
    for v in ("2.6.3", "2.8.3"):
        assert dict(recipe("flash-attn", v).build_env) == {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}


@pytest.mark.pure
@pytest.mark.parametrize(
    "cuda, archs, sass",
    [
        # 0.4.10 on CUDA 13.0: the gencode filter keeps, per binary, what a requested GPU loading it runs (sm_90a
        # for FlashMLA and FA3 on 9.0); the upstream wheel holds sm_80 ... sm_120a (test_sglang_kernel_wheel.py)
        ("13.0.3", (80, 90), ("sm_80", "sm_90", "sm_90a")),
        # sm100/common_ops, loaded by no requested GPU, keeps its first entry so the module still builds
        ("13.0.3", (90,), ("sm_90", "sm_90a")),
        # a CUDA release whose binaries the data does not list: what the CMakeLists adds whatever --arch says
        ("12.4.1", (90,), ("sm_90", "sm_90a")),
    ],
)
def test_sglang_kernel_says_what_it_builds_beyond_the_asked_archs(cuda, archs, sass):
    """What the compile emits for --arch, shown by plan and labels."""
    assert recipe("sglang-kernel", "0.4.10").built_sass(archs, cuda) == sass
    # a package without such extras shows exactly its selected archs
    assert recipe("vllm", "0.33.0").built_sass((80, 90), cuda) == ("sm_80", "sm_90")


@pytest.mark.pure
def test_sglang_kernel_threads_knob_and_cmake_floor():
    r = recipe("sglang-kernel", "0.4.10")
    assert r.compile_threads_define == "SGL_KERNEL_COMPILE_THREADS"
    assert r.min_cmake == "3.31"


@pytest.mark.pure
@pytest.mark.parametrize(
    "package, version, archs, fragment",
    [
        ("flash-attn", "2.8.3", (110,), "no SASS of those runs on 11.0; 110 would be silently dropped"),
        ("flash-attn", "2.6.3", (75,), "supports sm_80 and newer"),
        # a GB10 (12.1) loads sm100/common_ops, whose Blackwell code (sm_100f, sm_120a) does not run there
        ("sglang-kernel", "0.4.10", (121,), "sgl_kernel/sm100/common_ops (loaded on every GPU but sm_90) is built "
         "upstream for sm_80, sm_89, sm_90, sm_90a, sm_100f, sm_120a, none of which runs on sm_121"),
        # a CUDA release whose binaries the data does not list: the CMakeLists' fixed set (sm_90 + sm_90a on 12.4)
        ("sglang-kernel", "0.4.10@12.4.1", (100,), "hard-codes its archs (sm_90, sm_90a); sm_100 cannot be selected"),
    ],
)
def test_untranslatable_archs_are_explained(package, version, archs, fragment):
    version, _, cuda = version.partition("@")
    problems = recipe(package, version).arch_problems(archs, cuda or "13.0.3")
    assert any(fragment in p for p in problems), problems


@pytest.mark.pure
def test_sass_for_86_is_covered_by_hardcoded_80():
    # flash-attn 2.6.3 ships sm_80 SASS, which runs on 8.6: no problem to report
    assert recipe("flash-attn", "2.6.3").arch_problems((86,)) == []


@pytest.mark.pure
def test_strategies_per_version():
    """Which releases can run each strategy; what the flags say is checked against expect and the strategy's name
    in tests/unit/deploy/test_smoke.py (test_every_strategy_checks_what_its_own_flags_say)."""
    v, s = recipe("vllm", "0.33.0"), recipe("sglang", "0.5.23")
    for name in ("MTP2", "MTP7", "DFlash2"):
        assert recipe("vllm", "0.6.3.post1").strategy_problem(name)
        assert recipe("sglang", "0.3.2").strategy_problem(name)
        assert v.strategy_problem(name) is None and s.strategy_problem(name) is None
    for flags in (v.strategy(n).flags for n in ("MTP2", "MTP7", "DFlash2")):
        assert not any(f in ("--enable-mtp7", "--enable-dflash2", "--mtp2-chunk-size") for f in flags)


@pytest.mark.pure
def test_flash_attn_cxx_standard_follows_torch():
    """torch >= 2.13 headers need C++20; flash-attn's setup.py pins C++17, so the source is edited then only."""
    fa = recipe("flash-attn", "2.8.3")
    assert fa.patches_for("2.4.0") == []
    (patch,) = fa.patches_for("2.14.0")
    assert (patch["file"], patch["replace"], patch["with"]) == ("setup.py", "-std=c++17", "-std=c++20")
    assert recipe("flash-attn", "2.6.3").patches_for("2.13.0")


@pytest.mark.pure
def test_patch_is_rendered_as_a_checked_literal_edit():
    from builder import matrix as M
    from builder import plan as P
    from builder import render as R
    from builder import resolve

    from tests.helpers import MATRIX

    m = M.load(MATRIX)
    new = resolve.select(m, M.Selection(engines=("vllm",)))[0]
    old = resolve.select(m, M.Selection(engines=("vllm",), profiles=("cu121",)))[0]
    new_stage = R.render(P.plan_cells([new], None)[0], m.defaults["index"]).split("AS build-flash-attn", 1)[1].split("\nFROM ", 1)[0]
    assert "sed -i 's|-std=c++17|-std=c++20|g' setup.py" in new_stage
    assert "! grep -qF -- '-std=c++17' setup.py" in new_stage  # the edit is verified
    assert "sed -i" not in R.render(P.plan_cells([old], None)[0], m.defaults["index"]).split("AS build-flash-attn", 1)[1].split("\nFROM ", 1)[0]


@pytest.mark.pure
def test_sglang_rust_extensions_get_a_toolchain():
    """SGLang 0.5.23's wheels carry Rust extension modules: its source build installs cargo; 0.3.2 has none."""
    from builder import matrix as M
    from builder import plan as P
    from builder import render as R
    from builder import resolve

    from tests.helpers import MATRIX

    assert recipe("sglang", "0.5.23").rust_toolchain == "1.95"
    assert recipe("sglang", "0.3.2").rust_toolchain == ""
    m = M.load(MATRIX)
    (cell,) = resolve.select(m, M.Selection(engines=("sglang",)))
    stage = R.render(P.plan_cells([cell], None)[0], m.defaults["index"]).split("AS build-sglang\n", 1)[1].split("\nFROM ", 1)[0]
    assert "--default-toolchain 1.95" in stage and "CARGO_HOME=/opt/cargo" in stage
    assert stage.index("--default-toolchain") < stage.index("pip wheel")


@pytest.mark.pure
def test_sglang_kernel_arch_selection_per_binary_halves_its_compile_for_80_90():
    """Kernel×arch units of the 0.4.10 binaries (fatbin entries per SASS target, counted in the PyPI wheel: the
    data is held against it by tests/unit/matrix/test_sglang_kernel_wheel.py): upstream's build vs a build for 80,90 through
    the gencode filter, per binary and in all."""
    plans = {bp.binary.target: bp for bp in recipe("sglang-kernel", "0.4.10").binary_plans((80, 90), "13.0.3")}
    assert {t: bp.sass for t, bp in plans.items()} == {
        "flash_ops": ("sm_80", "sm_90a"), "flashmla_ops": ("sm_90a",), "infllm_ops": ("sm_80", "sm_90"),
        "common_ops_sm90_build": ("sm_90", "sm_90a"), "common_ops_sm100_build": ("sm_80",),
        "spatial_ops": ("sm_80", "sm_90", "sm_90a")}
    assert sum(bp.default_units for bp in plans.values()) == 1725
    assert sum(bp.units for bp in plans.values()) == 917
    config = recipe("sglang-kernel", "0.4.10").gencode_filter((80, 90))
    assert config["targets"]["common_ops_sm100_build"] == {"all_but": [90]}
    assert config["targets"]["common_ops_sm90_build"] == {"archs": [90]}
    # scoped as upstream builds it (sm_80, sm_90, sm_120a): the GPUs that code runs on
    assert config["targets"]["infllm_ops"] == {"archs": [80, 86, 87, 88, 89, 90, 120]}
    assert "spatial_ops" not in config["targets"]  # unscoped: every requested GPU


# Per arch set: the SASS each binary keeps (the gencode filter's rule on the 0.4.10 binaries) and the kernel×arch
# units of the build; a binary no requested GPU loads keeps its first entry (the CMake's sm_90 / sm_90a first) so
# that its target still builds — except FA3's flash_ops, whose SGL_KERNEL_ENABLE_FA3 is passed OFF when no requested
# GPU loads it (nothing built: ()).
BLACKWELL = {
    (100,): ({"flash_ops": (), "flashmla_ops": ("sm_100f",), "infllm_ops": ("sm_90",),
              "common_ops_sm90_build": ("sm_90",), "common_ops_sm100_build": ("sm_100f",), "spatial_ops": ("sm_100f",)},
             132),
    (103,): ({"flash_ops": (), "flashmla_ops": ("sm_100f", "sm_103a"), "infllm_ops": ("sm_90",),
              "common_ops_sm90_build": ("sm_90",), "common_ops_sm100_build": ("sm_100f",), "spatial_ops": ("sm_100f",)},
             189),
    (120,): ({"flash_ops": (), "flashmla_ops": ("sm_90a",), "infllm_ops": ("sm_120a",),
              "common_ops_sm90_build": ("sm_90",), "common_ops_sm100_build": ("sm_120a",), "spatial_ops": ("sm_120a",)},
             132),
    (80, 90, 100): ({"flash_ops": ("sm_80", "sm_90a"), "flashmla_ops": ("sm_90a", "sm_100f"), "infllm_ops": ("sm_80", "sm_90"),
                     "common_ops_sm90_build": ("sm_90", "sm_90a"), "common_ops_sm100_build": ("sm_80", "sm_100f"),
                     "spatial_ops": ("sm_80", "sm_90", "sm_90a", "sm_100f")},
                    1010),
}


@pytest.mark.pure
@pytest.mark.parametrize("archs", sorted(BLACKWELL), ids=lambda a: ",".join(map(str, a)))
def test_sglang_kernel_builds_blackwell_per_binary_and_the_audit_of_that_passes(archs):
    """B200 (10.0), B300 (10.3), RTX PRO 6000 (12.0) and a mixed set: what each binary keeps is what the wheel's own
    binaries carry upstream for those GPUs, and the audit (the same rules and scopes the build's audit step uses)
    passes on exactly that: plan refuses nothing, and what the filter drops no requested GPU loads."""
    r = recipe("sglang-kernel", "0.4.10")
    sass, units = BLACKWELL[archs]
    plans = r.binary_plans(archs, "13.0.3")
    assert {bp.binary.target: bp.sass for bp in plans} == sass
    assert sum(bp.units for bp in plans) == units
    assert r.arch_problems(archs, "13.0.3") == []
    predicted = r.predicted_audit(archs, "13.0.3")
    # a binary switched off is not in the wheel, and the audit is not handed it
    built = [bp for bp in plans if not bp.switched_off]
    assert predicted.ok and len(predicted.binaries) == len(built) == (6 if 90 in archs or 80 in archs else 5)
    # infllm_ops at 10.x: not asked (upstream has no Blackwell code in it either), said so by the report
    infllm = next(b for b in predicted.binaries if "infllm_ops" in b.path)
    assert [res.arch for res in infllm.results] == [a for a in archs if a in (80, 86, 87, 88, 89, 90, 120)]
    # one SASS fewer in a binary a requested GPU loads, and the audit fails it: the plan is not vacuous
    for bp in built:
        scope = r.scope_of(bp.binary)
        if any(scope is None or scope.covers(a) for a in archs):
            thin = dataclasses.replace(r, binaries=tuple(
                dataclasses.replace(b, sass=tuple(x for x in b.sass if x not in bp.sass)) if b == bp.binary else b
                for b in r.binaries))
            assert thin.arch_problems(archs, "13.0.3"), bp.binary.target


# FlashAttention 3 off where no requested GPU loads it: kernel×arch units of sglang-kernel 0.4.10 (CUDA 13.0) with
# the switch left at its default (flash_ops keeps its first entry, sm_90a: 372 units) and passed OFF
FA3_OFF_UNITS = {(100,): (504, 132), (103,): (561, 189), (120,): (504, 132), (100, 103, 120): (597, 225)}
# the SASS the build is then predicted to carry (the audit step reports a predicted one that no binary carries)
FA3_OFF_SASS = {(100,): ("sm_90", "sm_100f"), (103,): ("sm_90", "sm_100f", "sm_103a"),
                (120,): ("sm_90", "sm_90a", "sm_120a"), (100, 103, 120): ("sm_90", "sm_100f", "sm_103a", "sm_120a")}


@pytest.mark.pure
@pytest.mark.parametrize("archs", sorted(FA3_OFF_UNITS), ids=lambda a: ",".join(map(str, a)))
def test_fa3_is_switched_off_for_arch_sets_no_gpu_of_which_loads_flash_ops(archs):
    r = recipe("sglang-kernel", "0.4.10")
    before, after = FA3_OFF_UNITS[archs]
    default = dataclasses.replace(r, binary_switches=())  # the CMake's default: FA3 on whatever --arch says
    assert sum(bp.units for bp in default.binary_plans(archs, "13.0")) == before
    assert next(bp for bp in default.binary_plans(archs, "13.0") if bp.binary.target == "flash_ops").units == 372
    assert sum(bp.units for bp in r.binary_plans(archs, "13.0")) == after == before - 372
    assert dict(r.knob_values(archs)) == {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_ENABLE_FA3": "OFF"}
    assert ("SGL_KERNEL_ENABLE_FA3", "OFF") in r.cmake_defines(archs)
    # flash_ops' fallback entry (sm_90a, which no requested GPU runs) is no longer predicted; at 12.0 FlashMLA's
    # own fallback is still sm_90a
    assert "sm_90a" in default.built_sass(archs, "13.0")
    assert r.built_sass(archs, "13.0") == FA3_OFF_SASS[archs]


@pytest.mark.pure
@pytest.mark.parametrize("archs, off", [((100,), True), ((103,), True), ((120,), True), ((100, 120), True),
                                        ((80, 90), False), ((90, 100), False)], ids=str)
def test_the_rendered_kernel_compile_passes_fa3_off_exactly_where_plan_says(archs, off):
    from builder import matrix as M
    from builder import plan as P
    from builder import render as R
    from builder import resolve

    from tests.helpers import MATRIX

    m = M.load(MATRIX)
    (cell,) = resolve.select(m, M.Selection(profiles=("cu130",), engines=("sglang",), archs=archs))
    text = R.render(P.plan_cells([cell], None)[0], m.defaults["index"])
    stage = text.split("AS build-sglang-kernel\n", 1)[1].split("\nFROM ", 1)[0]
    compile_run = stage[stage.index("pip wheel"):stage.index("&& ls -l /wheels")]  # the compile's command
    assert ("-Ccmake.define.SGL_KERNEL_ENABLE_FA3=OFF" in compile_run) == off
    assert "SGL_KERNEL_ENABLE_FA3=ON" not in text  # where FA3 stays, the CMake's own default holds


@pytest.mark.pure
@pytest.mark.parametrize("archs", [(80,), (86,), (89,), (90,), (80, 90), (90, 100), (89, 120)],
                         ids=lambda a: ",".join(map(str, a)))
def test_fa3_stays_at_its_default_where_a_requested_gpu_loads_flash_ops(archs):
    """Any GPU of flash_ops' family (sm_8x, 9.0) keeps FA3: no define is passed, the CMake default (ON) holds."""
    r = recipe("sglang-kernel", "0.4.10")
    assert "SGL_KERNEL_ENABLE_FA3" not in dict(r.knob_values(archs))
    assert "SGL_KERNEL_ENABLE_FA3" not in dict(r.cmake_defines(archs))
    assert next(bp for bp in r.binary_plans(archs, "13.0") if bp.binary.target == "flash_ops").sass


@pytest.mark.pure
def test_a_binary_switch_without_an_arch_scope_is_refused_in_one_line(tmp_path):
    """The switch's binary must have an arch_scoped entry: that entry alone says when it may be switched off."""
    from builder.engines import load_knowledge
    from builder.errors import UserError

    extra = tmp_path / "engines.toml"
    extra.write_text("""
[packages.kern]
pypi = "kern"
kind = "kernels"
template = "pip-wheel"
torch_pin = "none"
mem_gb_per_nvcc_thread = 1.0
[[packages.kern.rules]]
versions = ">=1"
source = "sdist"
arch_scoped = [{ files = "kern/a_ops*", archs = [90], why = "Hopper" }]
binary_switches = [{ files = "kern/b_ops*", cmake = "KERN_ENABLE_B", why = "b_ops" }]
""")
    with pytest.raises(UserError) as err:
        load_knowledge((str(extra),)).recipe("kern", "1.0")
    message = str(err.value)
    assert "\n" not in message and "KERN_ENABLE_B" in message and "'kern/b_ops*'" in message
    assert "no arch_scoped entry" in message
