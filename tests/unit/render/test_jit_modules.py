"""The engine's own JIT modules (engine data jit_modules): what each shipped engine version builds at its first
requests, per GPU family, with the libraries those builds link; the runtime's unversioned links derived from that;
smoke's JIT layer building them inside the image through their own generators; jit = "prebuilt".

- pure: every shipped engine version lists every JIT path it can take, covered by the layer or why not; vLLM 0.33.0
  builds FlashInfer's fp8_blockscale_gemm_sm90 at sm_90 and its sampler at each arch; the runtime's links come from
  the modules' links (a module that links another library gets that link too); bad data is refused.
- docker: the fixture package as an engine with a JIT module of its own (tests/fixtures/cuda-ext/pkg/cuda_ext/jit.py,
  a generator shaped like FlashInfer's that links -lnvrtc against the real CUDA 13 nvrtc wheel). Its image passes
  the JIT layer; the same image with the unversioned links removed (the runtime as it was: libcudart.so only) fails
  it with the linker's own `cannot find -lnvrtc`; the jit = "prebuilt" image compiles nothing at smoke (one cell
  build: the prebuilt image smoked as the first-request cell is that runtime at its first request). What
  prebuilding costs is benchmarks/jit_modules.py's figure (slow).
- slow: the real vLLM 0.33.0 index image: FlashInfer's own generators build in it, and fail without the links.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from builder import plan, render
from builder.engines import load_knowledge
from builder.errors import UserError
from builder.matrix import Selection, load
from builder.resolve import select

from tests.helpers import MATRIX
from tests.support.jit_modules import FIXTURE, JIT_MATRIX, rendered


def shipped():
    m = load(MATRIX)
    return m, select(m, Selection(profiles=("all",)))


def cell_of(cells, prefix):
    return next(c for c in cells if c.id.startswith(prefix))


@pytest.mark.pure
@pytest.mark.parametrize("cell", shipped()[1], ids=lambda c: c.id)
def test_every_jit_path_of_every_shipped_engine_version_is_covered_or_says_why_not(cell):
    paths = cell.engine_recipe.jit_paths
    assert paths, f"{cell.engine} {cell.version} lists no JIT path"
    for path, covered_by, not_covered in paths:
        assert bool(covered_by) != bool(not_covered), path
        if covered_by.startswith("serve_jit."):
            assert covered_by.split(".", 1)[1] in [p["name"] for p in cell.serve_jit]
        elif covered_by:
            assert covered_by == "jit_modules" and cell.jit_builds
    assert any(c.startswith("serve_jit.triton") for _, c, _ in paths)


@pytest.mark.pure
def test_vllm_0_33_builds_flashinfer_fp8_blockscale_at_sm90_and_the_runtime_links_what_its_modules_link():
    m, cells = shipped()
    vllm = cell_of(cells, "vllm-0.33.0-")
    builds = {b["name"]: b for b in vllm.jit_builds}
    fp8 = builds["flashinfer-fp8-blockscale-gemm-sm90"]
    assert fp8["archs"] == [90] and fp8["generator"] == \
        "flashinfer.jit.gemm.fp8_blockscale:gen_fp8_blockscale_gemm_sm90_module"
    assert fp8["links"] == ["cudart", "cuda", "nvrtc"] and "kernels/linear/__init__.py" in fp8["selected_by"]
    assert builds["flashinfer-sampling"]["archs"] == [80, 90]
    # listed, linked, not built: the cuBLAS GEMM (per-tensor FP8 only) and the fused MoE (a dense model class)
    listed = {x["name"]: x for x in vllm.jit_modules}
    assert listed["flashinfer-gemm-cublas"]["not_built"] and listed["flashinfer-cutlass-fused-moe-sm90"]["not_built"]
    assert vllm.jit_links == ("cudart", "nvrtc", "cublas", "cublasLt")
    text = rendered(m, vllm)
    for lib in ("cudart", "nvrtc", "cublas", "cublasLt"):
        assert f'ln -sfn "${{f##*/}}" "$root/lib/lib{lib}.so"' in text
    assert '-L"$CUDA_HOME/lib64" -lcudart -lnvrtc -lcublas -lcublasLt' in text
    assert ("  jit       flashinfer-fp8-blockscale-gemm-sm90 sm_90; flashinfer-sampling sm_80,sm_90; flashinfer-topk "
            "sm_80,sm_90 (at the first request); links -lcudart -lnvrtc -lcublas -lcublasLt") in \
        plan.format_plan(plan.plan_cells([vllm], None))
    assert builds["flashinfer-topk"]["strategy"] == "DFlash2"  # the strategy's module, not the release's
    sglang = cell_of(cells, "sglang-0.5.23-")
    assert [b["name"] for b in sglang.jit_builds] == [
        "flashinfer-sampling", "sglang-activation", "sglang-causal-conv1d", "sglang-gptq-marlin",
        "sglang-gptq-marlin-repack", "sglang-communicator", "sglang-speculative-sampling", "sglang-speculative-tree",
        "flashinfer-topk"]
    assert sglang.jit_links == ("cudart", "nvrtc")  # fp8_blockscale listed (not built by default): its -lnvrtc
    for old in ("vllm-0.6.3", "sglang-0.3.2"):
        c = cell_of(cells, old)
        assert not c.jit_modules and "libnvrtc" not in rendered(m, c)


@pytest.mark.pure
def test_sglang_0_5_23_builds_its_own_kernels_through_its_loaders_per_family_and_strategy():
    """SGLang's own JIT (sglang.kernels.jit, read in the 0.5.23 wheel) is a framework of its own: one target per
    process through override_jit_cuda_arch, its cache SGLANG_JIT_CACHE_DIR under the image's one JIT cache root; Marlin
    only on 8.x; the verify kernel only with a speculative strategy; DFlash2's FlashInfer top-k only with DFlash2."""
    m, cells = shipped()
    sglang = cell_of(cells, "sglang-0.5.23-")
    mods = {x["name"]: x for x in sglang.jit_modules}
    act = mods["sglang-activation"]
    assert act["framework"] == "sglang" and act["arch_context"] == "sglang.kernels.jit.utils.arch:override_jit_cuda_arch"
    assert act["cache_env"] == "SGLANG_JIT_CACHE_DIR" and act["cache_dir"] == "/opt/jit-cache/sglang"
    assert act["objects"] == {"dtype": "torch.bfloat16"} and act["arch_scope"] == "device" and not act["arch_env"]
    assert act["answer_gpu"] == ["sglang.kernels.jit.utils.arch:is_cuda"]
    assert mods["flashinfer-sampling"]["cache_dir"] == "/opt/jit-cache/flashinfer"  # one root for every framework
    builds = {b["name"]: b for b in sglang.jit_builds}
    assert builds["sglang-gptq-marlin"]["archs"] == [80] and builds["sglang-gptq-marlin-repack"]["archs"] == [80]
    assert builds["sglang-causal-conv1d"]["archs"] == [80, 90] and "gdn_backend.py" in builds["sglang-causal-conv1d"]["selected_by"]
    assert builds["sglang-speculative-sampling"]["kwargs"] == {"vec_size": 4, "deterministic": True}
    assert builds["sglang-speculative-sampling"]["strategy"] == "MTP2, MTP7, DFlash2"
    assert builds["flashinfer-topk"]["strategy"] == "DFlash2" and "dflash.py" in builds["flashinfer-topk"]["selected_by"]
    # shape-keyed variants: listed with the reason they are not built
    assert "row" in mods["sglang-kvcache"]["not_built"] and mods["sglang-per-token-group-quant"]["not_built"]
    # TP > 1's custom all-reduce: the communicator is built (no arguments); the all-reduce kernel is keyed by the world
    # size and the IPC module needs the driver to load, so both are listed with why not
    assert "world size" in mods["sglang-custom-all-reduce"]["not_built"] and "libcuda" in mods["sglang-cuda-ipc"]["not_built"]
    assert builds["sglang-communicator"]["strategy"] == "" and builds["sglang-speculative-tree"]["strategy"] == "MTP2, MTP7"
    # a cell without DFlash2 gets no top-k; one without any strategy no verify kernel either
    kn = load_knowledge()
    eng = sglang.engine_recipe
    assert "flashinfer-topk" not in [x["name"] for x in kn.jit_modules_of(eng, ("MTP2",))]
    assert "sglang-speculative-sampling" not in [x["name"] for x in kn.jit_modules_of(eng, ())]
    # per arch at the first request; a prebuilt image builds the device-scoped framework once per arch too
    assert sglang.jit_runs(builds["sglang-activation"]) == (("sm_80", "8.0"), ("sm_90", "9.0"))
    pre = dataclasses.replace(sglang, jit_prebuilt=True)
    assert pre.jit_runs(builds["sglang-activation"]) == (("sm_80", "8.0"), ("sm_90", "9.0"))
    assert pre.jit_runs(builds["flashinfer-sampling"]) == (("sm_80+sm_90", "8.0 9.0"),)
    text = render.render(plan.plan_cells([pre], None)[0], m.defaults["index"])
    assert 'ENV FLASHINFER_CUDA_ARCH_LIST="8.0 9.0" FLASHINFER_WORKSPACE_BASE="/opt/jit-cache/flashinfer" ' \
           'SGLANG_JIT_CACHE_DIR="/opt/jit-cache/sglang"' in text
    assert text.count('"generator"') == 0 and text.count('"function": "activation_module"') == 2
    assert '"arch": "8.0", "arch_context": "sglang.kernels.jit.utils.arch:override_jit_cuda_arch"' in text
    assert " && chmod -R a+rwX /opt/jit-cache\n" in text


