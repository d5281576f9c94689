"""The parallelism rule: MAX_JOBS / NVCC_THREADS from cores and free RAM, per package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder import resources
from builder.engines import recipe
from builder.errors import EnvironmentProblem, UserError
from builder.resources import Host, choose


@pytest.mark.pure
@pytest.mark.parametrize("host, package, version, jobs, threads", [
    # 2 cores, 23 GB: cores bound everything
    (Host(2, 23.0), "flash-attn", "2.8.3", 2, 1),
    (Host(2, 23.0), "vllm", "0.33.0", 2, 1),
    # 16 cores, 128 GB: flash-attn runs MAX_JOBS processes of NVCC_THREADS each; vLLM divides MAX_JOBS itself
    (Host(16, 128.0), "flash-attn", "2.8.3", 8, 2),
    (Host(16, 128.0), "vllm", "0.33.0", 13, 2),  # 0.9 × 128 / 8.5 GB (CUTLASS sm90, measured) = 13 threads
    # 64 cores but 32 GB: RAM bounds it (0.9 × 32 / 6.5 = 4 threads for flash-attn, / 8.5 = 3 for vLLM)
    (Host(64, 32.0), "flash-attn", "2.8.3", 2, 2),
    (Host(64, 32.0), "vllm", "0.33.0", 3, 1),
    (Host(64, 32.0), "sglang-kernel", "0.4.10", 2, 2),
    # pure Python: no nvcc, all cores
    (Host(64, 32.0), "sglang", "0.5.23", 64, 1),
])
def test_rule(host, package, version, jobs, threads):
    p = choose(recipe(package, version), host)
    assert (p.max_jobs, p.nvcc_threads) == (jobs, threads)
    assert f"MAX_JOBS={jobs} NVCC_THREADS={threads}" in p.why


@pytest.mark.pure
def test_peak_memory_of_the_choice_fits_free_ram():
    for host in (Host(2, 23.0), Host(16, 128.0), Host(64, 32.0), Host(8, 12.0)):
        for name, version in (("flash-attn", "2.8.3"), ("vllm", "0.33.0"), ("sglang-kernel", "0.4.10")):
            r = recipe(name, version)
            p = choose(r, host)
            threads = p.max_jobs if r.parallelism == "total-threads" else p.max_jobs * p.nvcc_threads
            assert threads * r.mem_gb_per_nvcc_thread <= host.free_gb * 0.9, (host, name, p)
            assert threads <= host.cores


@pytest.mark.pure
def test_a_host_that_cannot_feed_one_thread_is_refused():
    with pytest.raises(UserError, match="needs ~6.5 GB per nvcc thread and this host has 3.0 GB free"):
        choose(recipe("flash-attn", "2.8.3"), Host(8, 3.0))


@pytest.mark.pure
def test_overrides_win_and_warn_when_they_exceed_ram():
    p = choose(recipe("flash-attn", "2.8.3"), Host(2, 23.0), max_jobs=8, nvcc_threads=2)
    assert (p.max_jobs, p.nvcc_threads) == (8, 2)
    assert "(given)" in p.why and "WARNING: ~104 GB at peak" in p.why
    assert "WARNING" not in choose(recipe("flash-attn", "2.8.3"), Host(2, 23.0), max_jobs=1, nvcc_threads=1).why


def _mem_available_gb() -> float:
    (line,) = [ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:")]
    return int(line.split()[1]) / 1024 / 1024


def _avphys_gb() -> float:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1024**3


@pytest.mark.pure
def test_detect_reads_this_host():
    before = _mem_available_gb()
    h = Host.detect()
    after = _mem_available_gb()
    assert h.cores == len(os.sched_getaffinity(0))
    # rounded to 0.1 GB; other processes may move MemAvailable a little between the reads
    assert min(before, after) - 0.2 <= h.free_gb <= max(before, after) + 0.2, (h, before, after)


@pytest.mark.pure
def test_detect_reads_the_given_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       67108864 kB\nMemFree:         1048576 kB\nMemAvailable:   12897484 kB\n")
    assert Host.detect(meminfo).free_gb == 12.3


@pytest.mark.pure
@pytest.mark.parametrize("content", [None, "MemTotal:       67108864 kB\n", "MemAvailable:   lots\n"])
def test_unreadable_meminfo_falls_back_to_free_pages(tmp_path, content):
    meminfo = tmp_path / "meminfo"
    if content is not None:
        meminfo.write_text(content)
    before = _avphys_gb()
    h = Host.detect(meminfo)
    after = _avphys_gb()
    assert h.cores == len(os.sched_getaffinity(0))
    assert h.free_gb is not None and min(before, after) - 0.2 <= h.free_gb <= max(before, after) + 0.2, (h, before, after)


@pytest.mark.pure
def test_no_way_to_read_free_memory_needs_explicit_parallelism(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "AVPHYS_PAGES", "SC_NO_SUCH_SYSCONF_NAME")
    h = Host.detect(tmp_path / "missing")
    assert h.free_gb is None  # never a made-up number
    with pytest.raises(EnvironmentProblem, match="could not determine this host's free memory.*--max-jobs and --nvcc-threads"):
        choose(recipe("flash-attn", "2.8.3"), h)
    p = choose(recipe("flash-attn", "2.8.3"), h, max_jobs=2, nvcc_threads=1)
    assert (p.max_jobs, p.nvcc_threads) == (2, 1)
    assert p.why == "MAX_JOBS=2 NVCC_THREADS=1 (given); ~13 GB at peak, free memory unknown"
    # pure Python needs no RAM estimate at all
    assert choose(recipe("sglang", "0.5.23"), h).max_jobs == h.cores
