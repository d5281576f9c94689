"""`--model shape:NAME`: a generated checkpoint at the published shape of a real model, served with dummy weights
(`--load-format dummy`: nothing is downloaded), so that a boot measures what the engine compiles, captures and
allocates for that shape. `shape:27b` is the 27B of the Qwen3.5 / 3.6 family (`Qwen3_5ForConditionalGeneration`,
block FP8): the "Qwen3.8-27B-FP8 class" the images are built for.

What is written, as for `--model tiny` (tinymodel.py), into ``target/``: ``config.json`` at the published numbers
with Qwen's native block-FP8 ``quantization_config``, ``generation_config.json``, a tokenizer whose length is the
vocabulary size, a ChatML chat template and the image / video processor configs SGLang reads at start. Deterministic
(the same bytes on every host) and written once per digest into the cache, like tiny.

Where each number comes from (all read on 2026-12-05 through public pages; no checkpoint was downloaded):

- [card] the Qwen3.5-27B / Qwen3.6-27B model card (huggingface.co/Qwen/Qwen3.5-27B, commit 3b29628 "Hidden
  Dimension: 5120"; the Qwen3.6-27B card quoted by 67ailab.com and ai.gitcode.com/openharmony-models/Qwen3.6-27B-GGUF):
  27B parameters, hidden 5120, token embedding 248320 (padded), 64 layers laid out 16 x (3 x (Gated DeltaNet -> FFN)
  -> 1 x (Gated Attention -> FFN)); Gated DeltaNet 48 linear-attention heads for V and 16 for QK, head dim 128; MTP
  trained with multiple steps; 262,144 tokens native context. The gated attention's 24 Q / 4 KV heads of 256 and the
  FFN's 17408 as cards built on it quote them (TevunahAi's Qwen3.5-27B GPTQ card, the Core AI card of Qwen3.6-27B)
  and as [config] has them.
- [config] the config.json of Qwen/Qwen3.6-27B as quoted field by field by eadst.com/blog/325 (layer_types
  explicit, 48 linear + 16 full, max_position_embeddings 262144, rope_theta 10,000,000,
  Qwen3_5ForConditionalGeneration / qwen3_5) and as reproduced whole in public code (a transformers
  Qwen3_5Config built "at the published Qwen3.5-27B numbers": every text_config and vision_config field below,
  the token ids, mrope_section [11, 11, 10] interleaved, partial_rotary_factor 0.25, linear_conv_kernel_dim 4,
  mtp_num_hidden_layers 1, mamba_ssm_dtype float32, vision depth 27 / hidden 1152 / intermediate 4304 / 16 heads /
  2304 position embeddings / out 5120). The Qwen3.8-27B text metadata quoted in public tests has the same numbers.
- [fp8] quantization_config: Qwen's block FP8 (quant_method fp8, dynamic activations, e4m3, 128 x 128 weight
  blocks) as tiny's. Which modules stay BF16 in Qwen's own -FP8 checkpoints was NOT found as a whole list; read from
  reports instead: every linear-attention layer's in_proj_a / in_proj_b are in modules_to_not_convert (tokenspeed PR
  #766 on Qwen3.5-35B-A3B-FP8: "leaves in_proj_b/in_proj_a unquantized (in modules_to_not_convert)"), lm_head and
  model.language_model.embed_tokens too (mlx-vlm's tests load Qwen3.5-35B-A3B-FP8's config and expect both); mtp.fc
  is in a list of checkpoint paths in the same tests (inferred to be the checkpoint's, not confirmed); the vision
  tower stays BF16 (SGLang PR #18926 disables quantization of Qwen3-VL/3.5 vision encoders; its 4304-wide MLP is no
  multiple of 128). The MTP layer's own linears are FP8 here, as in tiny: a report on Qwen/Qwen3.6-27B-FP8 says its
  MTP projections dequantize to the BF16 ones (so they are FP8), while a comparison of another 27B FP8 build lists
  mtp.* as BF16; the two disagree and the official config was not read. So the list is: lm_head, the embeddings,
  every linear-attention layer's in_proj_a / in_proj_b (their output is the value-head count, 48: block FP8 refuses
  it), mtp.fc and every linear of the vision tower. Every other linear is FP8 with N and K multiples of 128
  (tests/unit/deploy/test_shape_model.py checks each).
- Not published, chosen: the tokenizer (Qwen's own is not downloaded; here the byte-level BPE of tinymodel.py
  trained on a few sentences, its vocabulary padded with tokens no merge reaches up to 248044, where Qwen's special
  tokens start), the special tokens' ids (Qwen's VL layout from 248044, which the config's ids
  confirm: <|vision_start|> 248053, <|image_pad|> 248056, <|video_pad|> 248057), generation_config greedy.

Serving it: its FP8 weights are about 28 GiB (24.8 B parameters in FP8, embeddings and lm_head 2.5 B in BF16), so
the memory share smoke gives the tiny model (vLLM --gpu-memory-utilization 0.3) is too small for its KV and
Gated-DeltaNet state with MTP; give it more through --engine-args (docs/smoke.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from . import tinymodel

GENERATOR_VERSION = "1"
BLOCK = 128  # FP8 weight block: N and K of every quantized linear are multiples of it


@dataclass(frozen=True)
class Shape:
    """A published text and vision shape of the Qwen3.5 architecture (the fields of its config.json)."""

    name: str
    vocab_size: int
    hidden: int
    intermediate: int
    layers: int
    full_attention_interval: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_key_heads: int
    linear_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    mrope_section: tuple[int, int, int]
    partial_rotary_factor: float
    rope_theta: float
    max_position_embeddings: int
    mtp_layers: int
    vision: dict
    first_special_id: int  # where the special tokens start (<|endoftext|>)

    @property
    def layer_types(self) -> list[str]:
        n = self.full_attention_interval
        return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(self.layers)]


SHAPES = {
    "27b": Shape(
        name="27b", vocab_size=248320, hidden=5120, intermediate=17408, layers=64, full_attention_interval=4,
        heads=24, kv_heads=4, head_dim=256, linear_key_heads=16, linear_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, conv_kernel=4, mrope_section=(11, 11, 10), partial_rotary_factor=0.25,
        rope_theta=10000000.0, max_position_embeddings=262144, mtp_layers=1, first_special_id=248044,
        vision={"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "out_hidden_size": 5120, "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
                "deepstack_visual_indexes": [], "initializer_range": 0.02}),
}
PREFIX = "shape:"

# Qwen's special tokens in its VL layout, from <|endoftext|> on (Qwen2-VL's order; the config's token ids match it)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]


def known() -> list[str]:
    return [PREFIX + n for n in SHAPES]


def is_shape(spec: str) -> bool:
    """Whether `--model spec` names a generated shape (shape:NAME), known or not."""
    return spec.startswith(PREFIX)


def check(spec: str, flag: str = "--model") -> None:
    """Refuse, in one line naming `flag`, a shape:NAME whose NAME the table lacks (before any boot or file)."""
    if is_shape(spec):
        try:
            shape_of(spec)
        except ValueError as exc:
            from ... import redact
            from ...errors import UserError

            raise UserError(f"{flag} {redact.describe(spec)}: {exc}") from None


def shape_of(spec: str) -> Shape:
    """The shape `--model shape:NAME` names; a ValueError (the caller words it) for a name the table lacks."""
    name = spec[len(PREFIX):] if is_shape(spec) else spec
    if name not in SHAPES:
        raise ValueError(f"names no generated shape (known: {', '.join(known())})")
    return SHAPES[name]


# -- tokenizer ---------------------------------------------------------------------------------------------
def tokenizer_json(shape: Shape) -> tuple[dict, dict[str, int]]:
    """tokenizer.json with len == vocab_size: tiny's byte-level BPE, its vocabulary padded with entries no merge
    reaches (<|unused_N|>: decoded as their own text) up to the first special id, then the special tokens and
    added <|extra_N|> tokens up to the vocabulary size. Few added tokens: a tokenizer with 248,000 of them loads
    slowly in every process of the engine."""
    bpe_vocab, merges = tinymodel.train_bpe(tinymodel.CORPUS, max_vocab=shape.first_special_id)
    vocab = dict(bpe_vocab)
    for i in range(shape.first_special_id - len(vocab)):
        vocab[f"<|unused_{i}|>"] = len(vocab)
    assert len(vocab) == shape.first_special_id
    names = SPECIAL_TOKENS + [f"<|extra_{i}|>" for i in range(shape.vocab_size - len(vocab) - len(SPECIAL_TOKENS))]
    added, ids = [], {}
    for i, name in enumerate(names):
        ids[name] = len(vocab) + i
        added.append({"id": len(vocab) + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    assert len(vocab) + len(added) == shape.vocab_size
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }, ids


def tokenizer_files(shape: Shape) -> tuple[dict[str, dict], dict[str, int]]:
    tok, ids = tokenizer_json(shape)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": shape.max_position_embeddings,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "add_bos_token": False, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "chat_template": tinymodel.CHAT_TEMPLATE,
    }
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return {"tokenizer.json": tok, "tokenizer_config.json": config, "special_tokens_map.json": special}, ids


# -- config ------------------------------------------------------------------------------------------------
def not_converted(shape: Shape) -> list[str]:
    """modules_to_not_convert (see the module's docstring, [fp8]): what stays BF16."""
    skip = ["lm_head", "model.language_model.embed_tokens"]
    skip += [f"model.language_model.layers.{i}.linear_attn.{p}" for i, t in enumerate(shape.layer_types)
             if t == "linear_attention" for p in ("in_proj_a", "in_proj_b")]
    skip += ["mtp.fc", "model.visual.patch_embed.proj"]
    skip += [f"model.visual.blocks.{b}.{m}" for b in range(shape.vision["depth"])
             for m in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")]
    skip += ["model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2"]
    return skip


def target_config(shape: Shape, ids: dict[str, int]) -> dict:
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "layer_types": shape.layer_types,
        "full_attention_interval": shape.full_attention_interval,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "attn_output_gate": True,
        "linear_conv_kernel_dim": shape.conv_kernel,
        "linear_key_head_dim": shape.linear_key_head_dim,
        "linear_value_head_dim": shape.linear_value_head_dim,
        "linear_num_key_heads": shape.linear_key_heads,
        "linear_num_value_heads": shape.linear_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta,
                            "partial_rotary_factor": shape.partial_rotary_factor,
                            "mrope_section": list(shape.mrope_section), "mrope_interleaved": True},
        "partial_rotary_factor": shape.partial_rotary_factor,
        "mtp_num_hidden_layers": shape.mtp_layers,
        "mtp_use_dedicated_embeddings": False,
        "mlp_only_layers": [],
        "mamba_ssm_dtype": "float32",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": None,
    }
    return tinymodel.qwen35_config(text, dict(shape.vision), ids, not_converted(shape))


