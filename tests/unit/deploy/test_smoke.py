"""builder smoke without Docker and without a GPU: the generated tiny model, the engine data smoke reads, the
reports, and every layer — L3's failure handling included — through the process launcher against the stand-in
engine server (tests/fixtures/smoke/stand_in: a TEST DOUBLE, not an engine) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from builder import matrix as matrix_mod
from builder import resolve
from builder.engines import Strategy, recipe
from builder.deploy.smoke import Model, SmokeOptions, layers, report, smoke_process, tinymodel
from builder.deploy.runtime import engine
from builder.deploy.runtime.engine import ProcessLauncher

from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "smoke"
MATRIX = FIXTURE / "matrix.toml"
STAND_IN = FIXTURE / "stand_in"
CELL = "stand-in-engine-1.0.0-cu130-py311-sm80.90"


@pytest.fixture(scope="module")
def cell():
    if f"{sys.version_info.major}.{sys.version_info.minor}" != "3.11":
        pytest.fail("the stand-in cell says Python 3.11 (the local Debian base's): run the tests with Python 3.11")
    m = matrix_mod.load(MATRIX)
    return next(c for c in resolve.select(m, matrix_mod.Selection()) if c.id == CELL)


@pytest.fixture
def tiny(tmp_path_factory) -> tinymodel.TinyModel:
    return tinymodel.ensure(tmp_path_factory.getbasetemp() / "models")


def opts(tmp_path: Path, tiny, mode: str = "ok", **kw) -> SmokeOptions:
    base = dict(strategies=("MTP2", "MTP7"), model=Model(tiny.target, tiny.drafter, tiny=True), l3_without_gpu=True,
                boot_timeout=10, log_dir=tmp_path / "logs", extra_env={"STAND_IN_MODE": mode})
    base.update(kw)
    return SmokeOptions(**base)


def stand_in_env() -> dict[str, str]:
    return {"PYTHONPATH": str(STAND_IN)}


def run_stand_in(cell, o: SmokeOptions) -> report.SmokeReport:
    return smoke_process(cell, sys.executable, o, extra_env=stand_in_env())


def builder(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=300)


# -- the tiny model ----------------------------------------------------------------------------------------
@pytest.mark.pure
def test_tiny_model_is_qwen35_block_fp8_with_one_mtp_layer_and_every_quantized_linear_a_multiple_of_128(tiny):
    cfg = json.loads((tiny.target / "config.json").read_text())
    text, q = cfg["text_config"], cfg["quantization_config"]
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and cfg["model_type"] == "qwen3_5"
    assert text["mtp_num_hidden_layers"] == 1
    assert text["layer_types"] == ["linear_attention", "full_attention"]
    assert q == {**q, "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    h, kd, vd = text["hidden_size"], text["linear_key_head_dim"], text["linear_value_head_dim"]
    hd, heads, kv = text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    shapes = {  # (out, in) of every linear that block FP8 quantizes
        "q_proj (with its output gate)": (heads * hd * 2, h), "k_proj": (kv * hd, h), "v_proj": (kv * hd, h),
        "o_proj": (h, heads * hd), "gate/up_proj": (text["intermediate_size"], h), "down_proj": (h, text["intermediate_size"]),
        "in_proj_qkv": (2 * text["linear_num_key_heads"] * kd + text["linear_num_value_heads"] * vd, h),
        "in_proj_z": (text["linear_num_value_heads"] * vd, h), "out_proj": (h, text["linear_num_value_heads"] * vd),
        "mtp.fc": (h, 2 * h),
    }
    for name, (n, k) in shapes.items():
        assert n % 128 == 0 and k % 128 == 0, (name, n, k)
    # what cannot be block-quantized stays BF16: in_proj_a/b output the value-head count
    assert text["linear_num_value_heads"] % 128 != 0
    skip = set(q["modules_to_not_convert"])
    assert {"lm_head", "model.language_model.embed_tokens", "model.language_model.layers.0.linear_attn.in_proj_a",
            "model.language_model.layers.0.linear_attn.in_proj_b", "model.visual.blocks.0.attn.qkv"} <= skip
    assert not any("layers.1.linear_attn" in s for s in skip)  # layer 1 is full attention
    rope = text["rope_parameters"]
    assert sum(rope["mrope_section"]) * 2 == int(hd * rope["partial_rotary_factor"])
    # SGLang reads these at start for the multimodal architecture
    assert (tiny.target / "preprocessor_config.json").is_file()
    assert (tiny.target / "video_preprocessor_config.json").is_file()


@pytest.mark.pure
def test_tiny_tokenizer_loads_with_the_real_library_and_fills_the_vocabulary_exactly(tiny):
    tokenizers = pytest.importorskip("tokenizers", reason="the test extra brings tokenizers")
    cfg = json.loads((tiny.target / "config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(tiny.target / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == cfg["text_config"]["vocab_size"] == 1024
    text = "The capital of France is Paris. def main(): return 0 — ünïcödé"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # the merges learnt something
    assert tok.token_to_id("<|image_pad|>") == cfg["image_token_id"]
    assert tok.token_to_id("<|im_end|>") == cfg["text_config"]["eos_token_id"]
    tc = json.loads((tiny.target / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tc["chat_template"] and tc["eos_token"] == "<|im_end|>"


@pytest.mark.pure
def test_tiny_dflash2_drafter_reads_the_targets_layers_in_blocks_of_8(tiny):
    d = json.loads((tiny.drafter / "config.json").read_text())
    t = json.loads((tiny.target / "config.json").read_text())["text_config"]
    assert d["architectures"] == ["DFlash2DraftModel"] and d["block_size"] == d["dflash_config"]["block_size"] == 8
    assert all(0 <= i < t["num_hidden_layers"] for i in d["dflash_config"]["target_layer_ids"])
    assert d["hidden_size"] == t["hidden_size"] and d["vocab_size"] == t["vocab_size"]
    assert 0 <= d["dflash_config"]["mask_token_id"] < d["vocab_size"]


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


@pytest.mark.pure
def test_tiny_dflash2_drafter_has_every_key_the_dflash2_loaders_of_vllm_0330_and_sglang_0519_0523_require(tiny):
    # The rules below are read from the engines' PyPI wheels (sglang 0.5.19 and 0.5.23, vllm 0.33.0); paths are
    # inside the wheels, line numbers as 0.5.19 / 0.5.23. Neither engine is installed here, so the JSON is
    # checked against them rather than loaded through the engines' own classes.
    d = json.loads((tiny.drafter / "config.json").read_text())
    t = json.loads((tiny.target / "config.json").read_text())["text_config"]
    dc = d["dflash_config"]

    # SGLang sglang/srt/models/dflash.py DFlash2DraftModel.__init__ (1072 / 1270): refuses a falsy
    # dflash_config.selector_rank; sglang/srt/speculative/dflash_utils.py parse_dflash_draft_config (642 / 645):
    # selector_rank and selector_top_k together. vLLM vllm/model_executor/models/qwen3_dflash2.py (385-386,
    # DFlash2Qwen3Model) and vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py (195) index both: KeyError.
    assert _positive_int(dc.get("selector_rank")) and _positive_int(dc.get("selector_top_k")), dc
    top_k = dc["selector_top_k"]
    # SGLang sglang/kernels/ops/speculative/dflash.py _selector_walk_kernel: tl.arange(0, top_k) (264 / 266), a
    # power of two; both engines take the top_k of the target's logits, so at most the vocabulary.
    assert top_k & (top_k - 1) == 0 and top_k <= t["vocab_size"], top_k

    # vLLM qwen3_dflash2.py DFlash2Qwen3DecoderLayer (253-254) indexes conv_kernel_size / conv_group_size, and
    # DFlashGroupedConv (182) wants the group size to divide hidden_size; SGLang dflash_utils.py (626 / 629)
    # takes them only together, models/dflash.py DFlashGroupedConv (422 / 547) with the same divisibility.
    assert _positive_int(dc.get("conv_kernel_size")) and _positive_int(dc.get("conv_group_size")), dc
    assert d["hidden_size"] % dc["conv_group_size"] == 0

    # vLLM vllm/v1/worker/gpu/spec_decode/utils.py get_parallel_drafting_token_id (92) raises without
    # mask_token_id. SGLang speculative/dflash_worker_v2.py _resolve_mask_token_id: inside the target vocabulary
    # and equal to the target tokenizer's id of dflash_config.mask_token (default "<|MASK|>").
    tok = json.loads((tiny.target / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert _positive_int(dc.get("mask_token_id")) and dc["mask_token_id"] < t["vocab_size"]
    assert added[dc["mask_token"]] == dc["mask_token_id"]
    # vLLM vllm/v1/worker/gpu/spec_decode/dflash/speculator.py (83-84) refuses sample_from_anchor = true.
    assert not dc.get("sample_from_anchor", False)

    # target_layer_ids: SGLang captures the input of layer id + 1 (models/qwen3_vl.py set_dflash_layers_to_capture,
    # 1543 / 1688, into models/qwen3_5.py self.layers[...], 1660 / 1892), so id + 1 must be a layer of the
    # target; without ids it would pick [num_target_layers // 2] (dflash_utils.py build_target_layer_ids,
    # 379 / 371), for two layers out of range too. vLLM adds 1 as well
    # (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py 124) and captures after each layer; its fc takes
    # target_hidden_size x len(ids) (qwen3_dflash.py _get_dflash_fc_input_size), SGLang's len(ids) x hidden_size.
    ids = dc["target_layer_ids"]
    n = t["num_hidden_layers"]
    assert ids and ids == sorted(set(ids)) and all(isinstance(i, int) and 0 <= i and i + 1 < n for i in ids), (ids, n)
    assert d["num_target_layers"] == n  # SGLang spec_aux_hidden_state.py warns when it differs from the target's
    assert d["target_hidden_size"] == d["hidden_size"] == t["hidden_size"]

    # block size: what the DFlash2 strategies draft per block. vLLM builds the convolution for
    # 1 + num_speculative_tokens query tokens (qwen3_dflash2.py 256); SGLang's block is
    # --speculative-num-draft-tokens (speculative/dflash_worker_v2.py warns on a mismatch with block_size).
    vllm_flags = recipe("vllm", "0.33.0").strategy("DFlash2").flags
    spec = json.loads(vllm_flags[vllm_flags.index("--speculative-config") + 1])
    sgl_flags = recipe("sglang", "0.5.23").strategy("DFlash2").flags
    assert 1 + spec["num_speculative_tokens"] == int(sgl_flags[sgl_flags.index("--speculative-num-draft-tokens") + 1])
    assert dc["block_size"] == 1 + spec["num_speculative_tokens"]
    assert dc["conv_kernel_size"] <= dc["block_size"]  # ours, not an engine's rule: taps past the block read nothing


@pytest.mark.pure
def test_tiny_model_is_deterministic_and_written_once(tmp_path):
    a, b = tinymodel.ensure(tmp_path / "x"), tinymodel.ensure(tmp_path / "x")
    assert a == b and a.target.parent.name.endswith(tinymodel.digest())
    other = tinymodel.write(tmp_path / "y")
    for f in a.target.iterdir():
        assert (other.target / f.name).read_bytes() == f.read_bytes()


# -- the engine data smoke reads ---------------------------------------------------------------------------
@pytest.mark.pure
def test_qwen3x_mtp_with_more_than_one_draft_token_is_allowed_from_vllm_017_as_its_source_says():
    for version in ("0.17.0", "0.26.0", "0.33.0"):
        for name in ("MTP2", "MTP7"):
            assert recipe("vllm", version).strategy_problem(name) is None, (version, name)
    why = recipe("vllm", "0.16.0").strategy_problem("MTP7")
    assert "vllm>=0.17" in why and "0.17.0" in why
    assert recipe("vllm", "0.26.0").strategy_problem("DFlash2")  # DFlash2 still needs >= 0.28


@pytest.mark.pure
def test_sglang_bounds_are_the_ones_its_wheels_show_mtp_from_0511_dflash2_from_0519():
    # qwen3_5_mtp.py is in every wheel from 0.5.9 (EAGLE reuses its one layer per step; 0.5.17 booted MTP2 and
    # MTP7 on the H200); 0.5.11 is the first release the data builds. DFLASH exists from 0.5.11, but the DFlash2
    # drafter's DFlash2DraftModel is registered only from 0.5.19 (absent from the 0.5.17 and 0.5.18 wheels).
    for version in ("0.5.11", "0.5.17", "0.5.18", "0.5.23"):
        for name in ("MTP2", "MTP7"):
            assert recipe("sglang", version).strategy_problem(name) is None, (version, name)
    for version in ("0.5.11", "0.5.17", "0.5.18"):
        why = recipe("sglang", version).strategy_problem("DFlash2")
        assert why and "sglang>=0.5.19" in why and "DFlash2DraftModel" in why, why
    assert recipe("sglang", "0.5.19").strategy_problem("DFlash2") is None
    why = recipe("sglang", "0.3.2").strategy_problem("MTP2")
    assert "sglang>=0.5.11" in why and "qwen3_5_mtp.py" in why, why


def _flag_values(flags: tuple[str, ...]) -> dict[str, str]:
    """--a-b VALUE pairs → {"a_b": VALUE}: the destinations argparse gives them."""
    assert len(flags) % 2 == 0 and all(f.startswith("--") for f in flags[::2]), flags
    return {f[2:].replace("-", "_"): v for f, v in zip(flags[::2], flags[1::2])}


def _what_the_flags_say(engine: str, strategy: Strategy) -> dict[str, object]:
    """What an engine's parser makes of a strategy's flags, as expect spells it (dotted paths, typed values):
    vLLM's --speculative-config is JSON; SGLang's flags are one argparse destination each."""
    if engine == "vllm":
        (config,) = (v for k, v in _flag_values(strategy.flags).items() if k == "speculative_config")
        return {f"speculative_config.{k}": v for k, v in json.loads(config).items()}
    return {k: int(v) if v.isdigit() else v for k, v in _flag_values(strategy.flags).items()}


@pytest.mark.pure
@pytest.mark.parametrize("engine,version", [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_every_strategy_checks_what_its_own_flags_say(engine, version):
    """expect (what smoke L2 reads back from the engine's parser) and flags (what serve passes) are written
    separately in the engine data: every expected value must be the one the flags give, and what MTP<k> says in
    its name must be what the flags ask for (vLLM: k speculative tokens; SGLang's EAGLE chain with top-k 1: k
    steps, k + 1 draft tokens, the count SGLang itself sets for top-k 1)."""
    r = recipe(engine, version)
    assert r.strategies, f"{engine} {version} lists no strategy"
    for name, strategy in r.strategies.items():
        said = _what_the_flags_say(engine, strategy)
        expected = {k: v for k, v in strategy.expect if "@" not in k}
        assert expected, (name, "expects nothing of the parser")
        assert {k: said.get(k, "<not in the flags>") for k in expected} == expected, name
        if engine == "vllm":  # everything vLLM is asked is checked, and smoke L3's ratio is the asked count
            assert set(said) == set(expected), name
            assert strategy.k == said["speculative_config.num_speculative_tokens"], name
        mtp = re.fullmatch(r"MTP(\d+)", name)
        if mtp:
            k = int(mtp.group(1))
            if engine == "vllm":
                assert (said["speculative_config.method"], said["speculative_config.num_speculative_tokens"]) == ("mtp", k)
            else:
                assert (said["speculative_algorithm"], said["speculative_eagle_topk"]) == ("EAGLE", 1), name
                assert (said["speculative_num_steps"], said["speculative_num_draft_tokens"]) == (k, k + 1), name
            assert strategy.drafter == "" and "{drafter}" not in strategy.flags, name  # MTP drafts with the model
        for flag_value in strategy.flags[1::2]:
            for placeholder in re.findall(r"\{(\w+)\}", flag_value):
                assert placeholder in ("model", "drafter"), (name, flag_value)
                assert placeholder != "drafter" or strategy.drafter, (name, "{drafter} without a drafter")


@pytest.mark.pure
def test_the_strategy_check_catches_a_wrong_value():
    v = recipe("vllm", "0.33.0").strategy("MTP7")
    wrong = Strategy(v.name, v.versions, v.why_not, ("--speculative-config", '{"method":"mtp","num_speculative_tokens":6}'),
                     expect=v.expect, k=v.k)
    said = _what_the_flags_say("vllm", wrong)
    assert said["speculative_config.num_speculative_tokens"] == 6 != dict(wrong.expect)["speculative_config.num_speculative_tokens"]
    s = recipe("sglang", "0.5.23").strategy("MTP7")
    flags = list(s.flags)
    flags[flags.index("--speculative-num-draft-tokens") + 1] = "7"
    said = _what_the_flags_say("sglang", Strategy(s.name, s.versions, s.why_not, tuple(flags), expect=s.expect))
    assert (said["speculative_num_steps"], said["speculative_num_draft_tokens"]) == (7, 7)


@pytest.mark.pure
def test_the_smoke_data_of_each_engine_names_its_parser_and_metrics():
    v, s = recipe("vllm", "0.33.0"), recipe("sglang", "0.5.23")
    for r in (v, s):
        assert r.smoke["args_class"] and "{port}" in r.smoke["serve_args"] and r.smoke["spec_metrics"]["drafts"]
    assert s.smoke["name_resolver"]["call"].endswith("SpeculativeAlgorithm.from_string")
    assert v.smoke["cpu_env"] == {"VLLM_TARGET_DEVICE": "cpu"}


# -- all four layers against the stand-in, through the process launcher ------------------------------------
def test_every_layer_passes_on_a_working_server_and_the_reports_say_so(cell, tiny, tmp_path):
    rep = run_stand_in(cell, opts(tmp_path, tiny))
    assert rep.ok, report.table([rep])
    assert [(r.layer, r.strategy, r.status) for r in rep.results] == [
        ("L0", None, "pass"), ("L1", None, "pass"), ("JIT", None, "pass"), ("L2", "MTP2", "pass"), ("L2", "MTP7", "pass"),
        ("L3", "MTP2", "pass"), ("L3", "MTP7", "pass")]
    l3 = rep.get("L3", "MTP7")
    f = l3.figures
    assert f["drafts"] > 0 and f["draft_tokens"] == 7 * f["drafts"]
    assert f["output_tokens"] == 64 and f["boot_s"] >= 1 and f["ttft_s"] is not None and f["latency_s"] > 0
    assert f["ready_log_seen"] is True and f["output_text"].startswith("Paris")
    assert Path(l3.log).is_file() and "--speculative-config" in Path(l3.log).read_text()
    assert not engine.port_in_use(f["port"])  # the engine was stopped
    js, xml = report.write([rep], tmp_path / "out")
    data = json.loads(js.read_text())[0]
    assert data["result"] == "ok" and len(data["results"]) == 7
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite.get("tests") == "7" and suite.get("failures") == "0"
    assert [c.get("name").split(":")[0] for c in suite.findall("testcase")] == [
        "L0 image", "L1 image", "JIT image", "L2 MTP2", "L2 MTP7", "L3 MTP2", "L3 MTP7"]


@pytest.mark.parametrize("mode, expected", [
    ("never-ready", "not ready after 4s: GET /health answered 503"),
    ("crash", "the engine exited with code 3 during boot"),
    ("empty", "the completion returned no text"),
    ("flat-counters", "speculative decoding did not run: standin:spec_decode_num_drafts_total did not rise"),
    ("wrong-k", "rose by 96, expected 32 drafts x K=2"),
])
def test_l3_fails_with_the_reason_and_always_stops_the_engine(cell, tiny, tmp_path, mode, expected):
    rep = run_stand_in(cell, opts(tmp_path, tiny, mode, strategies=("MTP2",), boot_timeout=4))
    r = rep.get("L3", "MTP2")
    assert r.status == "fail" and expected in r.reason, r.reason
    assert rep.get("L2", "MTP2").status == "pass" and not rep.ok
    if mode == "crash":
        assert "crashes during boot, as asked" in r.reason  # the log tail comes with it
    if "port" in r.figures:
        assert not engine.port_in_use(r.figures["port"])


def test_l3_fails_when_the_port_is_taken(cell, tiny, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rep = run_stand_in(cell, opts(tmp_path, tiny, strategies=("MTP2",), port=port))
    r = rep.get("L3", "MTP2")
    assert r.status == "fail" and f"port {port} on 127.0.0.1 is in use" in r.reason


def test_l2_negative_controls_fail_in_the_engines_own_parser(cell, tiny, tmp_path):
    """The flags popular recipes use do not exist; a wrong value parses but resolves to the wrong config."""
    launcher = ProcessLauncher(python=sys.executable, gpus=False, extra_env=stand_in_env())
    cases = [
        Strategy("enable-mtp7", None, "-", ("--enable-mtp7",), expect=(("speculative_config.num_speculative_tokens", 7),)),
        Strategy("mtp2-chunk", None, "-", ("--mtp2-chunk-size", "2")),
        Strategy("wrong-k", None, "-", ("--speculative-config", '{"method":"mtp","num_speculative_tokens":3}'),
                 expect=(("speculative_config.num_speculative_tokens", 7),)),
        Strategy("bad-method", None, "-", ("--speculative-config", '{"method":"mtp2"}')),
    ]
    res = {r.strategy: r for r in layers.l2(cell, launcher, opts(tmp_path, tiny), cases)}
    assert "unrecognized arguments: --enable-mtp7" in res["enable-mtp7"].reason
    assert "unrecognized arguments: --mtp2-chunk-size 2" in res["mtp2-chunk"].reason
    assert "num_speculative_tokens = 3, expected 7" in res["wrong-k"].reason
    assert "unsupported speculative method 'mtp2'" in res["bad-method"].reason
    assert all(r.status == "fail" for r in res.values())


def test_a_strategy_the_version_cannot_run_is_refused_from_the_data_before_l2(cell, tiny, tmp_path):
    rep = run_stand_in(cell, opts(tmp_path, tiny, strategies=("DFlash2",)))
    for layer in ("L2", "L3"):
        r = rep.get(layer, "DFlash2")
        assert r.status == "skip" and "refused by the engine data" in r.reason and "no DFlash2 before 2.0" in r.reason
    assert rep.ok


def test_a_failed_lower_layer_skips_the_layers_above_it(cell, tiny, tmp_path):
    # no PYTHONPATH: the stand-in engine is not installed for this interpreter, so L0 fails
    rep = smoke_process(cell, sys.executable, opts(tmp_path, tiny))
    assert rep.get("L0", None).status == "fail" and "stand-in-engine is not installed" in rep.get("L0", None).reason
    for r in rep.results[1:]:
        assert r.status == "skip" and "L0 did not pass" in r.reason


def test_l3_is_skipped_without_a_gpu_unless_asked_to_run_without_one(cell, tiny, tmp_path):
    rep = run_stand_in(cell, opts(tmp_path, tiny, l3_without_gpu=False, no_gpu_reason="this host has no NVIDIA GPU"))
    assert rep.get("L3", "MTP2").reason == "skipped because this host has no NVIDIA GPU"
    assert rep.get("L2", "MTP2").status == "pass"


# -- the verb --------------------------------------------------------------------------------------------
def test_smoke_verb_writes_json_and_junit_and_exits_0(tmp_path):
    res = builder("smoke", CELL, "--matrix", str(MATRIX), "--launcher", "process", "--python", sys.executable,
                  "--gpus", "none", "--out-dir", str(tmp_path), "--strategy", "MTP2", "--json",
                  env={**stand_in_env(), "BUILDER_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "alias" not in res.stderr
    data = json.loads(res.stdout)
    assert data["cell"] == CELL and data["result"] == "ok" and data["launcher"] == "process"
    assert {(r["layer"], r["status"]) for r in data["results"]} == {("L0", "pass"), ("L1", "pass"), ("JIT", "pass"), ("L2", "pass"), ("L3", "pass")}
    assert (tmp_path / CELL / "smoke.json").is_file() and (tmp_path / CELL / "smoke.xml").is_file()


def test_smoke_verb_exits_1_and_prints_the_table_with_the_reason(tmp_path):
    res = builder("smoke", CELL, "--matrix", str(MATRIX), "--launcher", "process", "--python", sys.executable,
                  "--gpus", "none", "--report-dir", str(tmp_path), "--strategy", "MTP2", "--boot-timeout", "5",
                  "--env", "STAND_IN_MODE=never-ready", env={**stand_in_env(), "BUILDER_CACHE_DIR": str(tmp_path / "c")})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "note: --report-dir is an alias of --out-dir" in res.stderr  # smoke's former name, still taken
    assert (tmp_path / CELL / "smoke.json").is_file()
    assert "L3 MTP2     fail  not ready after 5s" in res.stdout
    assert f"{CELL}  MTP2      pass  pass  pass  pass  FAIL" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--strategy", "MPT2"], "--strategy: 'MPT2' is not a strategy (did you mean 'MTP2'?)"),
    (["--layers", "L0,L5"], "--layers: L5 unknown"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS': write NAME=VALUE"),
    (["--port", "70000"], "--port: '70000' is not a TCP port"),
    (["--gpus", "first"], "--gpus: 'first': write auto, all, none or device ids like 0,1"),
    (["--out-dir", "a", "--report-dir", "b"], "--out-dir and --report-dir (its alias) name two directories"),
    (["--model", "/nonexistent"], "--model /nonexistent: not a model directory"),
])
def test_smoke_verb_refuses_bad_input_with_exit_2(args, message, tmp_path):
    res = builder("smoke", CELL, "--matrix", str(MATRIX), "--launcher", "process", "--report-dir", str(tmp_path), *args)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_smoke_verb_names_the_cells_when_the_target_is_neither_a_cell_nor_an_image(tmp_path):
    res = builder("smoke", "no-such-cell", "--matrix", str(MATRIX), "--launcher", "process")
    assert res.returncode == 2 and f"cells: {CELL}" in res.stderr


def test_l1_sees_past_a_package_init_that_rewords_its_extensions_import_error(tmp_path):
    """vLLM's vllm_flash_attn/__init__.py imports _vllm_fa2_C / _vllm_fa3_C and re-raises any failure as its own
    ImportError, hiding that the library only lacks the driver (libcuda) on a CPU host. The probe loads each
    extension from its file: the one linked to libcuda is "needs-driver", its healthy sibling loads. Real
    CPython extensions, compiled here; libcuda.so.1 is a stub that exists only while linking."""
    import shutil
    import sysconfig

    from builder.deploy.smoke import probe

    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no host C compiler (cc, gcc) on PATH"
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cuda.c").write_text("int cuInit(unsigned int flags) { return flags; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1"),
                    str(stub / "cuda.c")], check=True)
    pkg = tmp_path / "site" / "fakeattn"
    pkg.mkdir(parents=True)
    for name, body in (("_needs_cuda_C", "extern int cuInit(unsigned int); int touch(void) { return cuInit(0); }"),
                       ("_fine_C", "int touch(void) { return 0; }")):
        src = stub / f"{name}.c"
        src.write_text("#include <Python.h>\n" + body + "\n"
                       f"static struct PyModuleDef m = {{PyModuleDef_HEAD_INIT, \"{name}\", NULL, -1, NULL}};\n"
                       f"PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&m); }}\n")
        subprocess.run([cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o",
                        str(pkg / f"{name}.abi3.so"), str(src), "-Wl,--no-as-needed", f"-L{stub}", "-l:libcuda.so.1"]
                       if name == "_needs_cuda_C" else
                       [cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o",
                        str(pkg / f"{name}.abi3.so"), str(src)], check=True)
    (stub / "libcuda.so.1").unlink()
    (pkg / "__init__.py").write_text(
        "try:\n    from . import _needs_cuda_C, _fine_C\nexcept ImportError as e:\n"
        "    raise ImportError('fakeattn requires the CUDA flash attention extensions') from e\n")
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        needs = probe._load_extension("fakeattn/_needs_cuda_C.abi3.so", str(pkg / "_needs_cuda_C.abi3.so"))
        fine = probe._load_extension("fakeattn/_fine_C.abi3.so", str(pkg / "_fine_C.abi3.so"))
    finally:
        sys.path.remove(str(tmp_path / "site"))
        for name in [m for m in sys.modules if m.startswith("fakeattn")]:
            del sys.modules[name]
    assert needs[0] == "needs-driver" and "libcuda.so.1" in needs[1], needs
    assert fine == ("ok", "loaded from its file (its package's __init__ failed to import)"), fine


def test_the_jit_probe_leaves_no_work_directory_behind(tmp_path, monkeypatch):
    """The JIT probe's builds run in temporary directories; on the process route the probe runs on the host, whose
    /tmp kept one directory per path and module per run (66 of them on this machine after a day of tests)."""
    import tempfile

    from builder.deploy.smoke import probe

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = {"paths": ["python-c", "no-such-path"],
            "modules": [{"name": "m", "archs": [90], "cache_env": "BUILDER_TEST_CACHE", "framework": "none"}]}
    got = probe.cmd_jit(spec)
    assert set(got["paths"]) == {"python-c", "no-such-path"} and "m@sm_90" in got["modules"], got
    assert "does not know the JIT path" in got["paths"]["no-such-path"]["error"]
    assert list(tmp_path.iterdir()) == []
