"""Bad input: every case names the offending key or value and exits with code 2, before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from builder.engines import load_knowledge
from builder.errors import UserError

from tests.helpers import MATRIX, REPO, run_cli, write_matrix

GOOD = MATRIX.read_text()


def edit(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


# (case id, matrix text or None for the shipped one, CLI args, substrings the message must contain)
CASES = [
    ("malformed-toml", "[defaults\narchs = [80]", ["plan"], ["malformed TOML"]),
    ("unknown-top-key", GOOD + "\n[cellz]\nx = 1\n", ["plan"], ["unknown key 'cellz'"]),
    ("unknown-defaults-key", edit("[defaults]\n", "[defaults]\nregistyr = \"x\"\n"), ["plan"],
     ["defaults: unknown key 'registyr'", "did you mean 'registry'"]),
    ("unknown-profile-key", edit('flash_attn = "2.8.3.post2"', 'flash_atn = "2.8.3.post2"'), ["plan"],
     ["profiles.cu130: unknown key 'flash_atn'", "did you mean 'flash_attn'"]),
    ("unknown-engine", edit('engines = { vllm = "0.33.0", sglang = "0.5.23" }', 'engines = { vllm = "0.33.0", sgalng = "0.5.23" }'),
     ["plan"], ["unknown engine 'sgalng'", "did you mean 'sglang'"]),
    ("unknown-engine-version", edit('vllm = "0.6.3.post1"', 'vllm = "0.4.0"'), ["plan"],
     ["vllm 0.4.0: no engine knowledge for this version"]),
    ("version-not-a-version", edit('vllm = "0.6.3.post1"', 'vllm = "latest"'), ["plan"], ["'latest' is not a version"]),
    # torch 2.4.0 on PyPI is the cu121 build (matrix.lock records the requirement of its metadata that says so)
    ("torch-cuda-major-differs", edit('cuda = "12.1.1"', 'cuda = "13.0.3"'), ["plan", "--profile", "cu121"],
     ["profiles.cu121.cuda: torch 2.4.0 (pinned by vllm 0.6.3.post1) is a CUDA 12 build",
      "requires nvidia-cuda-runtime-cu12==12.1.105", "the profile's CUDA is 13.0.3"]),
    ("torch-contradicts-engine", edit('torch = "2.4.0"', 'torch = "2.3.0"'), ["plan", "--profile", "cu121"],
     ["profiles.cu121.torch", "vllm 0.6.3.post1 pins torch==2.4.0", "not 2.3.0"]),
    ("torch-contradicts-per-engine", edit('torch = { vllm = "2.14.0", sglang = "2.14.1" }', 'torch = { vllm = "2.14.1", sglang = "2.14.1" }'),
     ["plan"], ["vllm 0.33.0 pins torch==2.14.0", "not 2.14.1"]),
    ("arch-100-on-cuda-12.1", None, ["plan", "--profile", "cu121", "--arch", "80,100"],
     ["--arch: arch 100 cannot be targeted by CUDA 12.1.1"]),
    ("arch-below-75-on-cuda-13", None, ["plan", "--arch", "70,80"], ["--arch: arch 70 cannot be targeted by CUDA 13.0.3"]),
    ("arch-in-matrix-below-75", edit("archs = [80, 90]", "archs = [61, 80]"), ["plan"],
     ["defaults.archs: arch 61 cannot be targeted by CUDA 13.0.3"]),
    ("strategy-engine-cannot-run", edit("strategies = []", 'strategies = ["MTP2"]'), ["plan", "--profile", "cu121"],
     ["MTP2 cannot run on vllm 0.6.3.post1", "versions that can: vllm>=0.17"]),
    ("unknown-strategy", edit('strategies = ["MTP2", "MTP7", "DFlash2"]', 'strategies = ["MTP2", "DFLASH2"]'), ["plan"],
     ["unknown strategy 'DFLASH2'", "did you mean 'DFlash2'"]),
    # profiles.<name>.criu: the runtime images carry CRIU (builder snapshot's container route), a boolean
    ("criu-not-a-boolean", edit('strategies = ["MTP2", "MTP7", "DFlash2"]', 'strategies = ["MTP2", "MTP7", "DFlash2"]\ncriu = "yes"'),
     ["plan"], ["profiles.cu130.criu: expected a boolean, got a string 'yes'"]),
    ("duplicate-strategy", edit('strategies = ["MTP2", "MTP7", "DFlash2"]', 'strategies = ["MTP2", "MTP2"]'), ["plan"],
     ["listed twice"]),
    ("empty-selection-only", None, ["plan", "--only", "trtllm-*"], ["the selection is empty", "only trtllm-*"]),
    ("empty-selection-cuda", None, ["plan", "--cuda", "11.8"], ["the selection is empty"]),
    ("unknown-profile-flag", None, ["plan", "--profile", "cu124"], ["--profile: unknown profile 'cu124'"]),
    ("unknown-engine-flag", None, ["plan", "--engine", "trtllm"], ["--engine: unknown engine 'trtllm'"]),
    ("bad-arch-syntax", None, ["plan", "--arch", "ampere"], ["--arch: 'ampere' is not an SM arch"]),
    ("empty-arch", None, ["plan", "--arch", ","], ["--arch: no arch given"]),
    ("flash-attn-below-sm80", None, ["plan", "--profile", "cu121", "--arch", "75"], ["flash-attn 2.6.3 supports sm_80 and newer"]),
    ("sglang-kernel-has-no-code-for-121", None, ["plan", "--engine", "sglang", "--arch", "90,121"],
     ["sglang-kernel 0.4.10 on CUDA 13.0: sgl_kernel/sm100/common_ops (loaded on every GPU but sm_90)",
      "none of which runs on sm_121"]),
    ("flash-attn-has-no-code-for-110", None, ["plan", "--engine", "vllm", "--arch", "90,110"],
     ["FLASH_ATTN_CUDA_ARCHS only recognises 80, 90, 100, 120, and no SASS of those runs on 11.0"]),
    ("python-below-engine-requirement", edit('python = "3.12"', 'python = "3.10"'), ["plan", "--engine", "sglang"],
     ["profiles.cu130.python: sglang 0.5.23 requires Python >=3.11, not 3.10"]),
    ("cuda-below-engine-minimum", edit('engines = { vllm = "0.6.3.post1", sglang = "0.3.2" }', 'engines = { vllm = "0.33.0" }'),
     ["plan", "--profile", "cu121"], ["vllm 0.33.0 needs CUDA >= 12.8, the profile has 12.1.1"]),
    ("unknown-cuda", edit('cuda = "12.1.1"', 'cuda = "11.8.0"'), ["plan"], ["CUDA 11.8.0 is unknown to this toolkit"]),
    ("archs-wrong-type", edit("archs = [80, 90]", 'archs = "80,90"'), ["plan"], ["defaults.archs: expected a list of SM arch numbers like 80 or 90, got a string '80,90'"]),
    ("missing-profile-key", edit('os = "ubuntu24.04"\n', ""), ["plan"], ["profiles.cu130: missing key 'os'"]),
    ("bad-default-profile", edit('profile = "cu130"', 'profile = "cu13"'), ["plan"], ["defaults.profile: 'cu13' is not a profile"]),
    ("torch-for-foreign-engine", edit('torch = { vllm = "2.14.0", sglang = "2.14.1" }', 'torch = { vllm = "2.14.0", trt = "1" }'),
     ["plan"], ["profiles.cu130.torch: 'trt' is not an engine of this profile"]),
    ("registry-with-spaces", edit('registry = "127.0.0.1:5000/builder"', 'registry = "my registry"'), ["plan"],
     ["defaults.registry: 'my registry' is not a registry"]),
    ("missing-matrix-file", "MISSING", ["plan"], ["no such matrix file"]),
]


@pytest.mark.pure
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_exit_2(case, tmp_path):
    _, text, args, expected = case
    if text is None:
        path = MATRIX
    elif text == "MISSING":
        path = tmp_path / "nope.toml"
    else:
        path = write_matrix(tmp_path, text)
    res = run_cli(*args, "--matrix", str(path))
    assert res.exit_code == 2, res.output
    for fragment in expected:
        assert fragment in res.output, f"{fragment!r} not in {res.output!r}"
    assert "Traceback" not in res.output


@pytest.mark.pure
def test_lock_without_entry_says_run_lock(tmp_path):
    path = write_matrix(tmp_path, GOOD)
    (tmp_path / "matrix.lock").write_text('format = 1\n[packages."flash-attn==2.8.3.post2".sdist]\nfilename = "flash_attn-2.8.3.post2.tar.gz"\n'
                                          'url = "https://files.example/flash_attn-2.8.3.post2.tar.gz"\nsha256 = "' + "0" * 64 + '"\n')
    res = run_cli("plan", "--matrix", str(path))
    assert res.exit_code == 2
    assert "no entry for vllm==0.33.0; run `builder lock`" in res.output


def test_the_installed_console_script_exits_2_too(tmp_path):
    """Through the real entry point, not only click's test runner."""
    exe = [sys.executable, "-m", "builder.cli"]
    res = subprocess.run([*exe, "plan", "--matrix", str(MATRIX), "--arch", "70"], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2
    assert "error: --arch: arch 70 cannot be targeted by CUDA 13.0.3" in res.stderr
    assert "Traceback" not in res.stderr


def test_debug_flag_keeps_the_traceback():
    res = subprocess.run([sys.executable, "-m", "builder.cli", "--debug", "plan", "--matrix", str(MATRIX), "--arch", "70"],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2 and "Traceback" in res.stderr and "UserError" in res.stderr


@pytest.mark.parametrize("args, fragment", [
    (["audit", "/nonexistent/x.whl", "--arch", "80"], "no such file, directory or local image"),
    (["audit", ".", "--arch", "8x"], "--arch: '8x' is not an SM arch"),
    (["build", "--matrix", str(MATRIX), "--ca-bundle", "/nonexistent.pem", "--dry-run", "--engine", "vllm"],
     "--ca-bundle: /nonexistent.pem is not a file"),
])
def test_other_verbs_refuse_bad_input_with_exit_2(args, fragment):
    res = run_cli(*args)
    assert res.exit_code == 2, res.output
    assert fragment in res.output


# A valid extra package; each case below breaks one thing in it (or adds one bad thing to it).
PACKAGE_X = '''
[packages.x]
pypi = "x"
kind = "engine"
template = "pip-wheel"
torch_pin = "none"
mem_gb_per_nvcc_thread = 1.0
[[packages.x.rules]]
versions = ">=1"
source = "local"
launch = ["x"]
'''


def package_x(old: str, new: str) -> str:
    assert old in PACKAGE_X, old
    return PACKAGE_X.replace(old, new, 1)


KNOBS = "torch, cmake-real, semicolon, switch-below"

# (case id, text of more.toml or None for a missing file, fragments: the file, the key path, what was expected)
BAD_KNOWLEDGE = [
    ("version-range-not-a-range", package_x('versions = ">=1"', 'versions = "latest"'),
     ["more.toml: packages.x.rules[0].versions: 'latest' is not a version range like \">=0.6,<0.7\""]),
    ("unknown-rule-key", PACKAGE_X + "arch_knob = []\n",
     ["more.toml: packages.x.rules[0]: unknown key 'arch_knob' (did you mean 'arch_knobs'?)"]),
    ("unknown-top-key", "[packagez.x]\n",
     ["more.toml: unknown key 'packagez' (did you mean 'packages'?); allowed: base_os, build_tools, compile_caches, cuda, index_wheels, jit_cache_root, jit_frameworks, jit_modules, packages, serve_jit"]),
    ("missing-file", None, ["more.toml: no such engine knowledge file"]),
    ("launch-a-string", package_x('launch = ["x"]', 'launch = "vllm serve {model}"'),
     ["more.toml: packages.x.rules[0].launch: expected a list of strings, got a string 'vllm serve {model}'"]),
    ("knob-format-unknown", PACKAGE_X + 'arch_knobs = [{ env = "X_ARCHS", format = "semicolons" }]\n',
     [f"more.toml: packages.x.rules[0].arch_knobs[0].format: 'semicolons' is not one of {KNOBS} (did you mean 'semicolon'?)"]),
    ("knob-without-format", PACKAGE_X + 'arch_knobs = [{ env = "X_ARCHS" }]\n',
     [f"more.toml: packages.x.rules[0].arch_knobs[0]: missing key 'format': expected one of {KNOBS}"]),
    ("knob-env-and-cmake", PACKAGE_X + 'arch_knobs = [{ env = "X_ARCHS", cmake = "X_ARCHS", format = "semicolon" }]\n',
     ["more.toml: packages.x.rules[0].arch_knobs[0]: expected exactly one of env, cmake, got env and cmake"]),
    ("switch-below-without-threshold", PACKAGE_X + 'arch_knobs = [{ cmake = "X_OLD", format = "switch-below" }]\n',
     ["more.toml: packages.x.rules[0].arch_knobs[0]: missing key 'threshold': expected an integer when format is 'switch-below'"]),
    ("kind-misspelt", package_x('kind = "engine"', 'kind = "engin"'),
     ["more.toml: packages.x.kind: 'engin' is not one of engine, kernels (did you mean 'engine'?)"]),
    ("source-not-in-enumeration", package_x('source = "local"', 'source = "pypi"'),
     ["more.toml: packages.x.rules[0].source: 'pypi' is not one of sdist, git, local"]),
    ("parallelism-misspelt", package_x("[[", 'parallelism = "total_threads"\n[['),
     ["more.toml: packages.x.parallelism: 'total_threads' is not one of total-threads, jobs-x-threads "
      "(did you mean 'total-threads'?)"]),
    ("mem-per-thread-a-string", package_x("mem_gb_per_nvcc_thread = 1.0", 'mem_gb_per_nvcc_thread = "x"'),
     ["more.toml: packages.x.mem_gb_per_nvcc_thread: expected a number, got a string 'x'"]),
    ("compiled-not-a-boolean", package_x("[[", 'compiled = "no"\n[['),
     ["more.toml: packages.x.compiled: expected a boolean, got a string 'no'"]),
    ("torch-pin-via-unknown-package", package_x('torch_pin = "none"', 'torch_pin = "via:nosuch"'),
     ["more.toml: packages.x.torch_pin: 'via:nosuch' names no known package; known: vllm, sglang"]),
    ("torch-pin-misspelt", package_x('torch_pin = "none"', 'torch_pin = "metdata"'),
     ["more.toml: packages.x.torch_pin: 'metdata' is not one of metadata, consumer, none, via:<package> "
      "(did you mean 'metadata'?)"]),
    ("companion-unknown", PACKAGE_X + 'companions = ["vlm"]\n',
     ["more.toml: packages.x.rules[0].companions[0]: 'vlm' names no known package (did you mean 'vllm'?); known: vllm"]),
    ("strategy-without-flags", PACKAGE_X + '[packages.x.strategies.MTP2]\nversions = ">=1"\nwhy_not = "-"\n',
     ["more.toml: packages.x.strategies.MTP2: missing key 'flags': expected a list of strings"]),
    ("cuda-archs-with-a-string", PACKAGE_X + '[cuda."13.1"]\narchs = [80, "90"]\n',
     ["more.toml: cuda.\"13.1\".archs[1]: expected an integer, got a string '90'"]),
    ("rule-without-versions", package_x('versions = ">=1"\n', ""),
     ["more.toml: packages.x.rules[0]: missing key 'versions': expected a version range like \">=0.6,<0.7\""]),
    ("patch-without-with", PACKAGE_X + 'patches = [{ file = "setup.py", replace = "-std=c++17" }]\n',
     ["more.toml: packages.x.rules[0].patches[0]: missing key 'with': expected a string"]),
    ("patch-when-torch-not-a-range", PACKAGE_X + 'patches = [{ when_torch = "2.13+", file = "a", replace = "b", with = "c" }]\n',
     ["more.toml: packages.x.rules[0].patches[0].when_torch: '2.13+' is not a version range"]),
    ("build-env-value-not-a-string", PACKAGE_X + "build_env = { X_FORCE = true }\n",
     ["more.toml: packages.x.rules[0].build_env.X_FORCE: expected a string on one line without \" or \\, got a boolean True"]),
    ("min-cuda-not-a-version", PACKAGE_X + 'min_cuda = "twelve"\n',
     ["more.toml: packages.x.rules[0].min_cuda: 'twelve' is not a version like \"12.8\""]),
    # what serve's probes and shutdown read (builder/deploy/serve): an HTTP path, seconds, a long flag
    ("ready-path-not-a-path", PACKAGE_X + 'ready_path = "health"\n',
     ["more.toml: packages.x.rules[0].ready_path: 'health' is not an HTTP path"]),
    ("health-wait-zero", PACKAGE_X + "health_wait_s = 0\n",
     ["more.toml: packages.x.rules[0].health_wait_s: 0 is not a number of seconds from 1 to 600"]),
    ("health-wait-a-string", PACKAGE_X + 'health_wait_s = "20"\n',
     ["more.toml: packages.x.rules[0].health_wait_s: expected a number of seconds from 1 to 600, got a string"]),
    ("shutdown-flag-short", PACKAGE_X + 'shutdown_flag = "-t"\n',
     ["more.toml: packages.x.rules[0].shutdown_flag: '-t' is not a long flag"]),
    # what snapshot take and restore send to sleep and wake the engine (SGLang's memory saver reads a JSON body)
    ("sleep-body-not-json", PACKAGE_X + "[packages.x.rules.smoke]\nsleep = { flag = \"--s\", path = \"/s\", "
                                        "wake = \"/w\", body = \"tags: kv_cache\" }\n",
     ["more.toml: packages.x.rules[0].smoke.sleep.body: 'tags: kv_cache' is not JSON"]),
    ("sleep-body-a-list", PACKAGE_X + "[packages.x.rules.smoke]\nsleep = { flag = \"--s\", path = \"/s\", "
                                      "wake = \"/w\", body = '[\"kv_cache\"]' }\n",
     ["more.toml: packages.x.rules[0].smoke.sleep.body: '[\"kv_cache\"]' is JSON but not an object"]),
]


def _matrix_with_knowledge(tmp_path, knowledge: str | None):
    if knowledge is not None:
        (tmp_path / "more.toml").write_text(knowledge)
    return write_matrix(tmp_path, GOOD.replace("[defaults]\n", '[defaults]\nknowledge = ["more.toml"]\n', 1))


@pytest.mark.pure
@pytest.mark.parametrize("case", BAD_KNOWLEDGE, ids=[c[0] for c in BAD_KNOWLEDGE])
def test_a_bad_extra_knowledge_file_is_refused(case, tmp_path):
    _, knowledge, expected = case
    res = run_cli("plan", "--matrix", str(_matrix_with_knowledge(tmp_path, knowledge)))
    assert res.exit_code == 2, res.output
    for fragment in expected:
        assert fragment in res.output, f"{fragment!r} not in {res.output!r}"
    assert "Traceback" not in res.output


def test_the_shipped_knowledge_and_a_good_extra_file_are_accepted(tmp_path):
    """The package the bad cases break is itself valid, and so is builder/data/engines.toml."""
    res = run_cli("plan", "--matrix", str(_matrix_with_knowledge(tmp_path, PACKAGE_X)))
    assert res.exit_code == 0, res.output


@pytest.mark.pure
def test_a_version_whose_rules_set_no_source_is_refused(tmp_path):
    (tmp_path / "more.toml").write_text(package_x('source = "local"\n', "") + '[[packages.x.rules]]\nversions = ">=2"\nsource = "local"\n')
    kn = load_knowledge((str(tmp_path / "more.toml"),))
    assert kn.recipe("x", "2.0").source == "local"
    with pytest.raises(UserError, match=r"more\.toml: packages\.x\.rules: no rule for version 1\.0 sets 'source' "
                                        r"\(expected one of sdist, git, local\)"):
        kn.recipe("x", "1.0")


def test_a_strategy_added_to_the_engine_data_needs_no_code_change(tmp_path):
    """Strategy names come from the engine data: a new one in an extra knowledge file is a strategy the matrix,
    smoke and serve accept, and the message for an unknown one lists it."""
    import shutil

    from builder import matrix as matrix_mod
    from builder.deploy.strategies import for_smoke as parse_strategies, one as parse_strategy

    fixture = REPO / "tests" / "fixtures" / "cuda-ext"
    for name in ("engines.toml", "matrix.toml", "matrix.lock"):
        if (fixture / name).exists():
            shutil.copy(fixture / name, tmp_path / name)
    with open(tmp_path / "engines.toml", "a") as f:
        f.write('\n[packages.cuda-ext.strategies.EAGLE4]\nversions = ">=1.0"\nwhy_not = "-"\n'
                'flags = ["--speculative-config", \'{"method":"eagle","num_speculative_tokens":4}\']\n')
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(matrix.read_text().replace("[profiles.local]\n", '[profiles.local]\nstrategies = ["EAGLE4"]\n', 1))
    m = matrix_mod.load(matrix)
    assert m.profiles["local"].strategies == ("EAGLE4",)
    known = m.knowledge.strategy_names()
    assert "EAGLE4" in known and "MTP2" in known
    assert parse_strategy("eagle4", known) == "EAGLE4" and parse_strategies("all", (), known) == known
    matrix.write_text(matrix.read_text().replace('strategies = ["EAGLE4"]', 'strategies = ["EAGLE5"]'))
    with pytest.raises(UserError, match=r"unknown strategy 'EAGLE5' \(did you mean 'EAGLE4'\?\); known: .*EAGLE4"):
        matrix_mod.load(matrix)