@pytest.mark.pure
def test_plan_for_blackwell_names_the_trtllm_gen_attention_path_and_its_network_need(tmp_path):
    """vLLM 0.33.0 on 10.x serves Qwen3.5 with FlashInfer attention through TRT-LLM-gen (fmha_gen + cubins and a header
    from NVIDIA's artifactory); plan --arch 100 says so, with the network it needs."""
    m = load(MATRIX)
    (cell,) = select(m, Selection(engines=("vllm",), archs=(100,)))  # what `plan --engine vllm --arch 100` selects
    out = plan.format_plan(plan.plan_cells([cell], None))
    assert "flashinfer-trtllm-fmha-gen sm_100 at the first request (not built by smoke or a prebuild)" in out, out
    assert "network   flashinfer-trtllm-fmha-gen: the generator fetches checksums.txt and include/flashInferMetaInfo.h" \
           in out and "artifactory" in out


def _knowledge_copy(tmp_path: Path, edit) -> Path:
    """The fixture matrix with its knowledge file edited."""
    (tmp_path / "pkg").symlink_to(FIXTURE / "pkg")
    (tmp_path / "engines-jit-modules.toml").write_text(edit((FIXTURE / "engines-jit-modules.toml").read_text()))
    mat = tmp_path / "matrix.toml"
    mat.write_text(JIT_MATRIX.read_text())
    return mat


