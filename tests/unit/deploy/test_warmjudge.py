"""The one warm judge (builder/deploy/runtime/warmjudge.py) on the shipped key data (builder/data/warmkeys.toml): a
layer captured as the H200 capture of 2026-12-04 was (vLLM 0.26.0, the tiny block-FP8 model, MTP2, the engine's
defaults, driver 580.159.04) judged for 25 other serves, cache by cache. Each row names the part that differs and
the test checks that the verdict cites the upstream line that puts that part into the cache's key (the `at` of the
key data: file:line read in the wheels), so a row is traced to the key it follows, not to this table."""

from __future__ import annotations

import dataclasses

import pytest

from builder.deploy.runtime import warmkey
from builder.deploy.runtime.gpus import Gpu
from builder.deploy.runtime.warmjudge import COMPILE, HIT, UNKNOWN, judge, side

H200 = Gpu(0, "NVIDIA H200", "580.159.04", 90, "NVIDIA", 132)
SPEC2 = '{"method":"mtp","num_speculative_tokens":2}'
ARGS = ("/models/target", "--host", "127.0.0.1", "--port", "41111", "--load-format", "dummy", "--max-model-len", "512",
        "--gpu-memory-utilization", "0.3", "--max-num-seqs", "16", "--language-model-only", "--speculative-config", SPEC2,
        "--gdn-prefill-backend", "triton")
