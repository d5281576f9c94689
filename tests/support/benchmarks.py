"""What the two halves of test_benchmarks.py share: tests/unit/project/test_benchmarks.py (its tests that need no
Docker) and tests/docker/project/test_benchmarks.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

import pytest

from tests.helpers import REPO

BENCHMARKS = REPO / "benchmarks"
NUMBER = r"[0-9]+(?:\.[0-9]+)?"

# script -> (arguments, the figure line it must print, marks)
QUICK = {
    "plan_speed.py": (["--quick"], rf"builder plan --profile all \(\d+ cells\): median {NUMBER} ms, max {NUMBER} ms over 1 runs",
                      []),
    # slow: every 20th case as a process; the default tier runs every case in tests/hardening/test_hardening.py
    "hardening.py": (["--quick"], r"inputs tried +\d+\n  clear +\d+ .*\n  misleading +0\n  tracebacks +0\n  silently accepted +0",
                     [pytest.mark.slow]),
    "redact.py": (["--quick"], rf"redact \d+ MB: slowest shape {NUMBER} s CPU \(goal < 1 s\); the old expressions on \d+ KB: "
                               rf"slowest (> )?{NUMBER} s", []),
    "compile_units.py": (["--quick"], r"flash-attn 2\.8\.3\.post2 \(\d+ CUDA sources\) for sm_80, sm_90: \d+ kernel×arch units built "
                                      rf"of \d+ for setup\.py's default arch list \({NUMBER} %\)", [pytest.mark.network]),
    "build_overhead.py": (["--quick"], rf"median builder build {NUMBER} s, raw docker buildx build {NUMBER} s, overhead "
                                       rf"ratio {NUMBER}x over 1 round", [pytest.mark.slow, pytest.mark.docker]),
    "image_size.py": ([], rf"pull size runtime {NUMBER} MB vs devel {NUMBER} MB = {NUMBER}%", [pytest.mark.slow, pytest.mark.docker]),
    "cache_warm_cold.py": (["--quick"], rf"warm remote  build +{NUMBER} s   wheel step .*% of the cold compile(.|\n)*"
                                        rf"64 MB-class artifact", [pytest.mark.slow, pytest.mark.docker]),
    # its exit status also says whether its speed goals were met: a figure, not what this test checks
    "compile_cache.py": (["--quick"], rf"key change: {NUMBER} % hits \(goal >= 95 %\)(.|\n)*(goals met|GOALS NOT MET)",
                         [pytest.mark.slow, pytest.mark.docker]),
    "jit_modules.py": (["--quick"], rf"jit = prebuilt: \+{NUMBER} MiB image, build {NUMBER} s after the first-request "
                                   rf"cell's {NUMBER} s", [pytest.mark.slow, pytest.mark.docker]),
    "registry_reuse.py": (["--quick"], rf"registry reuse: median {NUMBER} s wall \(image step {NUMBER} s, pull included\), "
                                       rf"fresh build {NUMBER} s wall \(image step {NUMBER} s\), over 1 round",
                          [pytest.mark.slow, pytest.mark.docker]),
    "layer_compression.py": (["--quick"], rf"zstd-3 vs gzip-6: size {NUMBER} %, export {NUMBER}x faster, unpack {NUMBER}x "
                                          rf"faster", [pytest.mark.docker]),
    "image_bytes.py": (["--quick"], rf"image bytes: {NUMBER} GB in files \(goal <= 9\.9\), {NUMBER} GB compressed \(goal <= "
                                    rf"4\.3\); shipped twice {NUMBER} GB; device code no sm_80/90 GPU loads {NUMBER} GB",
                       [pytest.mark.docker]),
    "pull.py": (["--quick"], rf"pull zstd vs gzip: median {NUMBER} s vs {NUMBER} s \(n = 1\), {NUMBER}x faster; compressed "
                             rf"{NUMBER} GB vs {NUMBER} GB, unpacked {NUMBER} GB", [pytest.mark.docker]),
    # root, FUSE and a containerd of its own (and a Go build of the snapshotter the first time): minutes
    "lazy_pull.py": (["--quick"], rf"lazy \(eStargz\) vs full \(zstd\): to the engine imported median {NUMBER} s vs {NUMBER} s "
                                  rf"\(n = 1\), pull {NUMBER} s vs {NUMBER} s; compressed {NUMBER} GB vs {NUMBER} GB",
                     [pytest.mark.slow, pytest.mark.docker]),
    "snapshot_bytes.py": (["--quick", "--codecs", "zstd:3,gzip:6"], rf"snapshot bytes: {NUMBER} GB in \d+ files; zstd-3 \(as push\) "
                                                                    rf"{NUMBER} GB in {NUMBER} s, gzip-6 {NUMBER} GB in {NUMBER} s", []),
    "verify.py": (["--quick"], rf"verify: median {NUMBER} s over 1 runs \(goal <= 5 s\): (goal met|GOAL NOT MET)",
                  [pytest.mark.docker]),
    "sccache_upgrade.py": (["--quick"], rf"sccache 0\.15\.0 -> 0\.16\.0: \d+ of \d+ steps hit \({NUMBER} %\); 0\.15\.0 again: "
                                        r"\d+ of \d+", [pytest.mark.network]),
    "farm_units.py": (["--quick"], rf"cuda-ext: 1 real units \(saxpy\.cu\)(.|\n)*  1 server\(s\): {NUMBER}s, [1-9]\d* steps remote"
                                   rf"(.|\n)*rerun: {NUMBER}s, \d+ steps remote .*, [1-9]\d* hits",
                      [pytest.mark.slow, pytest.mark.docker]),
    "sccache_dist.py": (["--quick"], rf"distributed: {NUMBER}s, \d+ steps compiled on the servers(.|\n)*both servers compiled",
                        [pytest.mark.slow, pytest.mark.toolchain]),
}