@pytest.mark.pure
def test_the_links_are_derived_from_the_modules_links(tmp_path):
    mat = _knowledge_copy(tmp_path, lambda t: t.replace('links = ["nvrtc", "cuda"]', 'links = ["nvrtc", "cufft", "cuda"]'))
    m = load(mat)
    cell = select(m, Selection())[0]
    assert cell.jit_links == ("cudart", "nvrtc", "cufft")
    text = rendered(m, cell)
    assert 'ln -sfn "${f##*/}" "$root/lib/libcufft.so"' in text and "-lcudart -lnvrtc -lcufft" in text


@pytest.mark.pure
@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('module = "cuda-ext-nvrtc"', 'module = "cuda-ext-nvrct"'),
     r"jit_modules 'cuda-ext-nvrct' .* defined nowhere.*did you mean 'cuda-ext-nvrtc'"),
    (lambda t: t.replace('covered_by = "serve_jit.flashinfer"', 'covered_by = "serve_jit.triton"'),
     r"covered_by 'serve_jit.triton', which this version does not have"),
    (lambda t: t.replace('generator = "cuda_ext.jit:gen_nvrtc_module"', 'generator = "cuda_ext.jit.gen_nvrtc_module"'),
     r"generator.*module:function"),
    (lambda t: t.replace('links = ["nvrtc", "cuda"]', 'links = ["-lnvrtc"]'), r"library name"),
    (lambda t: t.replace('{ path = "cuda_ext.jit modules", covered_by = "jit_modules" }',
                         '{ path = "cuda_ext.jit modules", covered_by = "jit_modules", not_covered = "x" }'),
     r"covered_by|not_covered"),
])
def test_bad_jit_data_is_refused(tmp_path, edit, message):
    mat = _knowledge_copy(tmp_path, edit)
    with pytest.raises(UserError, match=message):
        select(load(mat), Selection())


@pytest.mark.pure
def test_jit_prebuilt_renders_one_generator_build_per_module_and_arch(tmp_path):
    m = load(JIT_MATRIX)
    (cell,) = select(m, Selection(profiles=("prebuilt",)))
    assert cell.jit_prebuilt and cell.id.endswith("-jitprebuilt")
    text = rendered(m, cell)
    # the framework names its cache after the arch set (as FlashInfer does): the image pins the list to the cell's
    # archs, one build for that set, into the one JIT cache root, then the cache is opened to every user
    assert 'ENV CUDA_EXT_JIT_ARCH_LIST="8.0 9.0" CUDA_EXT_JIT_HOME="/opt/jit-cache/cuda_ext"' in text
    runs = re.findall(r"^(?:RUN| &&) CUDA_EXT_JIT_ARCH_LIST=\"([^\"]+)\" python -c .*gen_nvrtc_module.*$", text, re.M)
    assert runs == ["8.0 9.0"]
    assert " && chmod -R a+rwX /opt/jit-cache\n" in text
    assert [(b["name"], cell.jit_runs(b)) for b in cell.jit_builds] == [("cuda-ext-nvrtc", (("sm_80+sm_90", "8.0 9.0"),))]
    (local,) = select(m, Selection(profiles=("local",)))
    assert not local.jit_prebuilt and "CUDA_EXT_JIT_HOME" not in rendered(m, local)
    # at the first request (smoke's JIT layer): one build per arch, as a host of one GPU family builds it
    assert [local.jit_runs(b) for b in local.jit_builds] == [(("sm_80", "8.0"), ("sm_90", "9.0"))]
    bad = tmp_path / "matrix.toml"
    (tmp_path / "pkg").symlink_to(FIXTURE / "pkg")
    (tmp_path / "engines-jit-modules.toml").symlink_to(FIXTURE / "engines-jit-modules.toml")
    bad.write_text(JIT_MATRIX.read_text().replace('jit = { cuda-ext = "prebuilt" }', 'jit = { cuda-ext = "ahead" }'))
    with pytest.raises(UserError, match=r"profiles.prebuilt.jit.cuda-ext.*first-request, prebuilt"):
        load(bad)
