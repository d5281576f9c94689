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


# -- serve: the judge's answer sizes the budget and the compile-cache volume (docker and Kubernetes) ----------------
def _warm_labels(args: tuple[str, ...], config: str) -> dict[str, str]:
    from builder.image import labels as labels_mod

    record = warmkey.Record.of(H200, args, {}, config, frozenset({"rank_0_0"}), {"vllm": 40, "triton": 900})
    facts = {"strategy": "MTP2", "gpu": "NVIDIA H200", "gpu-arch": "sm90", "driver": "580.159.04",
             "cold-boot-s": "800.6", "warm-boot-s": "72.1", "key": record.to_label()}
    return {labels_mod.ENGINE: "vllm", labels_mod.ENGINE_VERSION: "0.33.0", labels_mod.STRATEGIES: "MTP2",
            labels_mod.ARCHS: "90", labels_mod.CACHE_ROOT: "/opt/jit-cache",
            labels_mod.CACHE_ENV: "VLLM_CACHE_ROOT=/opt/jit-cache/vllm TRITON_CACHE_DIR=/opt/jit-cache/triton",
            **dict(labels_mod.warm_written(facts, "sha256:" + "b" * 64))}


def test_serve_sizes_a_warm_images_budget_and_volume_from_the_judge(tmp_path):
    """Docker on this host: served as captured (the same model directory name and config, the same flags, this GPU)
    the layer holds: the warm boot's budget, no volume. Another --max-model-len: the cold boot measured where the
    layer was made, and a named volume at the cache root. Kubernetes (a claim: the model's config cannot be read
    here): the cold budget, the reason in an annotation, and the compile-cache volume seeded from the image's own
    root by an init container, the claim used when given."""
    from builder.deploy.serve import docker as serve_docker
    from builder.deploy.serve import kube
    from builder.deploy.serve import plan as plan_mod
    from builder.engines import load_knowledge

    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen3_5ForConditionalGeneration"]}')
    config = warmkey.model_config_sha(model)
    kn = load_knowledge()
    image = "registry.example.com/ml/vllm@sha256:" + "a" * 64
    # what serve's own launch line is for this model: the layer was captured with exactly that (and its own port)
    served = plan_mod.derive(plan_mod.DOCKER, image, _warm_labels(("/models/x",), config), kn, "MTP2", model, gpu=H200)
    labels = _warm_labels(tuple(a if a != "8000" else "41111" for a in served.args), config)

    on = plan_mod.derive(plan_mod.DOCKER, image, labels, kn, "MTP2", model, gpu=H200)
    assert on.warm.holds and on.compile_cache is None and on.budget.seconds == 193  # 72.1 + 120, rounded up
    assert "builder-jit-" not in " ".join(serve_docker.line(on).argv)

    off = plan_mod.derive(plan_mod.DOCKER, image, labels, kn, "MTP2", model, gpu=H200,
                          extra_args=("--max-model-len", "4096"))
    assert not off.warm.holds and off.warm.compiles == ("vllm",)
    assert off.budget.seconds == 1602 and "off its warm key" in off.budget.why  # 800.6 + 800.6, rounded up
    argv = serve_docker.line(off).argv
    assert f"{serve_docker.cache_volume(off)}:/opt/jit-cache" in argv and "VLLM_CACHE_ROOT=/opt/jit-cache/vllm" in argv

    kube_plan = plan_mod.derive(plan_mod.KUBERNETES, image, labels, kn, "MTP2", "pvc:models/target",
                                gpu_product="NVIDIA-H200")
    assert not kube_plan.warm.holds and kube_plan.budget.seconds == 1602
    assert {d.part for c in kube_plan.warm.caches for d in c.differs} == {"model-config"}  # the product pins the GPU
    docs = [r.to_dict() for r in kube.resources(kube_plan, kube.KubeOptions(compile_cache_claim="jit"))]
    pod = docs[0]["spec"]["template"]
    assert "cannot be judged" in pod["metadata"]["annotations"][kube.ANNOTATION_WARM]
    (seed,) = pod["spec"]["initContainers"]
    assert seed["image"] == image and seed["args"] == ["-a", "-n", "/opt/jit-cache/.", kube.SEED_MOUNT]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "compile-cache")
    assert volume["persistentVolumeClaim"]["claimName"] == "jit"
    engine = pod["spec"]["containers"][0]
    assert {"name": "compile-cache", "mountPath": "/opt/jit-cache"} in engine["volumeMounts"]
    assert engine["startupProbe"]["failureThreshold"] == 161
