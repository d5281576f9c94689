"""The parallelism rule: MAX_JOBS / NVCC_THREADS from cores and free RAM, per package."""

from __future__ import annotations

import pytest

from builder.engines import recipe
from builder.errors import UserError
from builder.resources import Host, choose


@pytest.mark.parametrize("host, package, version, jobs, threads", [
    # 2 cores, 23 GB: cores bound everything
    (Host(2, 23.0), "flash-attn", "2.8.3", 2, 1),
    (Host(2, 23.0), "vllm", "0.33.0", 2, 1),
    # 16 cores, 128 GB: flash-attn runs MAX_JOBS processes of NVCC_THREADS each; vLLM divides MAX_JOBS itself
    (Host(16, 128.0), "flash-attn", "2.8.3", 8, 2),
    (Host(16, 128.0), "vllm", "0.33.0", 16, 2),
    # 64 cores but 32 GB: RAM bounds it (0.9 × 32 / 5 = 5 threads for flash-attn, / 4 = 7 for vLLM)
    (Host(64, 32.0), "flash-attn", "2.8.3", 2, 2),
    (Host(64, 32.0), "vllm", "0.33.0", 7, 2),
    (Host(64, 32.0), "sglang-kernel", "0.4.10", 2, 2),
    # pure Python: no nvcc, all cores
    (Host(64, 32.0), "sglang", "0.5.23", 64, 1),
])
def test_rule(host, package, version, jobs, threads):
    p = choose(recipe(package, version), host)
    assert (p.max_jobs, p.nvcc_threads) == (jobs, threads)
    assert f"MAX_JOBS={jobs} NVCC_THREADS={threads}" in p.why


def test_peak_memory_of_the_choice_fits_free_ram():
    for host in (Host(2, 23.0), Host(16, 128.0), Host(64, 32.0), Host(8, 12.0)):
        for name, version in (("flash-attn", "2.8.3"), ("vllm", "0.33.0"), ("sglang-kernel", "0.4.10")):
            r = recipe(name, version)
            p = choose(r, host)
            threads = p.max_jobs if r.parallelism == "total-threads" else p.max_jobs * p.nvcc_threads
            assert threads * r.mem_gb_per_nvcc_thread <= host.free_gb * 0.9, (host, name, p)
            assert threads <= host.cores


def test_a_host_that_cannot_feed_one_thread_is_refused():
    with pytest.raises(UserError, match="needs ~5 GB per nvcc thread and this host has 3.0 GB free"):
        choose(recipe("flash-attn", "2.8.3"), Host(8, 3.0))


def test_overrides_win_and_warn_when_they_exceed_ram():
    p = choose(recipe("flash-attn", "2.8.3"), Host(2, 23.0), max_jobs=8, nvcc_threads=2)
    assert (p.max_jobs, p.nvcc_threads) == (8, 2)
    assert "(given)" in p.why and "WARNING: ~80 GB at peak" in p.why
    assert "WARNING" not in choose(recipe("flash-attn", "2.8.3"), Host(2, 23.0), max_jobs=1, nvcc_threads=1).why


def test_detect_reads_this_host():
    h = Host.detect()
    assert h.cores >= 1 and h.free_gb > 0
