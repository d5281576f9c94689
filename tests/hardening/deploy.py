"""Round three of the bad inputs (issue 28): bench (its flags, workload files, `bench diff` and `bench plot` on
result files), `doctor --host` (nvidia-smi's text, image JSON, --gpus-file) and recorded pins files, as data in
the shape of tests/hardening/cases.py (each case the real CLI on a private copy of the cuda-ext fixture: its exit
code, the words of its one-line message, no traceback, nothing written). The GPU-host scripts' bad inputs are
not `builder` verbs: they are a parametrized test of their own (tests/unit/deploy/test_gpu_host_scripts.py), and the load
generator's result files, which only a run produces, a test of builder/deploy/bench/client.py (tests/unit/deploy/test_bench.py).

nvidia-smi here is tests/fixtures/host/double/nvidia-smi, a TEST DOUBLE that prints the files a case puts in
its working directory (nvidia-smi.csv, nvidia-smi-q.txt) and exits with nvidia-smi.rc.
"""

from __future__ import annotations

import copy
import json
import os

from tests.hardening.cases import CELL, M, REPO, Case, big_toml, deep_toml, directory, fifo, unreadable

BENCH = ["bench", CELL, *M, "--out-dir", "{tmp}/o"]
WORKLOAD = ["bench", CELL, *M, "--out-dir", "{tmp}/o", "--workload"]
PINS_BUILD = ["build", *M, "--work-dir", "{tmp}/w", "--log-dir", "{tmp}/l", "--pins-dir", "{tmp}/p", "--wheelhouse", "{tmp}/wh"]
RUNTIME_PINS = f"p/{CELL}.txt"
BUILD_PINS = f"p/{CELL}.build-cuda-ext.txt"
IMAGES = REPO / "tests" / "fixtures" / "host" / "images"
IMAGE = str(IMAGES / "vllm-0.33.0-cu130-torch2.14.0-py312-sm80.90.json")
DOUBLE_PATH = {"PATH": f"{REPO / 'tests' / 'fixtures' / 'host' / 'double'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
GPU = {"index": 0, "name": "NVIDIA H200", "driver": "580.159.04", "compute_cap": "9.0", "brand": "NVIDIA"}
GPUS_FILE = {"gpus.json": json.dumps([GPU])}
RECORDED = json.loads((REPO / "tests" / "fixtures" / "bench" / "stand-in-quick.json").read_text())
H = "a" * 64

NUMBERS = {"nan": "nan", "inf": "inf", "neg-inf": "-inf", "negative": "-1", "zero": "0", "huge": "1e308",
           "word": "abc", "empty": ""}


def _result(edit) -> str:
    doc = copy.deepcopy(RECORDED)
    edit(doc)
    return json.dumps(doc)


def _set(path: str, value):
    """An edit of the recorded bench.json: `rows.0.runs.1.ttft_ms_p99` = value."""

    def edit(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


def _drop(path: str):
    def edit(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[int(last) if isinstance(node, list) else last]

    return edit


def _zero_old_ttft(doc):
    for run in doc["rows"][0]["runs"]:
        run["ttft_ms_p99"] = 0


def _cases() -> list[Case]:
    out: list[Case] = []
    add = out.append

    # -- bench: flags, each through the one definition smoke uses (cli/flags.py), before any image or boot ------
    for name, v in NUMBERS.items():
        add(Case(f"bench-boot-timeout-{name}", "bench", [*BENCH, "--boot-timeout", v], expect=("--boot-timeout",)))
        add(Case(f"bench-slo-ttft-{name}", "bench", [*BENCH, "--slo-ttft-ms", v], expect=("--slo-ttft-ms",)))
    add(Case("bench-boot-timeout-over-a-day", "bench", [*BENCH, "--boot-timeout", "86401"], expect=("--boot-timeout", "86400")))
    add(Case("smoke-boot-timeout-over-a-day", "bench", ["smoke", CELL, *M, "--report-dir", "{tmp}/r", "--boot-timeout", "86401"],
             expect=("--boot-timeout", "86400")))
    add(Case("bench-slo-ttft-over-an-hour", "bench", [*BENCH, "--slo-ttft-ms", "3600001"], expect=("--slo-ttft-ms",)))
    for flag, values in (("--requests", ("0", "-1", "1000001", "abc", "1.5")), ("--concurrency", ("0", "-5", "100001", "x")),
                         ("--seed", ("-1", "4294967296", "x")), ("--repeats", ("0", "-1", "1001", "x"))):
        for v in values:
            add(Case(f"bench{flag}-{v}", "bench", [*BENCH, flag, v], expect=(flag,)))
    for v in (",", " ", ", ,", "MTP3", "none;rm", "all,MTP2", "none,all", "MTP2,,x", "DFlash3", "mtp2 mtp7"):
        add(Case(f"bench-strategy-{v!r}", "bench", [*BENCH, "--strategy", v], expect=("--strategy",)))
    for v in ("A B=1", "=1", "NOEQUALS", "1A=2", "A-B=1"):
        add(Case(f"bench-env-{v!r}", "bench", [*BENCH, "--env", v], expect=("--env",)))
    add(Case("bench-engine-args-unclosed", "bench", [*BENCH, "--engine-args", "'--x"], expect=("--engine-args",)))
    add(Case("bench-client-python-missing", "bench", [*BENCH, "--client-python", "{tmp}/no-python"], expect=("--client-python", "not found")))
    add(Case("bench-client-python-empty", "bench", [*BENCH, "--client-python", ""], expect=("--client-python",)))
    add(Case("bench-out-dir-under-a-file", "bench", ["bench", CELL, *M, "--out-dir", "{tmp}/afile/o"], files={"afile": "x"},
             expect=("--out-dir", "afile")))
    add(Case("bench-out-dir-is-a-file", "bench", ["bench", CELL, *M, "--out-dir", "{tmp}/afile"], files={"afile": "x"},
             expect=("--out-dir", "is a file")))
    add(Case("bench-launcher-bad", "bench", [*BENCH, "--launcher", "ssh"], expect=("--launcher",)))
    add(Case("bench-gpus-bad", "bench", [*BENCH, "--gpus", "two"], expect=("--gpus",)))
    add(Case("bench-unknown-target", "bench", ["bench", "no-such-cell", *M, "--out-dir", "{tmp}/o"], expect=("neither a cell",)))
    add(Case("bench-process-on-image", "bench", ["bench", "127.0.0.1:5000/x/y:1", *M, "--launcher", "process", "--out-dir", "{tmp}/o"],
             expect=("--launcher process",)))
    add(Case("bench-model-missing", "bench", [*BENCH, "--model", "{tmp}/nomodel"], expect=("--model",)))
    add(Case("bench-model-shape-unknown", "bench", [*BENCH, "--model", "shape:99b"], expect=("--model", "shape:27b")))
    add(Case("bench-workload-unknown", "bench", [*WORKLOAD, "nope"], expect=("--workload nope", "neither a workload")))

    # -- bench: workload files (TOML), through schema.WORKLOAD --------------------------------------------------
    good = {"concurrency": "2", "requests": "4", "output_tokens": "8", "seed": "1",
            "mix": "[{ share = 1.0, input_tokens = [4, 8] }]"}

    def toml(**over) -> str:
        keys = {**good, **over}
        return "".join(f"{k} = {v}\n" for k, v in keys.items() if v is not None)

    bad_toml = {
        "output-tokens-negative": (toml(output_tokens="-3"), "output_tokens"),
        "output-tokens-zero": (toml(output_tokens="0"), "output_tokens"),
        "output-tokens-string": (toml(output_tokens='"8"'), "output_tokens"),
        "output-tokens-float": (toml(output_tokens="8.5"), "output_tokens"),
        "output-tokens-huge": (toml(output_tokens="99999999999"), "output_tokens"),
        "output-tokens-bool": (toml(output_tokens="true"), "output_tokens"),
        "requests-zero": (toml(requests="0"), "requests"),
        "requests-missing": (toml(requests=None), "requests"),
        "concurrency-negative": (toml(concurrency="-1"), "concurrency"),
        "concurrency-float": (toml(concurrency="2.0"), "concurrency"),
        "seed-negative": (toml(seed="-1"), "seed"),
        "seed-huge": (toml(seed="4294967296"), "seed"),
        "shares-negative-sum-one": (toml(mix="[{ share = 1.5, input_tokens = [4, 8] }, { share = -0.5, input_tokens = [4, 8] }]"),
                                    "share"),
        "share-negative": (toml(mix="[{ share = -1.0, input_tokens = [4, 8] }]"), "share"),
        "share-zero": (toml(mix="[{ share = 0.0, input_tokens = [4, 8] }, { share = 1.0, input_tokens = [4, 8] }]"), "share"),
        "share-nan": (toml(mix="[{ share = nan, input_tokens = [4, 8] }]"), "share"),
        "share-inf": (toml(mix="[{ share = inf, input_tokens = [4, 8] }]"), "share"),
        "share-string": (toml(mix='[{ share = "1", input_tokens = [4, 8] }]'), "share"),
        "shares-half": (toml(mix="[{ share = 0.5, input_tokens = [4, 8] }]"), "add up to 1"),
        "shares-over": (toml(mix="[{ share = 0.7, input_tokens = [4, 8] }, { share = 0.7, input_tokens = [4, 8] }]"), "add up to 1"),
        "mix-empty": (toml(mix="[]"), "mix"),
        "mix-missing": (toml(mix=None), "mix"),
        "mix-table": (toml(mix="{ share = 1.0 }"), "mix"),
        "tokens-zero": (toml(mix="[{ share = 1.0, input_tokens = [0, 8] }]"), "input_tokens"),
        "tokens-reversed": (toml(mix="[{ share = 1.0, input_tokens = [8, 4] }]"), "input_tokens"),
        "tokens-one": (toml(mix="[{ share = 1.0, input_tokens = [4] }]"), "input_tokens"),
        "tokens-three": (toml(mix="[{ share = 1.0, input_tokens = [1, 2, 3] }]"), "input_tokens"),
        "tokens-strings": (toml(mix='[{ share = 1.0, input_tokens = ["1", "2"] }]'), "input_tokens"),
        "tokens-string": (toml(mix='[{ share = 1.0, input_tokens = "1-2" }]'), "input_tokens"),
        "tokens-missing": (toml(mix="[{ share = 1.0 }]"), "input_tokens"),
        "bin-unknown-key": (toml(mix="[{ share = 1.0, input_tokens = [4, 8], weight = 2 }]"), "weight"),
        "unknown-key": (toml(outputs="8"), "outputs"),
        "typo": (toml(output_tokens=None, output_token="8"), "output_token"),
        "not-toml": ("concurrency = \n", "malformed TOML"),
    }
    for name, (text, words) in bad_toml.items():
        add(Case(f"bench-workload-toml-{name}", "bench-workload", [*WORKLOAD, "{tmp}/w.toml"], files={"w.toml": text},
                 expect=("w.toml", words)))
    for name, make, words in (("not-utf8", b"concurrency = \"\xff\"\n", "not UTF-8"), ("directory", directory, "directory"),
                              ("fifo", fifo, "not a regular file"), ("too-big", big_toml, "never that large"),
                              ("nested", deep_toml, "nested")):
        add(Case(f"bench-workload-file-{name}", "bench-workload", [*WORKLOAD, "{tmp}/w.toml"], files={"w.toml": make},
                 expect=("w.toml", words)))
    add(Case("bench-workload-unreadable", "bench-workload", [*WORKLOAD, "{tmp}/w.toml"], files={"w.toml": unreadable(toml())},
             as_nobody=True, expect=("w.toml", "cannot read")))
    add(Case("bench-workload-requests-flag-zero", "bench-workload", [*WORKLOAD, "{tmp}/w.toml", "--requests", "0"],
             files={"w.toml": toml()}, expect=("--requests",)))

    # -- bench: JSONL workloads, each line through schema.PROMPT_LINE -------------------------------------------
    bad_jsonl = {
        "output-tokens-negative": ('{"prompt": "a", "output_tokens": -5}\n', "output_tokens"),
        "output-tokens-zero": ('{"prompt": "a", "output_tokens": 0}\n', "output_tokens"),
        "output-tokens-nan": ('{"prompt": "a", "output_tokens": NaN}\n', "output_tokens"),
        "output-tokens-string": ('{"prompt": "a", "output_tokens": "5"}\n', "output_tokens"),
        "output-tokens-float": ('{"prompt": "a", "output_tokens": 5.5}\n', "output_tokens"),
        "output-tokens-null": ('{"prompt": "a", "output_tokens": null}\n', "output_tokens"),
        "prompt-missing": ('{"text": "a"}\n', "prompt"),
        "prompt-int": ('{"prompt": 5}\n', "prompt"),
        "prompt-empty": ('{"prompt": ""}\n', "prompt"),
        "prompt-list": ('{"prompt": ["a"]}\n', "prompt"),
        "line-not-json": ('{"prompt": "a"}\n{"prompt": \n', "line 2"),
        "line-list": ('["a"]\n', "line 1"),
        "line-string": ('"a"\n', "line 1"),
        "nested": ("[" * 40 + "]" * 40 + "\n", "nested"),
        "recursion": ("[" * 100000 + "\n", "line 1"),
        "empty": ("", "no prompt"),
        "blank-lines": ("\n\n  \n", "no prompt"),
        "unknown-key": ('{"prompt": "a", "max_tokens": 5}\n', "max_tokens"),
        "third-line-bad": ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c", "output_tokens": -1}\n', "line 3"),
    }
    for name, (text, words) in bad_jsonl.items():
        add(Case(f"bench-workload-jsonl-{name}", "bench-workload", [*WORKLOAD, "{tmp}/p.jsonl"], files={"p.jsonl": text},
                 expect=("p.jsonl", words)))
    add(Case("bench-workload-jsonl-not-utf8", "bench-workload", [*WORKLOAD, "{tmp}/p.jsonl"],
             files={"p.jsonl": b'{"prompt": "\xff"}\n'}, expect=("p.jsonl", "not UTF-8")))

    # -- bench diff / plot: result files through schema.BENCH_RESULT, results that do not compare ---------------
    good_result = json.dumps(RECORDED)
    bad_results = {
        "not-json": ("{", "not JSON"),
        "empty": ("", "not JSON"),
        "list": ("[]", "expected a table"),
        "string": ('"bench"', "expected a table"),
        "no-rows": (_result(_drop("rows")), "rows"),
        "no-environment": (_result(_drop("environment")), "environment"),
        "rows-object": (_result(_set("rows", {})), "rows"),
        "row-not-object": (_result(_set("rows.0", 5)), "rows[0]"),
        "row-no-strategy": (_result(_drop("rows.0.strategy")), "strategy"),
        "row-no-workload": (_result(_drop("rows.0.workload")), "workload"),
        "row-strategy-int": (_result(_set("rows.0.strategy", 2)), "strategy"),
        "runs-object": (_result(_set("rows.0.runs", {})), "runs"),
        "run-not-object": (_result(_set("rows.0.runs.0", "fast")), "runs[0]"),
        "figure-nan": (_result(_set("rows.0.runs.1.ttft_ms_p99", float("nan"))), "ttft_ms_p99"),
        "figure-inf": (_result(_set("rows.0.runs.1.ttft_ms_p99", float("inf"))), "ttft_ms_p99"),
        "figure-negative": (_result(_set("rows.0.runs.1.ttft_ms_p99", -5)), "ttft_ms_p99"),
        "figure-string": (_result(_set("rows.0.runs.1.request_throughput", "17")), "request_throughput"),
        "figure-bool": (_result(_set("rows.0.runs.1.request_throughput", True)), "request_throughput"),
        "row-figure-list": (_result(_set("rows.0.ttft_ms_p50", [1])), "ttft_ms_p50"),
        "environment-list": (_result(_set("environment", [])), "environment"),
        "engine-int": (_result(_set("environment.engine", 5)), "engine"),
        "slo-zero": (_result(_set("slo.ttft_ms", 0)), "ttft_ms"),
        "slo-string": (_result(_set("slo.ttft_ms", "300")), "ttft_ms"),
        "failures-object": (_result(_set("failures", {})), "failures"),
        "nested": ("[" * 40 + "]" * 40, "nested"),
        "recursion": ("[" * 100000, "bench result"),
    }
    for name, (text, words) in bad_results.items():
        add(Case(f"bench-diff-new-{name}", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/new.json"],
                 files={"old.json": good_result, "new.json": text}, expect=("new.json", words)))
        if name in ("not-json", "list", "no-rows", "row-no-strategy", "figure-nan", "environment-list", "recursion"):
            add(Case(f"bench-diff-old-{name}", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/new.json"],
                     files={"old.json": text, "new.json": good_result}, expect=("old.json", words)))
            add(Case(f"bench-plot-{name}", "bench-plot", ["bench", "plot", "{tmp}/r.json", "-o", "{tmp}/c.png"],
                     files={"r.json": text}, expect=("r.json", words)))
    incomparable = {
        "other-engine": (_result(_set("environment.engine", "vllm")), "another engine"),
        "other-gpu": (_result(_set("environment.gpu", "1 x NVIDIA H200")), "another GPU"),
        "other-workload-requests": (_result(_set("workload.requests", 32)), "another workload"),
        "other-workload-name": (_result(_set("workload.name", "article")), "another workload"),
        "other-workload-mix": (_result(_set("workload.mix", [{"share": 1.0, "input_tokens": [512, 2048]}])), "another workload"),
        "other-client": (_result(_set("client", "guidellm")), "another load generator"),
        "other-slo": (_result(_set("slo.ttft_ms", 200)), "another SLO"),
    }
    for name, (text, words) in incomparable.items():
        add(Case(f"bench-diff-{name}", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/new.json"],
                 files={"old.json": good_result, "new.json": text}, expect=(words,)))
    add(Case("bench-diff-zero-old-median", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/new.json"],
             files={"old.json": _result(_zero_old_ttft), "new.json": good_result}, expect=("old median of ttft_ms_p99 is 0",)))
    for name, v in {**NUMBERS, "over-ten": "11"}.items():
        if name == "zero":
            continue
        add(Case(f"bench-diff-min-change-{name}", "bench-diff",
                 ["bench", "diff", "{tmp}/old.json", "{tmp}/new.json", "--min-change", v],
                 files={"old.json": good_result, "new.json": good_result}, expect=("--min-change",)))
    add(Case("bench-diff-missing", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/none.json"],
             files={"old.json": good_result}, expect=("none.json", "no such")))
    add(Case("bench-diff-directory", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/adir"],
             files={"old.json": good_result, "adir": directory}, expect=("adir", "directory")))
    add(Case("bench-diff-fifo", "bench-diff", ["bench", "diff", "{tmp}/old.json", "{tmp}/f.json"],
             files={"old.json": good_result, "f.json": fifo}, expect=("f.json", "not a regular file")))
    add(Case("bench-diff-same-result", "fine", ["bench", "diff", "{tmp}/old.json", "{tmp}/old.json"], code=0,
             files={"old.json": good_result}, expect=("ttft_ms_p99",)))
    add(Case("bench-plot-svg", "bench-plot", ["bench", "plot", "{tmp}/r.json", "-o", "{tmp}/c.svg"],
             files={"r.json": good_result}, expect=("-o", ".png")))
    add(Case("bench-plot-no-suffix", "bench-plot", ["bench", "plot", "{tmp}/r.json", "-o", "{tmp}/chart"],
             files={"r.json": good_result}, expect=("-o", ".png")))
    add(Case("bench-plot-under-a-file", "bench-plot", ["bench", "plot", "{tmp}/r.json", "-o", "{tmp}/afile/c.png"],
             files={"r.json": good_result, "afile": "x"}, expect=("-o", "afile")))
    add(Case("bench-plot-missing", "bench-plot", ["bench", "plot", "{tmp}/none.json", "-o", "{tmp}/c.png"],
             expect=("none.json", "no such")))

    # -- doctor --host: nvidia-smi's text (the TEST DOUBLE prints it), exit 3 naming the line ----------------------
    smi = {
        "compute-cap-na": "0, NVIDIA H200, 580.159.04, [N/A]\n",
        "driver-na": "0, NVIDIA H200, N/A, 9.0\n",
        "driver-v": "0, NVIDIA H200, v580, 9.0\n",
        "driver-rc": "0, NVIDIA H200, 580.1rc1, 9.0\n",
        "driver-one": "0, NVIDIA H200, 1.0, 9.0\n",
        "index-word": "x, NVIDIA H200, 580.159.04, 9.0\n",
        "index-negative": "-1, NVIDIA H200, 580.159.04, 9.0\n",
        "index-twice": "0, NVIDIA H200, 580.159.04, 9.0\n0, NVIDIA H200, 580.159.04, 9.0\n",
        "garbage": "garbage\n",
        "too-few-fields": "0, NVIDIA H200, 580.159.04\n",
        "too-many-fields": "0, NVIDIA H200, 580.159.04, 9.0, 143771 MiB\n",
        "name-empty": "0,,580.159.04,9.0\n",
        "compute-cap-zero": "0, NVIDIA H200, 580.159.04, 0.0\n",
        "compute-cap-huge": "0, NVIDIA H200, 580.159.04, 99.9\n",
        "compute-cap-integer": "0, NVIDIA H200, 580.159.04, 9\n",
        "compute-cap-negative": "0, NVIDIA H200, 580.159.04, -9.0\n",
        "header-line": "index, name, driver_version, compute_cap\n0, NVIDIA H200, 580.159.04, 9.0\n",
        "second-line-bad": "0, NVIDIA H200, 580.159.04, 9.0\n1, NVIDIA H200, 580.159.04, [N/A]\n",
    }
    for name, text in smi.items():
        add(Case(f"host-nvidia-smi-{name}", "doctor-host", ["doctor", "--host", IMAGE], code=3, env=DOUBLE_PATH, needs_programs=True,
                 files={"nvidia-smi.csv": text}, expect=("nvidia-smi",)))
    add(Case("host-nvidia-smi-not-utf8", "doctor-host", ["doctor", "--host", IMAGE], code=3, env=DOUBLE_PATH, needs_programs=True,
             files={"nvidia-smi.csv": b"\xff\xfe, NVIDIA H200, 580.159.04, 9.0\n"}, expect=("nvidia-smi",)))
    add(Case("host-nvidia-smi-fails", "doctor-host", ["doctor", "--host", IMAGE], code=3, env=DOUBLE_PATH, needs_programs=True,
             files={"nvidia-smi.csv": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n",
                    "nvidia-smi.rc": "9\n"}, expect=("nvidia-smi fails (exit 9)",)))
    add(Case("host-nvidia-smi-no-gpu", "doctor-host", ["doctor", "--host", IMAGE], code=3, env=DOUBLE_PATH, needs_programs=True,
             files={"nvidia-smi.csv": ""}, expect=("lists no GPU",)))
    add(Case("host-nvidia-smi-h200", "fine", ["doctor", "--host", IMAGE], code=0, env=DOUBLE_PATH, needs_programs=True,
             files={"nvidia-smi.csv": "0, NVIDIA H200, 580.159.04, 9.0\n", "nvidia-smi-q.txt": "    Product Brand : NVIDIA\n"},
             expect=("RUNS",)))

    # -- doctor --host: --gpus-file, through schema.GPU_RECORD (its own --json accepted) --------------------------
    own = {"gpus": [{**GPU, "compute_cap": 90}], "no_gpu": None, "verdicts": []}
    add(Case("host-gpus-file-own-json", "fine", ["doctor", "--host", IMAGE, "--gpus-file", "{tmp}/own.json"], code=0,
             files={"own.json": json.dumps(own)}, expect=("RUNS",)))
    bad_gpus = {
        "empty-list": ("[]", "non-empty"),
        "object": ('{"name": "x"}', "gpus"),
        "own-json-no-gpus": ('{"gpus": [], "verdicts": []}', "gpus"),
        "string": ('"H200"', "GPU records"),
        "not-json": ("[", "not JSON"),
        "record-int": ("[5]", "[0]"),
        "no-driver": (json.dumps([{k: v for k, v in GPU.items() if k != "driver"}]), "driver"),
        "no-compute-cap": (json.dumps([{k: v for k, v in GPU.items() if k != "compute_cap"}]), "compute_cap"),
        "driver-na": (json.dumps([{**GPU, "driver": "N/A"}]), "driver"),
        "driver-int": (json.dumps([{**GPU, "driver": 580}]), "driver"),
        "compute-cap-na": (json.dumps([{**GPU, "compute_cap": "[N/A]"}]), "compute_cap"),
        "compute-cap-zero": (json.dumps([{**GPU, "compute_cap": 0}]), "compute_cap"),
        "compute-cap-bool": (json.dumps([{**GPU, "compute_cap": True}]), "compute_cap"),
        "compute-cap-list": (json.dumps([{**GPU, "compute_cap": [9, 0]}]), "compute_cap"),
        "name-null": (json.dumps([{**GPU, "name": None}]), "name"),
        "name-newline": (json.dumps([{**GPU, "name": "H200\nx"}]), "name"),
        "index-string": (json.dumps([{**GPU, "index": "0"}]), "index"),
        "index-twice": (json.dumps([GPU, GPU]), "index"),
        "unknown-key": (json.dumps([{**GPU, "memory": 141}]), "memory"),
        "nested": ("[" * 40 + "]" * 40, "nested"),
        "recursion": ("[" * 100000, "GPU list"),
    }
    for name, (text, words) in bad_gpus.items():
        add(Case(f"host-gpus-file-{name}", "doctor-host", ["doctor", "--host", IMAGE, "--gpus-file", "{tmp}/g.json"],
                 files={"g.json": text}, expect=("g.json", words)))
    add(Case("host-gpus-file-directory", "doctor-host", ["doctor", "--host", IMAGE, "--gpus-file", "{tmp}/adir"],
             files={"adir": directory}, expect=("adir", "directory")))
    add(Case("host-gpus-file-missing", "doctor-host", ["doctor", "--host", IMAGE, "--gpus-file", "{tmp}/none.json"],
             expect=("none.json", "no such")))

    # -- doctor --host: image JSON, through schema.IMAGE_CONFIG and the label shapes -----------------------------
    def pkg(**labels) -> str:
        return json.dumps({"Labels": {"io.builder.cuda": "13.0", "io.builder.package.x.version": "1", **labels}})

    bad_images = {
        "empty-list": ("[]", "0 images"),
        "two-images": (json.dumps([{"Config": {}}, {"Config": {}}]), "2 images"),
        "number": ("5", "JSON object"),
        "config-list": ('{"Config": []}', "expected a table"),
        "env-string": ('{"Config": {"Env": "A=1"}}', "Env"),
        "env-int-item": ('{"Config": {"Env": [1]}}', "Env[0]"),
        "labels-list": ('{"Config": {"Labels": []}}', "Labels"),
        "label-int": ('{"Config": {"Labels": {"io.builder.cuda": 13}}}', "Labels"),
        "archs-label-word": ('{"Labels": {"io.builder.archs": "abc"}}', "io.builder.archs"),
        "binaries-not-json": (pkg(**{"io.builder.package.x.binaries": "{bad"}), "binaries"),
        "binaries-list": (pkg(**{"io.builder.package.x.binaries": "[1]"}), "binaries"),
        "binaries-int": (pkg(**{"io.builder.package.x.binaries": '{"a.so": 1}'}), "binaries"),
        "binaries-sass-int": (pkg(**{"io.builder.package.x.binaries": '{"a.so": {"sass": 5}}'}), "sass"),
        "binaries-sass-word": (pkg(**{"io.builder.package.x.binaries": '{"a.so": {"sass": ["fast"]}}'}), "device code"),
        "sass-label-word": (pkg(**{"io.builder.package.x.sass": "sm_x,zz"}), "device code"),
        "ptx-label-word": (pkg(**{"io.builder.package.x.ptx": "ptx90"}), "device code"),
        "not-json": ("{", "not JSON"),
        "nested": ("[" * 40 + "]" * 40, "nested"),
        "recursion": ("[" * 100000, "image config"),
    }
    for name, (text, words) in bad_images.items():
        add(Case(f"host-image-{name}", "doctor-host", ["doctor", "--host", "{tmp}/i.json", "--gpus-file", "{tmp}/gpus.json"],
                 files={**GPUS_FILE, "i.json": text}, expect=("i.json", words)))
    add(Case("host-image-directory", "doctor-host", ["doctor", "--host", "{tmp}/i.json", "--gpus-file", "{tmp}/gpus.json"],
             files={**GPUS_FILE, "i.json": directory}, expect=("i.json", "directory")))
    add(Case("host-image-not-a-reference", "doctor-host", ["doctor", "--host", "no such image", "--gpus-file", "{tmp}/gpus.json"],
             files=GPUS_FILE, expect=("IMAGE", "not an image reference")))
    add(Case("host-image-require-cuda-word", "fine", ["doctor", "--host", "{tmp}/i.json", "--gpus-file", "{tmp}/gpus.json"],
             code=0, files={**GPUS_FILE, "i.json": json.dumps({"Env": ["CUDA_VERSION=13.0.2", "NVIDIA_REQUIRE_CUDA=cuda>=abc"]})},
             expect=("no clause holds",)))

    # -- recorded pins files (runtime and build pins), refused before anything is built --------------------------
    header = "# Written by `builder build` from the first build of x; hash-locked requirements for the next ones.\n"
    locked = f"anyio==4.16.0 --hash=sha256:{H}\nidna==3.20 --hash=sha256:{H}\n"
    bad_pins = {
        "cut-mid-line": (header + locked[:-10], "ends in the middle of a line"),
        "cut-mid-hash": (header + locked[:-10] + "\n", "not a sha256"),
        "cut-after-pin": (header + locked + "sniffio==1.3.1\n", "carries no --hash"),
        "header-only": (header, "holds no pin"),
        "announced-no-hashes": (header + "anyio==4.16.0\n", "announces hash-locked"),
        "empty": ("", "holds no pin"),
        "index-url": (header + locked + "--index-url http://evil.example/simple\n", "pip option"),
        "extra-index-url": ("--extra-index-url http://evil.example/simple\nanyio==4.16.0\n", "pip option"),
        "requirement-file": ("anyio==4.16.0\n-r /etc/passwd\n", "pip option"),
        "editable": ("anyio==4.16.0\n-e git+https://evil.example/x.git#egg=x\n", "pip option"),
        "find-links": ("anyio==4.16.0\n-f /tmp/evil\n", "pip option"),
        "trusted-host": ("anyio==4.16.0\n--trusted-host evil.example\n", "pip option"),
        "inline-option": (f"anyio==4.16.0 --hash=sha256:{H} --config-settings=a=b\n", "pip option"),
        "url-pin": ("anyio==4.16.0\nevil @ https://evil.example/evil-1.0.whl\n", "is not a pin"),
        "marker": ('anyio==4.16.0; python_version < "4"\n', "is not a pin"),
        "range": ("anyio>=4\n", "is not a pin"),
        "mixed": (f"anyio==4.16.0 --hash=sha256:{H}\nidna==3.20\n", "carries no --hash"),
        "bad-version": ("anyio==4.x\n", "not a version"),
    }
    for name, (text, words) in bad_pins.items():
        add(Case(f"pins-runtime-{name}", "pins", PINS_BUILD, files={"p": directory, RUNTIME_PINS: text},
                 expect=(f"{CELL}.txt", words)))
    for name in ("cut-mid-line", "cut-after-pin", "index-url", "editable", "inline-option", "url-pin"):
        text, words = bad_pins[name]
        add(Case(f"pins-build-{name}", "pins", PINS_BUILD, files={"p": directory, BUILD_PINS: text},
                 expect=(f"{CELL}.build-cuda-ext.txt", words)))
    add(Case("pins-build-unhashed", "pins", PINS_BUILD, files={"p": directory, BUILD_PINS: "cmake==3.31.6\n"},
             expect=("build pins are hash-locked",)))
    add(Case("pins-runtime-fifo", "pins", PINS_BUILD, files={"p": directory, RUNTIME_PINS: fifo},
             expect=(f"{CELL}.txt", "not a regular file")))
    add(Case("pins-runtime-not-utf8", "pins", PINS_BUILD, files={"p": directory, RUNTIME_PINS: b"anyio==4.16.0\xff\n"},
             expect=(f"{CELL}.txt", "not UTF-8")))
    return out


CASES: list[Case] = _cases()
