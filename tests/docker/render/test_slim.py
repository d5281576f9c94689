"""The runtime's slimming (dockerfiles/macros.j2 `slim`, issue 48 item 3), its very text rendered as the runtime
renders it and run by BuildKit on the local CUDA base: in a venv laid out like the engine's (a per-arch JIT source
tree, `tests` directories, files shipped twice with different modes), the per-arch sources of GPU generations newer
than the cell's go and the cell's own stay, the tests go, and each set of identical files (same mode and owner)
becomes one file with hard links, in the layer the image exports."""

from __future__ import annotations

import subprocess
import tarfile

import pytest

from builder import archs as archs_mod
from builder import templates
from builder.image import oci

pytestmark = pytest.mark.docker

SP = "/opt/venv/lib/python3.11/site-packages"
BIG = "x" * 5000  # over the 1 KiB below which files are not linked; each file's own name makes it unique


def _dockerfile(base: str, archs: tuple[int, ...]) -> str:
    slim = {"arch_sources": ["flashinfer/data/csrc", "not/there"], "newer": archs_mod.newer_generations(archs)}
    step = templates.environment().from_string('{% import "macros.j2" as m %}{{ m.slim(slim) }}').render(slim=slim)
    files = {f"{SP}/flashinfer/data/csrc/cake_dsv4/sm_120a/k.cu": BIG, f"{SP}/flashinfer/data/csrc/cake_dsv4/sm_90a/k.cu": BIG,
             f"{SP}/flashinfer/data/csrc/alphamoe_nvfp4_sm100.cu": BIG, f"{SP}/flashinfer/data/csrc/gemm_sm90.cu": BIG,
             f"{SP}/flashinfer/data/csrc/fmha/fmha_sm103a_kernel.cuh": BIG, f"{SP}/flashinfer/data/csrc/common.h": BIG,
             f"{SP}/flashinfer/data/csrc/smooth_100.h": BIG,  # "sm" inside a word: not an arch
             f"{SP}/numpy/_core/tests/test_x.py": BIG, f"{SP}/numpy/testing/__init__.py": BIG,
             f"{SP}/a/lib.so": BIG + "same", f"{SP}/b/lib.so": BIG + "same", f"{SP}/c/tool": BIG + "same",
             f"{SP}/d/small.txt": "same", f"{SP}/e/small.txt": "same"}
    files = {p: (t if "same" in t else t + p) for p, t in files.items()}  # only the "same" ones are identical
    writes = " \\\n && ".join(f"mkdir -p $(dirname {p}) && printf '%s' '{t}' > {p}" for p, t in files.items())
    # one RUN, as the install and the slim step are one: the files and their links land in one layer
    return (f"FROM {base}\nSHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\nRUN {writes} \\\n && chmod 755 {SP}/c/tool"
            f" \\\n && sp={SP} \\\n && {step}\n")


def test_the_slim_step_drops_newer_arch_sources_and_tests_and_links_duplicates(local_bases, tmp_path):
    (tmp_path / "Dockerfile").write_text(_dockerfile(local_bases["cuda_base"], (80, 90)))
    archive = tmp_path / "image.oci.tar"
    built = subprocess.run(["docker", "buildx", "build", "--output", f"type=oci,dest={archive}", str(tmp_path)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    with oci.Archive(archive) as a:
        image = a.image()
        with a.open_layer(image.layers[-1]) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            entries = {"/" + m.name: m for m in tar}
    csrc = f"{SP}/flashinfer/data/csrc"
    assert not [p for p in entries if "sm_120a" in p or "sm100" in p or "sm103a" in p or "/tests" in p]
    for kept in (f"{csrc}/cake_dsv4/sm_90a/k.cu", f"{csrc}/gemm_sm90.cu", f"{csrc}/common.h", f"{csrc}/smooth_100.h",
                 f"{SP}/numpy/testing/__init__.py"):  # the cell's own archs, files naming no arch, numpy.testing
        assert kept in entries and entries[kept].isreg(), kept
    # the two identical libraries are one file and a link; the executable of the same contents keeps its mode and
    # its own inode; files under 1 KiB are left alone
    a_lib, b_lib = entries.get(f"{SP}/a/lib.so"), entries.get(f"{SP}/b/lib.so")
    linked = [m for m in (a_lib, b_lib) if m is not None and m.islnk()]
    assert len(linked) == 1 and linked[0].linkname.lstrip("/") in (f"{SP}/a/lib.so".lstrip("/"), f"{SP}/b/lib.so".lstrip("/"))
    assert not any(m.islnk() for p, m in entries.items() if p.endswith(("/c/tool", "small.txt")))


def test_a_cell_of_a_newer_generation_keeps_its_sources():
    assert archs_mod.newer_generations((80, 90)).startswith("10[0-9]|")
    assert archs_mod.newer_generations((90, 100)).startswith("11[0-9]|") and "10[0-9]" not in archs_mod.newer_generations((90, 100))
    assert archs_mod.newer_generations((120,)) == "13[0-9]|14[0-9]|15[0-9]|16[0-9]|17[0-9]|18[0-9]|19[0-9]"