def model_files(shape: Shape) -> dict[str, dict]:
    """Every file of the generated target directory: {name: json}."""
    tok, ids = tokenizer_files(shape)
    gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"],
           "do_sample": False}
    return {"config.json": target_config(shape, ids), "generation_config.json": gen, **tok,
            **tinymodel.processor_configs()}


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=1, ensure_ascii=False) + "\n"


def digest(shape: Shape, files: dict[str, dict] | None = None) -> str:
    """Content hash of the shape's files (`files`: model_files(shape), when already made)."""
    h = hashlib.sha256(f"{GENERATOR_VERSION}\0{shape.name}".encode())
    for name, obj in sorted((files or model_files(shape)).items()):
        h.update(f"{name}\0".encode() + _dump(obj).encode())
    return h.hexdigest()[:16]


def write(shape: Shape, dest: Path, files: dict[str, dict] | None = None) -> Path:
    """The shape's target directory written under `dest` (`files`: model_files(shape), when already made); its
    path."""
    target = Path(dest) / "target"
    target.mkdir(parents=True, exist_ok=True)
    for name, obj in (files or model_files(shape)).items():
        (target / name).write_text(_dump(obj))
    return target


def ensure(shape: Shape, cache_dir: Path | None = None) -> Path:
    """The shape's target directory in the cache (written once per digest, atomically, readable by any user). Its
    files are made once: the tokenizer of a real-size vocabulary is the slow part."""
    files = model_files(shape)
    base = Path(cache_dir) if cache_dir else tinymodel.default_cache_dir()
    final = tinymodel.cached(base, f"qwen3.5-{shape.name}-shape-fp8-{digest(shape, files)}", f".shape-{shape.name}-",
                             lambda tmp: write(shape, tmp, files))
    return final / "target"
