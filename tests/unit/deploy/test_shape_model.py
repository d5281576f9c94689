"""`--model shape:27b` (builder/deploy/smoke/shapemodel.py): a generated checkpoint at the published shape of the
Qwen3.5 / 3.6 27B, block FP8, dummy weights. Its numbers, the FP8 rules the engines hold it to, its tokenizer, the
same bytes every time, and how --model names it. Where an engine's or transformers' config class is installed, it
must read the config as written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from builder.deploy.smoke import Model, shapemodel
from builder.engines import recipe
from builder.errors import UserError
from builder.image.launchline import launch_line

SHAPE = shapemodel.SHAPES["27b"]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return shapemodel.ensure(SHAPE, tmp_path_factory.mktemp("models"))


def config(target: Path) -> dict:
    return json.loads((target / "config.json").read_text())


@pytest.mark.pure
def test_the_27b_shape_has_the_published_numbers(target):
    cfg = config(target)
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and cfg["model_type"] == "qwen3_5"
    assert text["model_type"] == "qwen3_5_text"
    # the model card: hidden 5120, 64 layers as 16 x (3 Gated DeltaNet + 1 gated attention), FFN 17408, embedding 248320,
    # Gated DeltaNet 16 QK / 48 V heads of 128, gated attention 24 Q / 4 KV heads of 256, rotary dim 64, MTP
    assert (text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"], text["vocab_size"]) == \
        (5120, 64, 17408, 248320)
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + \
        (["linear_attention"] * 3 + ["full_attention"]) * 15
    assert text["full_attention_interval"] == 4 and text["layer_types"].count("full_attention") == 16
    assert (text["linear_num_key_heads"], text["linear_num_value_heads"]) == (16, 48)
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]) == (128, 128, 4)
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (24, 4, 256)
    assert text["attn_output_gate"] is True
    rope = text["rope_parameters"]
    assert rope == {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                    "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    assert int(text["head_dim"] * rope["partial_rotary_factor"]) == 64 == 2 * sum(rope["mrope_section"])
    assert text["max_position_embeddings"] == 262144 and text["mtp_num_hidden_layers"] == 1
    assert text["mtp_use_dedicated_embeddings"] is False and text["tie_word_embeddings"] is False
    assert text["mamba_ssm_dtype"] == "float32"
    assert vision == {**vision, "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                      "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2, "deepstack_visual_indexes": []}
    # the token ids of the published config, which the tokenizer holds at the same ids
    assert (cfg["image_token_id"], cfg["video_token_id"], cfg["vision_start_token_id"], cfg["vision_end_token_id"]) == \
        (248056, 248057, 248053, 248054)
    assert text["eos_token_id"] == 248044


@pytest.mark.pure
def test_every_quantized_linear_of_the_27b_shape_is_a_multiple_of_the_fp8_block_and_the_rest_stays_bf16(target):
    cfg = config(target)
    text, vision, q = cfg["text_config"], cfg["vision_config"], cfg["quantization_config"]
    assert q == {**q, "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    h, hd, heads, kv = text["hidden_size"], text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    kd, vd = text["linear_key_head_dim"], text["linear_value_head_dim"]
    nk, nv, inter = text["linear_num_key_heads"], text["linear_num_value_heads"], text["intermediate_size"]
    quantized = {  # (N, K) of every linear block FP8 quantizes, the MTP layer's (a full-attention layer) included
        "q_proj (with its output gate)": (heads * hd * 2, h), "k_proj": (kv * hd, h), "v_proj": (kv * hd, h),
        "o_proj": (h, heads * hd), "gate/up_proj": (inter, h), "down_proj": (h, inter),
        "in_proj_qkv": (2 * nk * kd + nv * vd, h), "in_proj_z": (nv * vd, h), "out_proj": (h, nv * vd),
    }
    for name, (n, k) in quantized.items():
        assert n % 128 == 0 and k % 128 == 0, (name, n, k)
    skip = set(q["modules_to_not_convert"])
    # in_proj_a / in_proj_b output the value-head count (48): block FP8 refuses them, in every linear-attention layer
    assert nv % 128 != 0
    linear = [i for i, t in enumerate(text["layer_types"]) if t == "linear_attention"]
    assert len(linear) == 48
    for i in linear:
        assert {f"model.language_model.layers.{i}.linear_attn.in_proj_a",
                f"model.language_model.layers.{i}.linear_attn.in_proj_b"} <= skip
    assert not any(f"layers.{i}.linear_attn" in s for s in skip for i in range(3, 64, 4))  # full-attention layers
    assert {"lm_head", "model.language_model.embed_tokens", "mtp.fc", "model.visual.patch_embed.proj",
            "model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2"} <= skip
    for b in range(vision["depth"]):  # the vision tower: 4304 is no multiple of 128
        assert {f"model.visual.blocks.{b}.{m}" for m in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")} <= skip
    assert vision["intermediate_size"] % 128 != 0
    assert not any("self_attn" in s or "mlp.gate" in s or "mtp.layers" in s for s in skip)
    # SGLang reads these at start for the multimodal architecture
    assert (target / "preprocessor_config.json").is_file() and (target / "video_preprocessor_config.json").is_file()


@pytest.mark.pure
def test_the_27b_tokenizer_is_as_long_as_the_vocabulary_and_holds_the_configs_token_ids(target):
    tokenizers = pytest.importorskip("tokenizers", reason="the test extra brings tokenizers")
    cfg = config(target)
    t0 = time.monotonic()
    tok = tokenizers.Tokenizer.from_file(str(target / "tokenizer.json"))
    assert time.monotonic() - t0 < 10  # few added tokens: the padding is in the BPE vocabulary
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["text_config"]["vocab_size"] == 248320
    assert all(tok.id_to_token(i) is not None for i in range(248320))  # every id a sampler may pick decodes
    for name, key in (("<|image_pad|>", "image_token_id"), ("<|video_pad|>", "video_token_id"),
                      ("<|vision_start|>", "vision_start_token_id"), ("<|vision_end|>", "vision_end_token_id")):
        assert tok.token_to_id(name) == cfg[key]
    assert tok.token_to_id("<|endoftext|>") == cfg["text_config"]["eos_token_id"] == 248044
    assert tok.token_to_id("<|im_end|>") == 248046
    text = "The capital of France is Paris. def main(): return 0 — ünïcödé"
    assert tok.decode(tok.encode(text).ids) == text
    gen = json.loads((target / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [248046, 248044] and gen["do_sample"] is False


@pytest.mark.pure
def test_the_shape_is_generated_fast_the_same_bytes_every_time_and_written_once(tmp_path):
    t0 = time.monotonic()
    a = shapemodel.ensure(SHAPE, tmp_path / "x")
    assert time.monotonic() - t0 < 30
    assert shapemodel.ensure(SHAPE, tmp_path / "x") == a and a.parent.name.endswith(shapemodel.digest(SHAPE))
    other = shapemodel.write(SHAPE, tmp_path / "y")
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in other.iterdir())
    for f in a.iterdir():
        assert (other / f.name).read_bytes() == f.read_bytes()


@pytest.mark.pure
def test_model_shape_names_the_generated_shape_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_CACHE_DIR", str(tmp_path / "cache"))
    m = Model.resolve("shape:27b")
    assert m.tiny and m.generated == "shape:27b" and m.label == "shape:27b" and m.drafter is None
    assert not m.has_weights and m.target == shapemodel.ensure(SHAPE)
    assert Model.resolve("tiny").label == "tiny"
    for bad in ("shape:", "shape:99b", "shape:27B", "shape:27b/../x", "shape:tiny", "shape:27b\n"):
        with pytest.raises(UserError, match=r"--model .*names no generated shape \(known: shape:27b\)"):
            Model.resolve(bad)
    assert not (tmp_path / "cache" / "models").exists() or \
        [p.name for p in (tmp_path / "cache" / "models").iterdir() if "27b" in p.name] == [m.target.parent.name]


@pytest.mark.pure
def test_the_shape_is_served_with_the_generated_models_flags_and_the_engine_args_after_them():
    eng = recipe("vllm", "0.26.0")
    line = launch_line(eng, eng.strategy("MTP2"), {"model": "/models/target", "host": "127.0.0.1", "port": "8000"},
                       dummy_weights=True, tiny=True, extra=("--gpu-memory-utilization", "0.7"))
    args = list(line.args)
    assert "--language-model-only" in args and args[args.index("--load-format") + 1] == "dummy"
    # vLLM's parser takes the last value: the memory share given through --engine-args wins over the tiny model's
    shares = [i for i, a in enumerate(args) if a == "--gpu-memory-utilization"]
    assert len(shares) == 2 and args[shares[-1] + 1] == "0.7"
