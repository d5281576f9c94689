"""builder doctor --host: which image runs on which GPU, judged from the image's config and labels (never pulled)
and nvidia-smi's view of the GPU, with the rules of builder/data/host.toml — against 22 (driver, GPU) pairs
(tests/fixtures/host/gpus.toml) and the configs of real cells (tests/fixtures/host/images/, written from
render.labels by make_images.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from builder.deploy.runtime import gpus as gpus_mod
from builder.deploy import host

from tests.helpers import REPO
from tests.support.host import FIX

GPUS = {k: gpus_mod.Gpu.from_json(v) for k, v in tomllib.loads((FIX / "gpus.toml").read_text()).items()}
IMG = {
    "v121": "vllm-0.6.3.post1-cu121-torch2.4.0-py310-sm80",
    "v80": "vllm-0.33.0-cu130-torch2.14.0-py312-sm80",
    "v8090": "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90",
    "v90": "vllm-0.33.0-cu130-torch2.14.0-py312-sm90",
    "sg": "sglang-0.5.23-cu130-torch2.14.1-py312-sm80.90",
}


def facts(key: str) -> host.ImageFacts:
    return host.image_facts(str(FIX / "images" / f"{IMG[key]}.json"))


R, C, X = host.RUNS, host.COMPAT, host.REFUSED
CASES = [  # gpu, image, verdict, words of the deciding rule
    ("h200-580", "v8090", R, "CUDA 13.0 needs driver >= 580.65.06; GPU 0 has 580.159.04"),
    ("h200-580", "v80", X, "sm_80 runs on 8.0–8.9 only"),
    ("h200-580", "v121", X, "no kernel image is available"),
    ("h200-580", "v90", R, "580.159.04"),
    ("h200-580", "sg", R, "580.65.06"),
    ("h200-575", "v8090", C, "forward compatibility: NVIDIA is a data-center brand"),
    ("h100-550", "v8090", C, "at least 535.54.03"),
    ("h100-535", "v8090", C, "GPU 0 has 535.161.08"),
    ("h100-580", "v8090", R, "GPU 0 has 580.65.06"),
    ("h100-550", "v121", X, "vllm has no device code for compute capability 9.0"),
    ("a100-550", "v8090", C, "CUDA 13.0 needs driver >= 580.65.06"),
    ("a100-550", "v121", R, "CUDA 12.1 needs driver >= 530.30.02; GPU 0 has 550.54.15"),
    ("a100-550", "v90", X, "sm_90 runs on 9.0–9.9 only"),
    ("a100-470", "v121", C, "at least 470.57.02"),
    ("a100-470", "v8090", X, "cuda-compat-13-0 supports drivers from 535.54.03"),
    ("a100-525", "v121", C, "GPU 0 has 525.147.05"),
    ("a100-570", "v121", R, "530.30.02"),
    ("a10g-535", "v8090", C, "535.183.01"),
    ("a10g-535", "v90", X, "compute capability 8.6"),
    ("l4-550", "v80", C, "535.54.03"),
    ("l40s-580", "v8090", R, "580.82.07"),
    ("l40s-580", "sg", R, "580.82.07"),
    ("t4-535", "v121", X, "compute capability 7.5"),
    ("v100-450", "v121", X, "compute capability 7.0"),
    ("rtx4090-550", "v8090", X, "forward compatibility is for data-center GPUs only (GeForce is not one)"),
    ("rtx4090-550", "v121", R, "550.120"),
    ("rtx3090-535", "v121", R, "535.183.01"),
    ("rtx5090-575", "v8090", X, "compute capability 12.0"),
    ("rtx5090-575", "sg", X, "flash-attn has no device code for compute capability 12.0"),
    ("rtx5090-580", "v8090", X, "sm_90 runs on 9.0–9.9 only"),
    ("b200-570", "v8090", X, "compute capability 10.0"),
    ("b200-580", "sg", X, "flash-attn has no device code for compute capability 10.0"),
    ("gh200-560", "v8090", C, "560.35.03"),
    ("rtxa6000-535", "v8090", X, "NVIDIA RTX is not one"),
]


@pytest.mark.pure
def test_the_cases_cover_twenty_gpu_driver_pairs():
    assert len({g for g, *_ in CASES}) >= 20 and set(GPUS) == {g for g, *_ in CASES}


@pytest.mark.pure
@pytest.mark.parametrize("gpu,image,verdict,words", CASES, ids=[f"{g}-{i}" for g, i, *_ in CASES])
def test_verdict_and_the_rule_that_decided_it(gpu, image, verdict, words):
    v = host.judge(GPUS[gpu], facts(image))
    assert (v.verdict, words in v.rule) == (verdict, True), v.rule


@pytest.mark.pure
def test_forward_compat_names_the_package_and_the_container_runtimes_clause():
    v = host.judge(GPUS["h100-550"], facts("v8090"))
    assert "cuda-compat-13-0" in v.fix
    assert any("brand=nvidia,driver>=550,driver<551" in d for d in v.details)
    # no clause of the image's NVIDIA_REQUIRE_CUDA names the 560 branch: the runtime itself would refuse the start
    v = host.judge(GPUS["gh200-560"], facts("v8090"))
    assert any("unsatisfied condition: cuda>=13.0" in d for d in v.details)


def _image(labels: dict, cuda: str = "12.8.1") -> host.ImageFacts:
    return host.ImageFacts("synthetic", "file", {"CUDA_VERSION": cuda}, labels)


@pytest.mark.pure
def test_ptx_is_jit_compiled_for_newer_gpus_only_with_a_driver_as_new_as_the_ptx():
    ptx_only = _image({"io.builder.package.k.ptx": "compute_80"})
    v = host.judge(GPUS["h200-580"], ptx_only)
    assert v.verdict == R and any("compute_80 PTX is JIT-compiled" in d for d in v.details)
    v = host.judge(GPUS["rtx4090-550"], ptx_only)  # CUDA 12.8 PTX, a 550 driver, GeForce: no compat either
    assert v.verdict == X and "PTX JIT needs a driver at least as new as the PTX" in v.rule
    assert host.judge(GPUS["a100-550"], _image({"io.builder.package.k.ptx": "compute_90"})).verdict == X


@pytest.mark.pure
def test_arch_specific_targets_run_only_on_their_exact_gpu_and_family_targets_within_the_family():
    a = _image({"io.builder.package.k.sass": "sm_90a"}, "13.0.3")
    assert host.judge(GPUS["h200-580"], a).verdict == R
    assert "sm_90a runs only on 9.0" in host.judge(GPUS["b200-580"], a).rule
    f = _image({"io.builder.package.k.sass": "sm_100f"}, "13.0.3")
    assert host.judge(GPUS["b200-580"], f).verdict == R
    assert host.judge(GPUS["rtx5090-580"], f).verdict == X


@pytest.mark.pure
def test_an_image_without_package_labels_is_judged_by_its_archs_label_and_one_from_the_index_is_not_judged():
    assert host.judge(GPUS["h200-580"], _image({"io.builder.archs": "80"}, "13.0.3")).verdict == X
    v = host.judge(GPUS["h200-580"], _image({"io.builder.package.vllm.sass": "from-index"}, "13.0.3"))
    assert v.verdict == R and any("from the index" in d for d in v.details)
    assert host.judge(GPUS["h200-580"], host.ImageFacts("x", "file")).verdict == host.UNKNOWN


@pytest.mark.pure
def test_nvidia_smi_output_is_read_with_the_brand_of_each_gpu():
    csv = "0, NVIDIA H200, 580.159.04, 9.0\n1, NVIDIA H200, 580.159.04, 9.0\n"
    q = "GPU 00000000:18:00.0\n    Product Name : NVIDIA H200\n    Product Brand : NVIDIA\n" * 2
    gpus = gpus_mod.parse_nvidia_smi(csv, q)
    assert [(g.index, g.compute_cap, g.brand) for g in gpus] == [(0, 90, "NVIDIA"), (1, 90, "NVIDIA")]


@pytest.mark.pure
def test_the_h200_hosts_recorded_nvidia_smi_output_reads_as_the_h200_case():
    """nvidia-smi as the H200 test host printed it on 2026-12-01 (tests/fixtures/gpu-host/)."""
    text = (REPO / "tests" / "fixtures" / "gpu-host" / "h200-2026-12-01-nvidia-smi.txt").read_text()
    csv = "\n".join(ln.rsplit(",", 1)[0] for ln in text.splitlines() if ln.startswith("0, "))
    assert gpus_mod.parse_nvidia_smi(csv, text) == [GPUS["h200-580"]]


@pytest.mark.pure
def test_min_driver_per_cuda_release_is_data():
    d = host.rules()["cuda"]["min_driver"]
    assert {k: d[k] for k in ("12.1", "12.4", "12.8", "12.9", "13.0")} == {
        "12.1": "530.30.02", "12.4": "550.54.14", "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}


def test_the_verb_reads_a_gpus_file_prints_verdicts_and_exits_1_on_a_refusal(tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([tomllib.loads((FIX / "gpus.toml").read_text())["h200-580"]]))
    run = lambda *a: subprocess.run([sys.executable, "-m", "builder.cli", "doctor", "--host", *a], cwd=REPO,
                                    capture_output=True, text=True, timeout=120)
    ok = run(str(FIX / "images" / f"{IMG['v8090']}.json"), "--gpus-file", str(gpus))
    assert ok.returncode == 0 and "RUNS" in ok.stdout, ok.stdout + ok.stderr
    bad = run(str(FIX / "images" / f"{IMG['v80']}.json"), str(FIX / "images" / f"{IMG['v8090']}.json"),
              "--gpus-file", str(gpus), "--json")
    assert bad.returncode == 1, bad.stderr
    verdicts = [v["verdict"] for v in json.loads(bad.stdout)["verdicts"]]
    assert verdicts == [host.REFUSED, host.RUNS]
    missing = run("no-such-image.json", "--gpus-file", str(gpus))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def _audited(package: str, version: str, binaries: dict[str, list[tuple[int, str]]]) -> dict[str, str]:
    """The labels of one package as the image step writes them: labels.audit_values of an audit whose binaries
    carry these SASS entries (path -> [(arch, variant)])."""
    from builder.image import labels
    from builder.audit import AuditReport, BinaryReport, FatbinEntry

    report = AuditReport("wheel", (80, 90), [
        BinaryReport(path, tuple(FatbinEntry("sass", a, v, False) for a, v in sass), ()) for path, sass in binaries.items()])
    values = labels.audit_values(package, report)
    return {labels.package(package, "version"): version,
            **{labels.package(package, what): values[labels.audit_arg(package, what)] for what in labels.AUDITED}}


def test_a_package_whose_binaries_differ_is_judged_binary_by_binary_with_the_data_arch_scopes():
    # sglang-kernel 0.4.10 built for 80,90: no SASS common to every binary, so the package labels say nothing and
    # only .binaries does; its sm90/ copy loads on 9.0 only, the sm100/ copy everywhere else (engine data)
    kernel = {"sgl_kernel/sm90/common_ops.abi3.so": [(90, "a")], "sgl_kernel/sm100/common_ops.abi3.so": [(80, "")],
              "sgl_kernel/flash_ops.abi3.so": [(80, ""), (90, "a")], "sgl_kernel/spatial_ops.abi3.so": [(80, ""), (90, "")]}
    labels = _audited("sglang-kernel", "0.4.10", kernel)
    assert labels["io.builder.package.sglang-kernel.sass"] == ""  # what a package-level reading would judge by
    img = _image(labels)
    for gpu in ("h200-580", "a100-570", "l40s-580"):
        v = host.judge(GPUS[gpu], img)
        assert v.verdict == R, (gpu, v)
    assert any("sm100/common_ops.abi3.so: not loaded on 9.0" in d for d in host.judge(GPUS["h200-580"], img).details)
    assert any("sm90/common_ops.abi3.so: not loaded on 8.0" in d for d in host.judge(GPUS["a100-570"], img).details)
    # built for 90 only: the copy every other GPU loads has no code, and spatial_ops has sm_90 only
    only90 = _audited("sglang-kernel", "0.4.10", {"sgl_kernel/sm90/common_ops.abi3.so": [(90, "a")],
                                                  "sgl_kernel/spatial_ops.abi3.so": [(90, "")],
                                                  "sgl_kernel/flash_ops.abi3.so": [(90, "a")]})
    v = host.judge(GPUS["a100-570"], _image(only90))
    assert v.verdict == X and "no kernel image is available" in v.rule and "compute capability 8.0 (sm_90" in v.rule
    # an unscoped binary that lacks the GPU's code refuses the image even when the others have it
    broken = _audited("sglang-kernel", "0.4.10", {**kernel, "sgl_kernel/spatial_ops.abi3.so": [(90, "")]})
    v = host.judge(GPUS["a100-570"], _image(broken))
    assert v.verdict == X and "sglang-kernel sgl_kernel/spatial_ops.abi3.so has no device code for compute capability 8.0" in v.rule
    # a package the engine data does not know is judged binary by binary without scopes
    v = host.judge(GPUS["h200-580"], _image(_audited("unknown-kernels", "1.0", kernel)))
    assert v.verdict == X and "sm100/common_ops" in v.rule


def test_the_sm_count_comes_from_the_cuda_driver_or_is_not_known():
    """Issue 45: DeepGEMM keys its kernels on the SM count, so doctor --host, serve and warm read it from the CUDA
    driver itself (cuDeviceGetAttribute), never from a table of names. Where the driver library does not load (this
    CPU host) nothing is guessed: the GPU's count stays unknown, and a --gpus-file record may state it or not."""
    from builder.deploy.runtime import gpus as gpus_mod
    from builder.errors import UserError

    assert gpus_mod.sm_counts({"0": "00000000:18:00.0"}, lib="libcuda-not-here.so.1") == {}
    rec = gpus_mod.Gpu.from_json({"name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0", "sm_count": 132})
    assert rec.sm_count == 132
    assert gpus_mod.Gpu.from_json({"name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0"}).sm_count is None
    with pytest.raises(UserError, match="sm_count: 0 is out of range"):
        gpus_mod.Gpu.from_json({"name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0", "sm_count": 0})
