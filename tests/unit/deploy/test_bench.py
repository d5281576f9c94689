"""builder bench: the article workload (exact prompt lengths in the tiny model's tokenizer), the refusal of a strategy
the image was not built for, the engine's speculative-decoding figures and the losslessness check, the outputs
(table, JSON, CSV, PNG), `bench diff` on recorded results — and the real load generator (vLLM's `vllm bench
serve`) with the statistics it reports, against the stand-in engine server (tests/fixtures/smoke/stand_in: a
TEST DOUBLE with known latencies, not an engine) through the process launcher on 127.0.0.1.

The load-generator test needs an environment with vLLM (which needs torch): BUILDER_BENCH_CLIENT_PYTHON names
one (on the GPU host: the vLLM bundle's interpreter); without it the test is slow and installs vllm==0.26.0 into
$BUILDER_ENGINE_VENVS (default ~/.cache/builder/engine-venvs, reused)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import pytest

from builder.deploy.bench import client, results, run, workload
from builder.deploy.strategies import NONE
from builder.deploy.strategies import for_bench as parse_strategies
from builder.engines import recipe
from builder.errors import UserError
from builder.deploy.smoke import tinymodel

from tests.helpers import REPO, client_python

STAND_IN = REPO / "tests" / "fixtures" / "smoke" / "stand_in"
SMOKE_MATRIX = REPO / "tests" / "fixtures" / "smoke" / "matrix.toml"
CELL = "stand-in-engine-1.0.0-cu130-py311-sm80.90"
RECORDED = REPO / "tests" / "fixtures" / "bench"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tinymodel.TinyModel:
    return tinymodel.ensure(tmp_path_factory.mktemp("models"))


def builder(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout)


# -- workloads ---------------------------------------------------------------------------------------------
@pytest.mark.pure
def test_article_workload_is_data_and_its_prompts_have_exact_lengths_in_the_models_tokenizer(tiny, tmp_path):
    w = workload.load("article")
    assert (w.concurrency, w.requests, w.output_tokens) == (50, 200, 256)
    assert w.mix == ((0.7, 32, 128), (0.3, 512, 2048))
    lengths = workload.input_lengths(w)
    assert sum(32 <= n <= 128 for n in lengths) == 140 and sum(512 <= n <= 2048 for n in lengths) == 60
    assert lengths == workload.input_lengths(w)  # the seed fixes them
    info = workload.write_dataset(w, tiny.target, tmp_path / "article.jsonl")
    assert info["requests"] == 200 and info["exact_length"] == 200
    rows = [json.loads(x) for x in (tmp_path / "article.jsonl").read_text().splitlines()]
    maker = workload.PromptMaker(tiny.target / "tokenizer.json")
    assert [maker.count(r["prompt"]) for r in rows[:20]] == lengths[:20]
    assert {r["output_tokens"] for r in rows} == {256}


def test_a_workload_file_overrides_and_bad_workloads_are_refused(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('concurrency = 8\nrequests = 10\noutput_tokens = 64\nmix = [{ share = 1.0, input_tokens = [10, 20] }]\n')
    w = workload.load(str(f), requests=5)
    assert (w.name, w.concurrency, w.requests) == ("mine", 8, 5)
    f.write_text('concurrency = 8\nrequests = 10\noutput_tokens = 64\nmix = [{ share = 0.5, input_tokens = [10, 20] }]\n')
    with pytest.raises(UserError, match="add up to 1"):
        workload.load(str(f))
    with pytest.raises(UserError, match="neither a workload"):
        workload.load("no-such-workload")
    r = builder("bench", CELL, "--matrix", str(SMOKE_MATRIX), "--launcher", "process", "--workload", "nope")
    assert r.returncode == 2 and "neither a workload of the data" in r.stderr


# -- strategies --------------------------------------------------------------------------------------------
def test_a_strategy_the_image_was_not_built_for_is_refused_before_anything_runs():
    r = recipe("vllm", "0.26.0")
    assert parse_strategies("all", ("MTP2", "MTP7"), r, "img") == (NONE, "MTP2", "MTP7")
    assert parse_strategies("none,mtp2", ("MTP2", "MTP7"), r, "img") == (NONE, "MTP2")
    with pytest.raises(UserError, match="was built and smoke-tested for MTP2 "):
        parse_strategies("MTP7", ("MTP2",), r, "img")
    with pytest.raises(UserError, match="DFlash2"):  # the engine data: vLLM 0.26.0 cannot run DFlash2
        parse_strategies("DFlash2", ("MTP2", "MTP7", "DFlash2"), r, "img")
    # through the verb, on this GPU-less host: refused with exit 2 before any GPU question is asked
    out = builder("bench", CELL, "--matrix", str(SMOKE_MATRIX), "--launcher", "process", "--strategy", "DFlash2")
    assert out.returncode == 2 and "the stand-in has no DFlash2 before 2.0" in out.stderr
    out = builder("bench", "vllm-0.26.0-cu130-torch2.11.0-py312-sm90", "--matrix",
                  str(REPO / "tests" / "fixtures" / "gpu-host" / "matrix.toml"), "--launcher", "process",
                  "--strategy", "none,MTP2,MTP9")
    assert out.returncode == 2 and "'MTP9' is not a strategy" in out.stderr


# -- the engine's figures and losslessness ---------------------------------------------------------------
@pytest.mark.pure
def test_spec_figures_come_from_the_engines_counter_deltas_and_sglangs_gauge_and_server_info():
    vllm = {"spec_metrics": {"drafts": "d", "draft_tokens": "t", "accepted": "a"}}
    f = run.spec_figures(vllm, {"d": 10, "t": 20, "a": 1}, {"d": 110, "t": 220, "a": 51}, None)
    assert f == {"spec_drafts": 100, "spec_draft_tokens": 200, "spec_accepted": 50, "spec_acceptance_rate": 0.25,
                 "spec_acceptance_length": 1.5}
    sgl = {"spec_metrics": {"drafts": "sglang:spec_verify_calls_total", "accept_length": "sglang:spec_accept_length"}}
    f = run.spec_figures(sgl, {"sglang:spec_verify_calls_total": 3},
                         {"sglang:spec_verify_calls_total": 66, "sglang:spec_accept_length": 1.7},
                         {"internal_states": [{"avg_spec_accept_length": 1.69}]})
    assert f == {"spec_drafts": 63, "spec_acceptance_length": 1.7, "spec_acceptance_length_server_info": 1.69}
    # without speculation SGLang 0.5.17 reports the gauge as 0 and no verify calls (H200, bench of 2026-12-01)
    assert run.spec_figures(sgl, {}, {"sglang:spec_accept_length": 0.0}, None) == {}
    agree = {"spec_draft_tokens": 200, "spec_accepted": 50,
             "client_spec_decode": {"spec_decode_draft_tokens": 200, "spec_decode_accepted_tokens": 50}}
    assert run.cross_check(agree) == "agrees"
    agree["client_spec_decode"]["spec_decode_accepted_tokens"] = 49
    assert run.cross_check(agree).startswith("differs")


@pytest.mark.pure
def test_losslessness_is_the_match_rate_against_no_speculation_and_flags_below_the_threshold():
    rows = [{"strategy": NONE, "greedy_outputs": ["a", "b", "c", "d"]},
            {"strategy": "MTP2", "greedy_outputs": ["a", "b", "c", "d"]},
            {"strategy": "MTP7", "greedy_outputs": ["a", "x", "c", "y"]}]
    run.lossless(rows, 1.0)
    assert (rows[1]["lossless_match_rate"], rows[1]["lossless"]) == (1.0, "ok")
    assert rows[2]["lossless_match_rate"] == 0.5 and rows[2]["lossless"].startswith("FLAGGED: 2/4")
    alone = [{"strategy": "MTP2", "greedy_outputs": ["a"]}]
    run.lossless(alone, 1.0)
    assert alone[0]["lossless_match_rate"] is None and "no baseline" in alone[0]["lossless"]


# -- outputs and diff on recorded results -----------------------------------------------------------------
def recorded() -> dict:
    return results.load(str(RECORDED / "stand-in-quick.json"))


@pytest.mark.pure
def test_outputs_table_json_csv_and_png(tmp_path):
    doc = recorded()
    paths = results.write(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"] == doc["rows"]
    head, *lines = paths["csv"].read_text().splitlines()
    assert head.startswith("digest,engine,engine_version,gpu,driver,cuda,strategy") and len(lines) == len(doc["rows"])
    text = paths["table"].read_text()
    assert "TTFT p50" in text and all(r["strategy"] in text for r in doc["rows"])
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 10_000


@pytest.mark.pure
def test_the_spread_of_the_repeats_is_in_the_table_and_the_csv_and_a_row_of_fewer_is_not_comparable(tmp_path):
    doc = recorded()
    row = doc["rows"][0]
    rates = [r["request_throughput"] for r in row["runs"]]
    assert len(rates) >= 3 and min(rates) < max(rates)
    short = {**row, "strategy": "MTP7", "runs": row["runs"][:1], "repeats": 1}
    doc["rows"] = [row, short]
    paths = results.write(doc, tmp_path, png=False)
    text = paths["table"].read_text()
    assert "req/s min-max" in text and f"{min(rates):.2f}-{max(rates):.2f}" in text
    assert "MTP7: not comparable: n = 1 measured run(s); a figure to compare needs at least 3" in text
    assert f"{row['strategy']}: not comparable" not in text
    head, first, second = paths["csv"].read_text().splitlines()
    cols = head.split(",")
    got = dict(zip(cols, first.split(",")))
    assert float(got["request_throughput_min"]) == min(rates) and float(got["request_throughput_max"]) == max(rates)
    assert float(got["request_throughput_stdev"]) > 0 and got["comparable"] == "True"
    assert dict(zip(cols, second.split(",")))["comparable"] == "False"
    _, problems = results.diff(doc, doc)
    assert any("MTP7" in p and "needs at least 3" in p for p in problems)


def test_the_png_on_a_fresh_host_reads_no_system_fonts_and_leaves_the_users_matplotlib_cache_alone(tmp_path):
    """`builder bench plot` where matplotlib never ran (empty caches, no MPLCONFIGDIR): the PNG is drawn,
    `fc-list` (a recording stand-in first on PATH) is never started, and the font list lands in builder's
    cache directory, not matplotlib's."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "fc-list").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "fc-list-calls"}\nexec /usr/bin/fc-list "$@"\n')
    (shim / "fc-list").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "MPL_IGNORE_SYSTEM_FONTS")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               PATH=f"{shim}:{env['PATH']}")
    res = subprocess.run([sys.executable, "-m", "builder.cli", "bench", "plot", str(RECORDED / "stand-in-quick.json"),
                          "--output", str(tmp_path / "p.png")], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "fc-list-calls").exists(), (tmp_path / "fc-list-calls").read_text()
    assert list((tmp_path / "cache" / "builder" / "matplotlib").glob("fontlist-*.json"))
    assert not (tmp_path / "cache" / "matplotlib").exists()


