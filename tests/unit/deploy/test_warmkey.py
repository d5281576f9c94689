"""The warm key (builder/deploy/runtime/warmkey.py): a launch line read into the parts the caches' keys hold, the record a
warm image carries (label io.builder.warm.key) read back, and the key data's own checks. The judge's verdicts on
the real data are tests/unit/deploy/test_warmjudge.py."""

from __future__ import annotations

import json

import pytest

from builder.deploy.runtime import warmkey as key_mod
from builder.deploy.runtime.warmkey import FlagMap, Record

VLLM_LIKE = FlagMap({"--max-model-len": "max-model-len", "-tp": "tp", "--tensor-parallel-size": "tp",
                     "--speculative-config": "speculative", "--enforce-eager": "cuda-graphs"},
                    frozenset({"--host", "--port"}))


def test_a_launch_line_is_read_into_its_key_parts():
    got = VLLM_LIKE.split(["/models/m", "--host", "0.0.0.0", "--port", "8000", "--max-model-len=4096", "-tp", "2",
                           "--speculative-config", '{"num_speculative_tokens": 2, "method": "mtp"}',
                           "--enforce-eager", "--seed", "-1"])
    assert got["model-path"] == "/models/m" and got["max-model-len"] == "4096" and got["tp"] == "2"
    # JSON compared as JSON: the same config written in another key order is the same part
    assert json.loads(got["speculative"]) == [["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']]
    assert json.loads(got["cuda-graphs"]) == [["--enforce-eager", ""]]
    # a flag the data does not know may reach the config hash: it counts, with its value (a negative number too)
    assert json.loads(got["engine-args"]) == [["--seed", "-1"]]
    assert got["dp"] == "1" and "--host" not in got.get("engine-args", "")  # neutral flags reach no part


def test_aliases_and_the_last_value_given_count_as_argparse_reads_them():
    a = VLLM_LIKE.split(["m", "-tp", "2"])
    b = VLLM_LIKE.split(["m", "--tensor-parallel-size", "1", "--tensor-parallel-size", "2"])
    assert a["tp"] == b["tp"] == "2"
    assert VLLM_LIKE.split(["m"])["tp"] == "1"  # absent: one GPU, as every engine defaults


def test_the_record_round_trips_through_its_label_and_forged_ones_are_refused():
    rec = Record("NVIDIA H200", 132, "sm90", "580.1", ("/models/m", "-tp", "1"), {"VLLM_USE_DEEP_GEMM": "1"},
                 "ab" * 32, frozenset({"rank_0_0"}), {"vllm": 12, "triton": 1498})
    back = Record.from_label(rec.to_label())
    assert back == rec
    # read into parts with the data of the day: the same record, a flag map learnt later
    assert back.side(VLLM_LIKE).value("tp") == "1" and back.side(None).value("tp") is None
    assert back.side(VLLM_LIKE).value("sm-count") == "132" and back.side(VLLM_LIKE).value("rank") == "rank_0_0"
    good = json.loads(rec.to_label())
    for change in ({"args": "m -tp 1"}, {"args": [1]}, {"env": {"A": 1}}, {"caches": {"vllm": "12"}},
                   {"caches": {"vllm": True}}, {"ranks": ["../../etc"]}, {"sm-count": "132"}, {"format": 2},
                   {"model-config": 5}):
        assert Record.from_label(json.dumps({**good, **change})) is None, change
    for bad in ("", "[]", "{}", "{"):
        assert Record.from_label(bad) is None, bad


def test_ranks_a_serve_needs_and_those_a_capture_holds(tmp_path):
    assert key_mod.needed_ranks("2", "1") == {"rank_0_0", "rank_1_0"}
    assert key_mod.needed_ranks(None, None) == {"rank_0_0"}
    for r in ("rank_0_0", "rank_1_0", "rank_x"):
        (tmp_path / "vllm" / "torch_compile_cache" / "abc123" / r).mkdir(parents=True)
    assert key_mod.ranks_in(tmp_path) == {"rank_0_0", "rank_1_0"}


def test_files_are_counted_per_cache_by_their_subdirectory():
    listing = {"vllm/a": 1, "vllm/b/c": 2, "triton/k/x.cubin": 3, "home/.x": 1, "stray": 1}
    assert key_mod.files_per_cache(listing, {"vllm": "vllm", "triton": "triton", "home": "home"}) == {
        "home": 1, "triton": 1, "vllm": 2}


def test_the_key_data_refuses_unknown_parts_and_caches():
    parts = {"parts": {p: {"what": p} for p in key_mod.PARTS}}
    ok = key_mod.parse({**parts, "keys": [{"cache": "vllm", "engine": "vllm", "versions": ">=1",
                                           "parts": [{"part": "gpu-name", "at": "x.py:1"}]}]}, {"vllm"})
    assert ok.key_of("vllm", "vllm", "1.2").parts[0].at == "x.py:1" and ok.key_of("vllm", "vllm", "0.9") is None
    with pytest.raises(ValueError, match="part 'gpu' is not one of"):
        key_mod.parse({**parts, "keys": [{"cache": "vllm", "engine": "vllm", "versions": ">=1",
                                          "parts": [{"part": "gpu"}]}]}, {"vllm"})
    with pytest.raises(ValueError, match="not an engines.toml compile cache"):
        key_mod.parse({**parts, "keys": [{"cache": "nope", "engine": "vllm", "versions": ">=1"}]}, {"vllm"})
    with pytest.raises(ValueError, match="missing"):
        key_mod.parse({"parts": {}}, {"vllm"})


def test_the_shipped_key_data_reads():
    data = key_mod.data()
    assert set(data.what) == set(key_mod.PARTS)