ENV = {"VLLM_USE_DEEP_GEMM": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
CONFIG = "c0" * 32
# files per cache as the capture held them (the CUDA driver cache was empty on the H200: SASS for every kernel)
CACHES = {"vllm": 40, "triton": 1498, "inductor": 12, "deep_gemm": 220, "flashinfer": 31, "home": 2, "cuda": 0}
RECORD = warmkey.Record.of(H200, ARGS, ENV, CONFIG, frozenset({"rank_0_0"}), CACHES)
JUDGED = ("deep_gemm", "flashinfer", "home", "inductor", "triton", "vllm")  # the caches with files


def serve(*, gpu=H200, args=ARGS, env=ENV, config=CONFIG, drop=(), add=()):
    """A serve's side: the capture's launch line on port 8000 of 0.0.0.0, less the flags in `drop`, plus `add`."""
    out, i = [], 0
    a = list(args)
    while i < len(a):
        if a[i] in drop:
            i += 2 if i + 1 < len(a) and not a[i + 1].startswith("-") else 1
            continue
        out.append({"41111": "8000", "127.0.0.1": "0.0.0.0"}.get(a[i], a[i]))
        i += 1
    return side(gpu, warmkey.data().flags_of("vllm", "0.26.0"), out + list(add), env, set(), config)


def g(name, sm, cc=90, driver="580.159.04"):
    return Gpu(0, name, driver, cc, "NVIDIA", sm)


# (id, the serve, {cache: (verdict, parts that differ or are unknown)}; every cache not named: a hit)
ROWS = [
    ("as-captured", serve(), {}),
    ("another-driver", serve(gpu=g("NVIDIA H200", 132, driver="580.65.06")), {}),  # Triton, DeepGEMM hold no driver
    ("h100-sxm", serve(gpu=g("NVIDIA H100 80GB HBM3", 132)),
     {"vllm": (COMPILE, {"gpu-name"}), "inductor": (COMPILE, {"gpu-name"})}),
    ("h200-nvl", serve(gpu=g("NVIDIA H200 NVL", 132)),
     {"vllm": (COMPILE, {"gpu-name"}), "inductor": (COMPILE, {"gpu-name"})}),
    ("h100-pcie", serve(gpu=g("NVIDIA H100 PCIe", 114)),
     {"vllm": (COMPILE, {"gpu-name"}), "inductor": (COMPILE, {"gpu-name"}), "deep_gemm": (COMPILE, {"sm-count"})}),
    ("h20", serve(gpu=g("NVIDIA H20", 78)),
     {"vllm": (COMPILE, {"gpu-name"}), "inductor": (COMPILE, {"gpu-name"}), "deep_gemm": (COMPILE, {"sm-count"})}),
    ("a100", serve(gpu=g("NVIDIA A100-SXM4-80GB", 108, cc=80)),
     {"vllm": (COMPILE, {"gpu-name", "arch"}), "inductor": (COMPILE, {"gpu-name"}),
      "deep_gemm": (COMPILE, {"sm-count", "arch"}), "triton": (COMPILE, {"arch"}), "flashinfer": (COMPILE, {"arch"})}),
    ("sm-count-not-read", serve(gpu=dataclasses.replace(H200, sm_count=None)), {"deep_gemm": (UNKNOWN, {"sm-count"})}),
    ("gpu-not-known", serve(gpu=None),
     {"vllm": (UNKNOWN, {"gpu-name", "arch"}), "inductor": (UNKNOWN, {"gpu-name"}), "triton": (UNKNOWN, {"arch"}),
      "deep_gemm": (UNKNOWN, {"sm-count", "arch"}), "flashinfer": (UNKNOWN, {"arch"})}),
    ("another-model", serve(config="d1" * 32),
     {c: (COMPILE, {"model-config"}) for c in ("vllm", "triton", "inductor", "deep_gemm", "flashinfer")}),
    ("model-config-on-a-claim", serve(config=None),
     {c: (UNKNOWN, {"model-config"}) for c in ("vllm", "triton", "inductor", "deep_gemm", "flashinfer")}),
    ("another-model-path", serve(args=("/models/qwen",) + ARGS[1:]), {"vllm": (COMPILE, {"model-path"})}),
    ("max-model-len", serve(drop=("--max-model-len",), add=("--max-model-len", "4096")),
     {"vllm": (COMPILE, {"max-model-len"})}),
    ("max-num-seqs", serve(drop=("--max-num-seqs",), add=("--max-num-seqs", "64")), {"vllm": (COMPILE, {"max-num-seqs"})}),
    ("max-num-batched-tokens", serve(add=("--max-num-batched-tokens", "8192")),
     {"vllm": (COMPILE, {"max-num-batched-tokens"}), "deep_gemm": (COMPILE, {"max-num-batched-tokens"})}),
    ("tp2", serve(add=("-tp", "2")),
     {"vllm": (COMPILE, {"tp", "rank"}), "triton": (COMPILE, {"tp"}), "inductor": (COMPILE, {"tp"}),
      "deep_gemm": (COMPILE, {"tp"})}),
    ("kv-cache-fp8", serve(add=("--kv-cache-dtype", "fp8")),
     {"vllm": (COMPILE, {"kv-cache-dtype"}), "triton": (COMPILE, {"kv-cache-dtype"}),
      "flashinfer": (COMPILE, {"kv-cache-dtype"})}),
    ("mtp7", serve(drop=("--speculative-config",), add=("--speculative-config",
                                                         '{"method":"mtp","num_speculative_tokens":7}')),
     {"vllm": (COMPILE, {"speculative"}), "triton": (COMPILE, {"speculative"})}),
    ("same-spec-in-another-key-order", serve(drop=("--speculative-config",), add=(
        "--speculative-config", '{"num_speculative_tokens": 2, "method": "mtp"}')), {}),
    ("enforce-eager", serve(add=("--enforce-eager",)), {"vllm": (COMPILE, {"cuda-graphs"})}),
    ("other-gdn-backend", serve(drop=("--gdn-prefill-backend",), add=("--gdn-prefill-backend", "flashinfer")),
     {"vllm": (COMPILE, {"engine-args"})}),
    ("explicit-dtype", serve(add=("--dtype", "bfloat16")),  # the default said aloud: the judge cannot know it is one
     {c: (COMPILE, {"dtype"}) for c in ("vllm", "triton", "inductor", "flashinfer")}),
    ("deep-gemm-off", serve(env={**ENV, "VLLM_USE_DEEP_GEMM": "0"}),
     {c: (COMPILE, {"engine-env"}) for c in ("vllm", "triton", "deep_gemm")}),
    ("more-memory-real-weights-drained", serve(drop=("--gpu-memory-utilization", "--load-format"),
                                               add=("--gpu-memory-utilization", "0.9", "--shutdown-timeout", "30")), {}),
    ("served-name-and-seed", serve(add=("--served-model-name", "qwen", "--seed", "7")), {}),
]


def test_the_table_has_at_least_twenty_rows_and_each_id_once():
    assert len(ROWS) >= 20 and len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_the_judge_says_per_cache_what_a_serve_reuses_and_why(row):
    _, side_, want = row
    got = judge("vllm", "0.26.0", RECORD, side_, cold_s=800.6, warm_s=72.1)
    assert [c.cache for c in got.caches] == sorted(JUDGED)  # a cache the capture left empty is not judged
    data = warmkey.data()
    for c in got.caches:
        verdict, parts = want.get(c.cache, (HIT, set()))
        assert (c.verdict, {d.part for d in c.differs}) == (verdict, parts), (c.cache, c.text())
        for d in c.differs:  # traced: the upstream line that puts the part into this cache's key
            at = next(kp.at for kp in data.key_of(c.cache, "vllm", "0.26.0").parts if kp.part == d.part)
            assert d.at == at and ":" in at, (c.cache, d.part, at)
    assert got.holds == (not want)
    if want:
        assert got.summary().endswith("(cold boot 800.6 s measured where the layer was made)")
    else:
        assert "reuses it (warm boot 72.1 s)" in got.summary()


def test_a_version_without_key_data_and_a_layer_without_a_key_are_misses():
    got = judge("vllm", "0.28.0", RECORD, serve(), cold_s=800.6)
    assert not got.holds and all(c.verdict == UNKNOWN and "no entry" in c.why for c in got.caches)
    got = judge("vllm", "0.26.0", None, serve(), cold_s=800.6)
    assert not got.holds and "records no warm key" in got.summary()


def test_sglang_ranks_follow_tp_where_the_capture_has_no_rank_directories():
    rec = warmkey.Record.of(H200, ("--model-path", "/models/target", "--tp-size", "1"), {}, CONFIG, frozenset(),
                            {"sglang": 3})
    flags = warmkey.data().flags_of("sglang", "0.5.17")
    same = side(H200, flags, ("--model-path", "/models/target"), {}, set(), CONFIG)
    assert judge("sglang", "0.5.17", rec, same).holds
    two = side(H200, flags, ("--model-path", "/models/target", "--tp-size", "2"), {}, set(), CONFIG)
    (c,) = judge("sglang", "0.5.17", rec, two).caches
    assert c.verdict == COMPILE and {d.part for d in c.differs} == {"tp", "rank"}