def test_diff_flags_only_regressions_beyond_the_noise_of_the_repeats(tmp_path):
    old = recorded()
    assert all(len(r["runs"]) >= 3 for r in old["rows"])
    same, problems = results.diff(old, old)
    assert not problems and same and not any(e["regression"] for e in same)
    slower = copy.deepcopy(old)
    for run_ in slower["rows"][0]["runs"]:
        run_["ttft_ms_p99"] *= 3  # every repeat far outside the old range
    noisy = copy.deepcopy(old)
    for i, run_ in enumerate(noisy["rows"][0]["runs"]):  # one repeat inside the old range: noise, not regression
        run_["ttft_ms_p99"] *= 1.0 if i == 0 else 3
    entries, _ = results.diff(old, slower)
    flagged = [(e["strategy"], e["figure"]) for e in entries if e["regression"]]
    assert flagged == [(old["rows"][0]["strategy"], "ttft_ms_p99")]
    entries, _ = results.diff(old, noisy)
    assert not any(e["regression"] for e in entries)
    paths = {}
    for name, doc in (("old", old), ("slower", slower)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    assert builder("bench", "diff", str(paths["old"]), str(paths["old"])).returncode == 0
    bad = builder("bench", "diff", str(paths["old"]), str(paths["slower"]))
    assert bad.returncode == 1 and "REGRESSION" in bad.stdout and "ttft_ms_p99" in bad.stderr
    few = copy.deepcopy(old)
    few["rows"][0]["runs"] = few["rows"][0]["runs"][:2]
    paths["few"] = tmp_path / "few.json"
    paths["few"].write_text(json.dumps(few))
    short = builder("bench", "diff", str(paths["old"]), str(paths["few"]))
    assert short.returncode == 2 and "at least 3" in short.stderr


# -- the real load generator against the stand-in ----------------------------------------------------------


@pytest.mark.slow
def test_the_load_generator_reports_the_stand_ins_known_latencies_and_the_engines_counters(tiny, tmp_path):
    """TTFT 60 ms and 5 ms between tokens (STAND_IN_TTFT_MS / STAND_IN_ITL_MS), 32 output tokens: vLLM's client
    must see TTFT ~ 60 ms, ITL and TPOT ~ 5 ms, E2E ~ 60 + 31 x 5 = 215 ms; the stand-in accepts 1 token per
    draft, so MTP2's acceptance rate is 1/2 and length 2; under MTP7 the stand-in changes some greedy outputs,
    which losslessness must flag."""
    out = tmp_path / "out"
    env = ["--env", f"PYTHONPATH={STAND_IN}", "--env", "STAND_IN_TTFT_MS=60", "--env", "STAND_IN_ITL_MS=5",
           "--env", "STAND_IN_ACCEPT=1", "--env", "STAND_IN_LOSSY_K=7"]
    r = builder("bench", CELL, "--matrix", str(SMOKE_MATRIX), "--launcher", "process", "--python", sys.executable,
                "--gpus", "none", "--model", str(tiny.target), "--workload", "quick", "--repeats", "3",
                "--strategy", "all", "--client-python", client_python(), "--out-dir", str(out), "--boot-timeout", "60",
                *env, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / CELL / "bench.json").read_text())
    rows = {row["strategy"]: row for row in doc["rows"]}
    assert list(rows) == [NONE, "MTP2", "MTP7"] and doc["client"] == "vllm bench serve"
    for row in rows.values():
        assert row["repeats"] == 3 and row["completed"] == 16 and row["errors"] == 0
        assert 55 <= row["ttft_ms_p50"] <= 90, row
        assert 4.5 <= row["itl_ms_p50"] <= 8 and 4.5 <= row["tpot_ms_p50"] <= 8, row
        assert 200 <= row["e2el_ms_p50"] <= 300, row
        assert row["ttft_ms_p50"] <= row["ttft_ms_p90"] <= row["ttft_ms_p99"]
        assert 4 / 0.3 <= row["request_throughput"] <= 4 / 0.2 + 2
        assert row["request_goodput"] == pytest.approx(row["request_throughput"], rel=0.05)  # every TTFT < 300 ms
        assert set(row["spread"]["ttft_ms_p99"]) == {"min", "max", "stdev", "relative"}
        assert row["boot_s"] >= 1.0 and row["first_request_ttft_s"] >= 0.06
        assert row["argv"][:3] == ["python3", "-m", "stand_in_engine.server"]
    assert rows["MTP2"]["spec_acceptance_rate"] == 0.5 and rows["MTP2"]["spec_acceptance_length"] == 2.0
    assert rows["MTP7"]["spec_draft_tokens"] == 7 * rows["MTP7"]["spec_drafts"]
    assert NONE not in [k for k in rows[NONE] if k.startswith("spec_drafts")]
    assert rows["MTP2"]["lossless"] == "ok" and rows["MTP7"]["lossless"].startswith("FLAGGED")
    assert (out / CELL / "bench.png").is_file() and (out / CELL / "bench.csv").is_file()


