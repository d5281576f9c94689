"""`--model tiny`: a generated checkpoint of the Qwen3.5-class architecture the engines serve under MTP and
DFlash2, small enough that a smoke boot needs no 29 GiB download.

What is written (no weights: the engines fill them with `--load-format dummy`):

- ``target/``: ``config.json`` of ``Qwen3_5ForConditionalGeneration`` (``model_type`` ``qwen3_5``) — hybrid
  Gated-DeltaNet + gated full attention, mRoPE, **one MTP layer**, a tiny vision tower, and Qwen's native
  block-FP8 ``quantization_config`` (128×128 weight blocks, dynamic activations). Every quantized linear has
  N and K multiples of 128; ``modules_to_not_convert`` lists lm_head, the embeddings, the vision tower and
  the linear-attention ``in_proj_a`` / ``in_proj_b`` (their output is the value-head count, which block FP8
  refuses). A byte-level BPE tokenizer trained here on a few sentences and padded with added tokens so that
  ``len(tokenizer) == vocab_size``, a ChatML chat template, and the image / video processor configs SGLang
  reads at start.
- ``dflash2-drafter/``: the config of a tiny DFlash2 block-diffusion drafter (``DFlash2DraftModel``, block
  size 8) for that target, with the same tokenizer. One directory serves both engines: its ``dflash_config``
  carries every key the DFlash2 loaders of vLLM 0.33.0 and SGLang 0.5.19 / 0.5.23 read (see `drafter_config`).

The target's shapes are the ones checked to boot on vLLM 0.26.0 and SGLang 0.5.17 (shared GPU-SMOKE.md); the
drafter's keys are read from the engines' sources, not yet booted. Pure Python, deterministic: the same bytes
on every host, so a directory already written is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

GENERATOR_VERSION = "1"

VOCAB_SIZE = 1024
HIDDEN = 256
INTERMEDIATE = 512
HEAD_DIM = 128
LAYER_TYPES = ["linear_attention", "full_attention"]
BLOCK = 128  # FP8 weight block (N and K of every quantized linear are multiples of it)
DFLASH_BLOCK_SIZE = 8
# DFlash2's candidate selector and grouped convolution (what `drafter_config` cites them from):
DFLASH_SELECTOR_RANK = 32     # rank of the [vocab, rank] codebooks
DFLASH_SELECTOR_TOP_K = 8     # candidates per slot: a power of two, <= VOCAB_SIZE
DFLASH_CONV_KERNEL_SIZE = 4   # taps of the grouped convolution, <= DFLASH_BLOCK_SIZE
DFLASH_CONV_GROUP_SIZE = 64   # divides HIDDEN
# Target layers whose hidden states feed the drafter. SGLang captures the input of layer id + 1, so every
# id must be < the target's layer count - 1: with two target layers that is layer 0 only.
DFLASH_TARGET_LAYER_IDS = [0]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<|mask|>"]

# What the BPE merges are learnt from: a few sentences, so common words become single tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A smoke test proves that an engine boots and answers.
Speculative decoding drafts several tokens and the target model verifies them in one forward pass.
Multi-token prediction reuses the draft head inside the checkpoint; DFlash drafts a whole block at once.
Hello, world! The capital of France is Paris. One, two, three, four, five, six, seven, eight, nine, ten.
def main():\n    print("hello world")\n    return 0\n
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions? Answers! The engine is ready to serve requests.
"""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModel:
    target: Path
    drafter: Path


