"""builder warm against the stand-in engine server (tests/fixtures/smoke/stand_in: a TEST DOUBLE for a GPU engine,
which writes a few files with fixed content into each compile cache its variables name): the cold boot at the
image's empty cache root, the capture (exactly those files, nothing written outside the root), the warm image (one
layer, the same digest from the same files and labels, its labels), its warm boot, smoke L3's refusal of a warm
image whose boot compiles, and bad input. Real Docker daemon with buildx; traffic to 127.0.0.1 only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.errors import UserError


@pytest.mark.pure
def test_the_request_refuses_flags_that_do_not_go_together():
    from builder.deploy.runflags import RunFlags
    from builder.deploy.warm.capture import Request
    from builder.errors import UserError

    docker_run, process_run = RunFlags.convert(launcher="auto"), RunFlags.convert(launcher="process")
    with pytest.raises(UserError, match="--resume continues a cut cold boot on this host; --from-dir packs a capture: "
                                        "give one"):
        Request("cell", "MTP2", process_run, resume=True, from_dir=Path("warm/x"))
    with pytest.raises(UserError, match="--launcher process captures only"):
        Request("cell", "MTP2", process_run, registry="127.0.0.1:9/x")
    Request("cell", "MTP2", process_run, resume=True)  # each alone is fine
    Request("img:t", "MTP2", docker_run, registry="127.0.0.1:9/x", from_dir=Path("warm/x"))


@pytest.mark.pure
def test_the_results_print_as_the_verb_always_printed_them():
    from builder.deploy.warm.capture import Captured, Warmed

    warmed = Warmed(image="r/e:t-warm-mtp2-nogpu", digest="sha256:d", layer="sha256:l", of="sha256:o", files=3,
                    bytes=12, cold_boot_s=5.0, warm_boot_s=1.5, capture="warm/t-warm-mtp2-nogpu", pushed="",
                    cache_root="/opt/jit-cache")
    assert list(warmed.to_json()) == ["image", "digest", "layer", "of", "files", "bytes", "cold_boot_s", "warm_boot_s",
                                      "capture", "pushed"]
    assert warmed.text() == "r/e:t-warm-mtp2-nogpu sha256:d: 3 files under /opt/jit-cache, cold 5.0 s, warm 1.5 s"
    captured = Captured(capture="w/t-warm-mtp2-sm90", cache_root="/r", files=15, bytes=99, cold_boot_s=9.1,
                        cold_boots=2, warm_boot_s=1.0, layout=None, strategy="MTP2")
    assert list(captured.to_json()) == ["capture", "cache_root", "files", "bytes", "cold_boot_s", "cold_boots",
                                        "warm_boot_s", "layout"]
    assert captured.text() == ("w/t-warm-mtp2-sm90: 15 files, 99 bytes under /r, cold 9.1 s, warm 1.0 s; pack it "
                               "where the image is: builder warm IMAGE --strategy MTP2 --from-dir t-warm-mtp2-sm90")


# -- doctor --host and bench: the warm labels read back (no Docker) ---------------------------------------------
def test_doctor_host_judges_a_layer_without_a_key_as_a_miss_and_forged_labels_as_unknown():
    """Issue 45: a layer whose image records no key (made before builder recorded one) is never said to match: the
    first boot is judged cold, with the cold seconds measured where it was made. The judge's verdicts on real keys:
    tests/unit/deploy/test_warmjudge.py."""
    from builder.deploy import host
    from builder.deploy.runtime.gpus import Gpu
    from builder.image import labels

    lab = dict(labels.warm_written({"strategy": "MTP2", "gpu": "NVIDIA H200", "gpu-arch": "sm90", "driver": "580.95.05",
                                    "cold-boot-s": "500", "warm-boot-s": "52"}, "sha256:" + "a" * 64))
    h200 = Gpu(index=0, name="NVIDIA H200", driver="580.95.05", compute_cap=90, brand="NVIDIA", sm_count=132)
    (line,) = host.warm_match(h200, lab)
    assert "records no warm key" in line and "judged as a miss (cold boot 500 s measured)" in line, line
    assert host.warm_match(h200, {}) == []
    # issue 46 item 6: labels builder warm did not write are said to be so, never taken for a layer's facts
    for field, value in (("of", "../../x"), ("gpu-arch", "sm90; rm -rf"), ("warm-boot-s", "fast"), ("key", "{")):
        forged = {**lab, f"{labels.WARM}.{field}" if field != "of" else labels.WARM_OF: value}
        text = "\n".join(host.warm_match(h200, forged))
        assert ("did not write" in text or "not a key builder warm wrote" in text) and "judged as a miss" in text, text
        assert "reuses it" not in text


def test_bench_rows_carry_the_boot_state_and_diff_refuses_other_states():
    from builder.deploy.bench import results, run

    assert run.kv_cache_tokens("INFO GPU KV cache size: 4,096 tokens\n") == 4096
    assert run.kv_cache_tokens("nothing") is None
    old = {"environment": {}, "rows": [{"strategy": "MTP2", "workload": "w", "boot_state": "cold"}]}
    new = {"environment": {}, "rows": [{"strategy": "MTP2", "workload": "w", "boot_state": "warm"}]}
    assert "booted cold against warm" in results.comparable(old, new)[0]
    assert results.comparable(old, old) == []


@pytest.mark.pure
def test_a_hard_link_to_a_file_outside_the_capture_is_refused_and_one_inside_is_two_files(tmp_path):
    """Issue 46 item 2: a capture's tree holding a hard link to a host file (a second name of a file outside the
    tree) was packed with that file's bytes. Two names of one file inside the tree are fine: two files of the layer,
    copied as bytes."""
    from builder.deploy.warm import layer

    host_file = tmp_path / "host-secret"
    host_file.write_text("not a compiled file\n")
    tree = tmp_path / "cap" / "tree"
    (tree / "triton").mkdir(parents=True)
    (tree / "triton" / "k.cubin").write_bytes(b"sass")
    os.link(tree / "triton" / "k.cubin", tree / "triton" / "k-again.cubin")
    assert layer.file_list(tree) == {"triton/k-again.cubin": 4, "triton/k.cubin": 4}
    assert layer.copy_tree(tree, tmp_path / "copy") == {"triton/k-again.cubin": 4, "triton/k.cubin": 4}
    assert (tmp_path / "copy" / "triton" / "k-again.cubin").stat().st_nlink == 1
    os.link(host_file, tree / "triton" / "passwd")
    for call in (layer.file_list, lambda t: layer.copy_tree(t, tmp_path / "copy2")):
        with pytest.raises(UserError, match="hard link to a file outside"):
            call(tree)
    assert not (tmp_path / "copy2").exists()


def test_doctor_host_judges_the_h200_sglang_layer_by_its_recorded_key():
    """The key of the SGLang 0.5.17 layer captured on the H200 (2026-12-05, tests/fixtures/gpu-host): on an H100
    PCIe its caches still hit (none of them holds the GPU's name or SM count: Triton, FlashInfer, tvm-ffi's JIT under
    HOME key on the arch), on an A100 (sm80) every one compiles; the serve parts are said as the layer needs them."""
    import json

    from builder.deploy import host
    from builder.deploy.runtime.gpus import Gpu
    from builder.image import labels

    from tests.helpers import REPO

    facts = json.loads((REPO / "tests/fixtures/gpu-host/h200-2026-12-05-sglang-warm-layer/warm.json").read_text())
    lab = {labels.ENGINE: "sglang", labels.ENGINE_VERSION: "0.5.17",
           **dict(labels.warm_written({k: str(v) for k, v in facts.items() if k in labels.WARM_FIELDS},
                                      "sha256:" + "a" * 64))}
    h100 = host.warm_match(Gpu(0, "NVIDIA H100 PCIe", "580.65.06", 90, "NVIDIA", 114), lab)
    assert "every cache's key matches; the first boot reuses it (warm boot 38 s)" in h100[0]
    assert [ln.strip() for ln in h100[1:4]] == ["flashinfer (8 files): hit", "home (24 files): hit",
                                               "triton (429 files): hit"]
    assert "model /models/target" in h100[4] and "TP 1" in h100[4]
    a100 = host.warm_match(Gpu(0, "NVIDIA A100-SXM4-80GB", "580.65.06", 80, "NVIDIA", 108), lab)
    assert "the first boot is a cold one (cold boot 150.3 s measured" in a100[0]
    assert all(": compile: arch sm80 (the layer: sm90)" in ln for ln in a100[1:4]), a100


def test_doctor_host_judges_the_h100_27b_shape_layer_by_its_recorded_key():
    """The key of the vLLM 0.26.0 layer at the 27B shape captured on an H100 80GB HBM3 (2026-12-05): on the same
    GPU every cache hits; on an H200 (the same 132 SMs) vLLM's cache and Inductor compile, keyed on the GPU's name;
    on an H100 PCIe (114 SMs) DeepGEMM's kernels compile as well. Its capture's warm boot rewrote Inductor autotune
    records the data did not yet allow, so the key holds no warm-boot seconds: the judge says so, not a number."""
    import json

    from builder.deploy import host
    from builder.deploy.runtime.gpus import Gpu
    from builder.image import labels

    from tests.helpers import REPO

    facts = json.loads((REPO / "tests/fixtures/gpu-host/h100-2026-12-05-27b-shape-warm/warm.json").read_text())
    lab = {labels.ENGINE: "vllm", labels.ENGINE_VERSION: "0.26.0",
           **dict(labels.warm_written({k: str(v) for k, v in facts.items() if k in labels.WARM_FIELDS},
                                      "sha256:" + "a" * 64))}
    same = host.warm_match(Gpu(0, "NVIDIA H100 80GB HBM3", "580.159.04", 90, "NVIDIA", 132), lab)
    assert "every cache's key matches; the first boot reuses it (warm boot ?)" in same[0]
    assert all(ln.endswith(": hit") for ln in same[1:7]) and "deep_gemm (121 files)" in same[1]

    def compiles(gpu):
        said = host.warm_match(gpu, lab)
        assert "cold boot 980.3 s measured" in said[0]
        return {ln.split()[0] for ln in said[1:7] if ": compile: " in ln}

    assert compiles(Gpu(0, "NVIDIA H200", "580.159.04", 90, "NVIDIA", 132)) == {"inductor", "vllm"}
    assert compiles(Gpu(0, "NVIDIA H100 PCIe", "580.65.06", 90, "NVIDIA", 114)) == {"deep_gemm", "inductor", "vllm"}