# -- the load generator's result file, read through schema.CLIENT_RESULT -------------------------------------
# where vLLM's client writes its result: --result-dir and --result-filename, read by both test doubles below
CLIENT_ARGS = '''dir=""; file=""
while [ $# -gt 0 ]; do
  case "$1" in --result-dir) dir="$2"; shift ;; --result-filename) file="$2"; shift ;; esac
  shift
done
'''
FAKE_CLIENT = '''#!/bin/sh
# TEST DOUBLE of `python -m vllm.entrypoints.cli.main bench serve` (not vLLM): writes $FAKE_RESULT as its result file
''' + CLIENT_ARGS + '''printf '%s' "$FAKE_RESULT" > "$dir/$file"
'''
GOOD_CLIENT_RESULT = {"duration": 1.5, "completed": 16, "failed": 0, "request_throughput": 10.7, "output_throughput": 342.0,
                      "request_goodput": None, "p99_ttft_ms": 69.5, "p50_ttft_ms": 64.8, "errors": ["", ""],
                      "date": "20261201-120000", "backend": "openai", "ttfts": [0.06, 0.07]}
BAD_CLIENT_RESULTS = {  # name: (file text, words of the failure)
    "not-json": ("{", "not JSON"),
    "empty": ("", "not JSON"),
    "list": ("[]", "expected a table"),
    "no-completed": (json.dumps({k: v for k, v in GOOD_CLIENT_RESULT.items() if k != "completed"}), "completed"),
    "completed-string": (json.dumps({**GOOD_CLIENT_RESULT, "completed": "16"}), "completed"),
    "duration-negative": (json.dumps({**GOOD_CLIENT_RESULT, "duration": -1}), "duration"),
    "ttft-nan": (json.dumps({**GOOD_CLIENT_RESULT, "p99_ttft_ms": float("nan")}), "p99_ttft_ms"),
    "ttft-inf": (json.dumps({**GOOD_CLIENT_RESULT, "p99_ttft_ms": float("inf")}), "p99_ttft_ms"),
    "throughput-string": (json.dumps({**GOOD_CLIENT_RESULT, "request_throughput": "fast"}), "request_throughput"),
    "errors-string": (json.dumps({**GOOD_CLIENT_RESULT, "errors": "boom"}), "errors"),
    "errors-int-item": (json.dumps({**GOOD_CLIENT_RESULT, "errors": [5]}), "errors[0]"),
    "spec-rate-bool": (json.dumps({**GOOD_CLIENT_RESULT, "spec_decode_acceptance_rate": True}), "spec_decode_acceptance_rate"),
    "nested": ("[" * 40 + "]" * 40, "nested"),
    "recursion": ("[" * 100000, "result file"),
}