# -- tokenizer ---------------------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (what the ByteLevel pre-tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train_bpe(text: str, max_vocab: int) -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE trained on `text`: the 256 byte symbols, then merges of the most frequent pair
    (ties broken by the pair itself, so the result is deterministic) until `max_vocab` or no pair repeats."""
    byte_map = _bytes_to_unicode()
    vocab = {sym: i for i, sym in enumerate(byte_map[b] for b in range(256))}
    words = Counter(tuple(byte_map[b] for b in w.encode()) for w in re.findall(r" ?\w+| ?[^\s\w]+|\s+", text))
    merges: list[str] = []
    while len(vocab) < max_vocab:
        pairs: Counter = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best, count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        if count < 2:
            break
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        vocab.setdefault(merged, len(vocab))
        new_words: Counter = Counter()
        for word, c in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += c
        words = new_words
    return vocab, merges


def tokenizer_json(vocab_size: int = VOCAB_SIZE) -> tuple[dict, dict[str, int]]:
    """tokenizer.json (the `tokenizers` library's format) and the ids of the special tokens."""
    n_added = len(SPECIAL_TOKENS)
    bpe_vocab, merges = train_bpe(CORPUS, max_vocab=vocab_size - n_added - 16)
    added, ids = [], {}
    next_id = len(bpe_vocab)
    names = SPECIAL_TOKENS + [f"<|extra_{i}|>" for i in range(vocab_size - len(bpe_vocab) - n_added)]
    for name in names:
        ids[name] = next_id
        added.append({"id": next_id, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
        next_id += 1
    assert next_id == vocab_size, (next_id, vocab_size)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": bpe_vocab, "merges": merges},
    }, ids


def tokenizer_files(vocab_size: int = VOCAB_SIZE) -> tuple[dict[str, dict], dict[str, int]]:
    tok, ids = tokenizer_json(vocab_size)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return {"tokenizer.json": tok, "tokenizer_config.json": config, "special_tokens_map.json": special}, ids


# -- configs -----------------------------------------------------------------------------------------------
def target_config(ids: dict[str, int]) -> dict:
    n_layers = len(LAYER_TYPES)
    vision = {
        "model_type": "qwen3_5",
        "depth": 1,
        "hidden_size": BLOCK,
        "intermediate_size": 2 * BLOCK,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": HIDDEN,
        "num_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "deepstack_visual_indexes": [],
        "initializer_range": 0.02,
    }
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": n_layers,
        "layer_types": LAYER_TYPES,
        "full_attention_interval": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "attn_output_gate": True,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [6, 5, 5], "mrope_interleaved": True},
        "partial_rotary_factor": 0.25,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": "bfloat16",
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    skip = ["lm_head", "model.language_model.embed_tokens", "mtp.embed_tokens"]
    skip += [f"model.language_model.layers.{i}.linear_attn.{p}" for i, t in enumerate(LAYER_TYPES)
             if t == "linear_attention" for p in ("in_proj_a", "in_proj_b")]
    skip += ["model.visual.patch_embed.proj"]
    skip += [f"model.visual.blocks.{b}.{m}" for b in range(vision["depth"])
             for m in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")]
    skip += ["model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2"]
    return qwen35_config(text, vision, ids, skip)


def qwen35_config(text: dict, vision: dict, ids: dict[str, int], not_converted: list[str]) -> dict:
    """The config.json of a Qwen3_5ForConditionalGeneration checkpoint around its text and vision configs: the
    special tokens' ids and Qwen's native block-FP8 quantization, `not_converted` left in BF16 (the tiny model and
    the published shapes of shapemodel.py alike)."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [BLOCK, BLOCK],
            "modules_to_not_convert": not_converted,
        },
    }


def drafter_config(ids: dict[str, int]) -> dict:
    """A DFlash2 drafter for the target: one Qwen3 layer reading one of the target's layers' hidden states.

    Where each ``dflash_config`` key is required (paths inside the PyPI wheels):

    - ``selector_rank``, ``selector_top_k``: SGLang 0.5.19 / 0.5.23 sglang/srt/models/dflash.py
      (DFlash2DraftModel.__init__, lines 1072 / 1270) raises "DFlash selector draft requires
      dflash_config.selector_rank" when it is 0 or absent, and sglang/srt/speculative/dflash_utils.py
      parse_dflash_draft_config (lines 642 / 645) wants rank and top_k together, both >= 0. The selector walk
      (sglang/kernels/ops/speculative/dflash.py, ``tl.arange(0, top_k)``, lines 264 / 266) needs top_k a
      power of two. vLLM 0.33.0 vllm/model_executor/models/qwen3_dflash2.py (DFlash2Qwen3Model, lines 385-386)
      and vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py (line 195) index both keys: KeyError if absent.
    - ``conv_kernel_size``, ``conv_group_size``: vLLM 0.33.0 qwen3_dflash2.py (DFlash2Qwen3DecoderLayer,
      lines 253-254) indexes both, and DFlashGroupedConv (line 182) wants the group size to divide
      hidden_size. SGLang 0.5.19 / 0.5.23 take them as optional but only together (dflash_utils.py
      lines 626 / 629) and with the same divisibility (models/dflash.py lines 422 / 547).
    - ``mask_token_id``: vLLM 0.33.0 vllm/v1/worker/gpu/spec_decode/utils.py get_parallel_drafting_token_id
      (line 92) raises without it; SGLang's DFLASH worker (speculative/dflash_worker_v2.py) wants it inside the
      target vocabulary and equal to the tokenizer's id of ``mask_token`` (default "<|MASK|>",
      dflash_utils.py line 24 / 27), so ``mask_token`` names ours.
    - ``target_layer_ids``: SGLang 0.5.19 / 0.5.23 capture the input of layer id + 1 (models/qwen3_vl.py
      set_dflash_layers_to_capture, lines 1543 / 1688, indexing models/qwen3_5.py self.layers, lines
      1660 / 1892: IndexError for the last layer); without ids it picks [num_target_layers // 2] = [1]
      (dflash_utils.py build_target_layer_ids, lines 379 / 371), also out of range. vLLM 0.33.0 adds 1 too
      (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py line 124) and sizes the fc from their count.
    - ``block_size``: both engines read it (SGLang dflash_utils.py parse_dflash_draft_config; vLLM builds the
      convolution for 1 + num_speculative_tokens = 8 query tokens, qwen3_dflash2.py line 256).
    """
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 10000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": DFLASH_BLOCK_SIZE,
        "num_target_layers": len(LAYER_TYPES),
        "target_hidden_size": HIDDEN,
        "dflash_config": {
            "block_size": DFLASH_BLOCK_SIZE,
            "target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
            "mask_token": "<|mask|>",
            "mask_token_id": ids["<|mask|>"],
            "selector_rank": DFLASH_SELECTOR_RANK,
            "selector_top_k": DFLASH_SELECTOR_TOP_K,
            "conv_kernel_size": DFLASH_CONV_KERNEL_SIZE,
            "conv_group_size": DFLASH_CONV_GROUP_SIZE,
        },
    }


def processor_configs() -> dict[str, dict]:
    """The image / video processor configs SGLang loads at start for this (multimodal) architecture."""
    common = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
              "size": {"shortest_edge": 65536, "longest_edge": 1048576}}
    return {
        "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", **common},
        "video_preprocessor_config.json": {"video_processor_type": "Qwen3VLVideoProcessor", "fps": 2, **common},
    }


def model_files() -> dict[str, dict[str, dict]]:
    """Every file of the tiny model, by directory: {"target": {name: json}, "dflash2-drafter": {...}}."""
    tok, ids = tokenizer_files()
    gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"],
           "do_sample": False}
    target = {"config.json": target_config(ids), "generation_config.json": gen, **tok, **processor_configs()}
    drafter = {"config.json": drafter_config(ids), **tok}
    return {"target": target, "dflash2-drafter": drafter}


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def digest() -> str:
    """Content hash of the generated files (names the cache directory)."""
    h = hashlib.sha256(GENERATOR_VERSION.encode())
    for d, files in sorted(model_files().items()):
        for name, obj in sorted(files.items()):
            h.update(f"{d}/{name}\0".encode() + _dump(obj).encode())
    return h.hexdigest()[:16]


def write(dest: Path) -> TinyModel:
    """Write the tiny model under `dest` (target/ and dflash2-drafter/); returns their paths."""
    dest = Path(dest)
    for d, files in model_files().items():
        (dest / d).mkdir(parents=True, exist_ok=True)
        for name, obj in files.items():
            (dest / d / name).write_text(_dump(obj))
    return TinyModel(dest / "target", dest / "dflash2-drafter")


def ensure(cache_dir: Path | None = None) -> TinyModel:
    """The tiny model in the cache (written once per generator digest, atomically)."""
    final = cached(Path(cache_dir) if cache_dir else default_cache_dir(), f"tiny-qwen3.5-fp8-{digest()}", ".tiny-",
                   write)
    return TinyModel(final / "target", final / "dflash2-drafter")


def cached(base: Path, name: str, prefix: str, write_into) -> Path:
    """base/name, a generated model directory: made once (`write_into(tmp)` writes target/ and the rest into a
    temporary directory under `base`, renamed into place: a reader never sees half of it), every file readable by
    the engine's user inside a container. The name carries the content's digest, so what is there is reused."""
    final = base / name
    if not (final / "target" / "config.json").is_file():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        write_into(tmp)
        for p in [tmp, *tmp.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)  # readable by the engine's user inside a container
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race: theirs is identical
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_cache_dir() -> Path:
    root = os.environ.get("BUILDER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "builder")
    return Path(root) / "models"