@pytest.fixture
def fake_client(tmp_path):
    path = tmp_path / "fake-client"
    path.write_text(FAKE_CLIENT)
    path.chmod(0o755)
    return lambda text: client.run(client.argv(str(path), "http://127.0.0.1:1", "m", "t", tmp_path / "d.jsonl", 1, 1, 1, 0,
                                               tmp_path, "result.json", None),
                                   {**os.environ, "FAKE_RESULT": text}, 60)


@pytest.mark.parametrize("name", sorted(BAD_CLIENT_RESULTS))
def test_a_malformed_load_generator_result_fails_the_strategy_naming_the_file_and_field(name, fake_client, tmp_path):
    text, words = BAD_CLIENT_RESULTS[name]
    with pytest.raises(client.ClientFailed) as exc:
        fake_client(text)
    assert words in str(exc.value) and str(tmp_path / "result.json") in str(exc.value), str(exc.value)


NO_MEASUREMENT = {  # well-formed results that measured nothing (issue 34): name → (result, words of the failure)
    "all-failed": ({**GOOD_CLIENT_RESULT, "completed": 0, "failed": 16, "request_throughput": 17.0,
                    "errors": ["Connection refused"] * 16}, "no request completed (16 failed)"),
    "none-completed": ({**GOOD_CLIENT_RESULT, "completed": 0, "failed": 0}, "no request completed"),
    "more-failed-than-completed": ({**GOOD_CLIENT_RESULT, "completed": 3, "failed": 13}, "13 of 16 requests failed"),
    "one-failed": ({**GOOD_CLIENT_RESULT, "failed": 1}, "1 of 17 requests failed"),
    "errors-without-a-failed-count": ({k: v for k, v in {**GOOD_CLIENT_RESULT, "errors": ["", "HTTP 500: boom"]}.items()
                                       if k != "failed"}, "1 of 17 requests failed; the first error: HTTP 500: boom"),
    "zero-duration": ({**GOOD_CLIENT_RESULT, "duration": 0}, "a duration of 0 s"),
    "null-duration": ({**GOOD_CLIENT_RESULT, "duration": None}, "a duration of null s"),
}


@pytest.mark.parametrize("name", sorted(NO_MEASUREMENT))
def test_a_result_of_failed_requests_or_no_time_is_a_failed_strategy_never_a_figure(name, fake_client, tmp_path):
    """Issue 34: a result in which every request failed showed as a healthy row (17 req/s, P99 under the SLO,
    exit 0). Failed requests, none completed or a zero duration now fail the strategy, the reason named."""
    result, words = NO_MEASUREMENT[name]
    with pytest.raises(client.ClientFailed) as exc:
        fake_client(json.dumps(result))
    assert words in str(exc.value) and str(tmp_path / "result.json") in str(exc.value), str(exc.value)


ALL_FAILED_CLIENT = '''#!/bin/sh
# TEST DOUBLE of `python -m vllm.entrypoints.cli.main bench serve` (not vLLM): every request failed
''' + CLIENT_ARGS + '''printf '{"duration": 0.9, "completed": 0, "failed": 16, "request_throughput": 17.0, "p99_ttft_ms": 5, "errors": ["refused"]}' > "$dir/$file"
'''


def test_bench_of_a_load_generator_whose_requests_all_failed_exits_1_with_the_reason_in_the_row(tiny, tmp_path):
    """The whole verb: the stand-in engine (a TEST DOUBLE) boots, the load generator (a TEST DOUBLE) reports every
    request failed: exit 1, the row is a failure naming why, no figure is shown."""
    fake = tmp_path / "client"
    fake.write_text(ALL_FAILED_CLIENT)
    fake.chmod(0o755)
    out = tmp_path / "out"
    r = builder("bench", CELL, "--matrix", str(SMOKE_MATRIX), "--launcher", "process", "--python", sys.executable,
                "--gpus", "none", "--model", str(tiny.target), "--workload", "quick", "--repeats", "1", "--no-warmup",
                "--strategy", "none",
                "--client-python", str(fake), "--out-dir", str(out), "--boot-timeout", "60",
                "--env", f"PYTHONPATH={STAND_IN}", timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / CELL / "bench.json").read_text())
    assert doc["rows"] == [] and len(doc["failures"]) == 1, doc
    assert "no request completed (16 failed)" in doc["failures"][0]["why"], doc["failures"]
    assert "17.00" not in r.stdout and "FAILED" in r.stdout + r.stderr


def test_a_well_formed_load_generator_result_gives_its_figures(fake_client):
    figs = client.figures(fake_client(json.dumps(GOOD_CLIENT_RESULT)).result)
    assert figs["completed"] == 16 and figs["ttft_ms_p99"] == 69.5 and figs["errors"] == 0 and figs["request_goodput"] is None


@pytest.mark.pure
def test_diff_refuses_results_that_do_not_compare_a_zero_old_median_and_a_nan_threshold():
    old = recorded()
    for path, value, words in ((("environment", "engine"), "vllm", "another engine"),
                               (("environment", "gpu"), "1 x NVIDIA H200", "another GPU"),
                               (("workload", "requests"), 999, "another workload"),
                               (("slo", "ttft_ms"), 200, "another SLO")):
        other = copy.deepcopy(old)
        other[path[0]][path[1]] = value
        entries, problems = results.diff(old, other)
        assert entries == [] and any(words in p for p in problems), problems
    zero = copy.deepcopy(old)
    for run_ in zero["rows"][0]["runs"]:
        run_["ttft_ms_p99"] = 0
    _, problems = results.diff(zero, old)
    assert any("old median of ttft_ms_p99 is 0" in p for p in problems), problems
    for bad in (float("nan"), float("inf"), -0.1):
        assert results.diff(old, old, bad)[1], bad
    assert results.diff(old, old, 0.0)[1] == []


COUNTING_CLIENT = '''#!/bin/sh
# TEST DOUBLE of `python -m vllm.entrypoints.cli.main bench serve` (not vLLM): the Nth call writes a result whose
# request throughput is N, and records its result file's name in $FAKE_CALLS
''' + CLIENT_ARGS + '''echo "$file" >> "$FAKE_CALLS"
n=$(wc -l < "$FAKE_CALLS")
printf '{"duration": 1.0, "completed": 4, "request_throughput": %s, "p99_ttft_ms": %s}' "$n" "$((n * 10))" > "$dir/$file"
'''


def test_one_discarded_warm_up_pass_comes_before_the_three_measured_repeats(tiny, tmp_path):
    """The engine (the stand-in server, a TEST DOUBLE) booted once: the workload's first pass is run and kept
    out of the figures, then three measured runs (the default) give the median and the spread."""
    from builder.deploy.runtime.engine import ProcessLauncher
    from builder.deploy.smoke import Model

    from tests.helpers import stand_in_cell

    fake = tmp_path / "client"
    fake.write_text(COUNTING_CLIENT)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    opts = run.BenchOptions(strategies=(NONE,), workload=workload.load("quick", None, None, None),
                            model=Model(tiny.target, tiny.drafter, tiny=True), client_python=str(fake),
                            client_env={"FAKE_CALLS": str(calls)}, out_dir=tmp_path / "out", lossless=False,
                            gpus=False, boot_timeout=60)
    launcher = ProcessLauncher(python=sys.executable, gpus=False, extra_env={"PYTHONPATH": str(STAND_IN)})
    row = run.bench_strategy(stand_in_cell(), launcher, run.NO_SPECULATION, opts, tmp_path / "d.jsonl")
    assert calls.read_text().split() == [f"client-{NONE}-warmup.json", *(f"client-{NONE}-{i}.json" for i in range(3))]
    assert row["warmup"]["request_throughput"] == 1
    assert [r["request_throughput"] for r in row["runs"]] == [2, 3, 4] and row["repeats"] == 3 and row["comparable"]
    assert row["request_throughput"] == 3 and row["spread"]["request_throughput"]["min"] == 2
    assert row["spread"]["ttft_ms_p99"] == {"min": 20, "max": 40, "stdev": 10.0, "relative": round(20 / 30, 4)}
    once = run.bench_strategy(stand_in_cell(), launcher, run.NO_SPECULATION,
                              run.BenchOptions(**{**opts.__dict__, "warmup": False, "repeats": 1}), tmp_path / "d.jsonl")
    assert "warmup" not in once and once["repeats"] == 1 and not once["comparable"]


def test_the_boot_state_is_measured_at_the_cache_root_cold_then_warm(tiny, tmp_path):
    """The process route with the cell's caches under a root (the stand-in server, a TEST DOUBLE, compiles into each
    cache it is given): the first boot finds the root empty and compiles (cold), the second finds those files and
    compiles nothing new (warm; only its lock files are written again). Measured: files at boot, files written."""
    from builder.deploy.runtime.engine import ProcessLauncher
    from builder.deploy.runtime import caches
    from builder.deploy.smoke import Model

    from tests.helpers import stand_in_cell

    fake = tmp_path / "client"
    fake.write_text(COUNTING_CLIENT)
    fake.chmod(0o755)
    cell = stand_in_cell()
    setting = caches.of_cell(cell, str(tmp_path / "root"))
    root = setting.root
    opts = run.BenchOptions(strategies=(NONE,), workload=workload.load("quick", None, None, None),
                            model=Model(tiny.target, tiny.drafter, tiny=True), client_python=str(fake),
                            client_env={"FAKE_CALLS": str(tmp_path / "calls")}, out_dir=tmp_path / "out",
                            lossless=False, gpus=False, boot_timeout=60, warmup=False, repeats=1, caches=setting)
    launcher = ProcessLauncher(python=sys.executable, gpus=False, extra_env={"PYTHONPATH": str(STAND_IN)})
    cold = run.bench_strategy(cell, launcher, run.NO_SPECULATION, opts, tmp_path / "d.jsonl")
    kernels = [f for f in cold["cache_written"] if f.endswith(".bin")]
    assert (cold["boot_state"], cold["cache_files_at_boot"], cold["cache_root"]) == ("cold", 0, root)
    assert len(kernels) == 9 and cold["cache_files_written"] == 15  # 3 caches x (3 kernels, a lock, an autotune file)
    warm = run.bench_strategy(cell, launcher, run.NO_SPECULATION, opts, tmp_path / "d.jsonl")
    assert (warm["boot_state"], warm["cache_files_at_boot"]) == ("warm", 15)
    assert all(f.endswith("standin.lock") for f in warm["cache_written"]), warm["cache_written"]
    assert run.boot_state(None, False, False) == "unknown"
