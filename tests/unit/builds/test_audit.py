"""builder.audit against real binaries: tiny CUDA libraries compiled here, and wheels from PyPI.

Every binary is also read by NVIDIA's own cuobjdump, and the two must agree entry for entry.

Needs: nvcc (on PATH, $CUDA_HOME/bin or /usr/local/cuda-13.0/bin), a host C compiler, cuobjdump
(the `nvidia-cuda-cuobjdump` wheel of the test extras, else /usr/local/cuda-13.0/bin) and PyPI for
the third-party wheels, cached by sha256 under $BUILDER_TEST_CACHE or ~/.cache/builder-tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.audit import (AuditReport, FatbinEntry, FatbinFormatError, arch_is_covered, audit, format_report,
                           read_fatbin_entries)
from builder.errors import UserError
from builder.files import sha256_file

from tests.support import audit as support
from tests.support.audit import LINKER_SCRIPT, SINGLE, P, S

# fixtures shared with the other half, found by pytest under these names
built = support.built
host_cc = support.host_cc


# cuobjdump's default output prints one header block per fatbin entry, in file order:
#   Fatbin elf code: / Fatbin ptx code: / Fatbin nvvm code:  then  arch = sm_90a  and maybe  compressed
_CUOBJDUMP_KIND = {"elf": "sass", "ptx": "ptx", "nvvm": "other"}


class CuobjdumpFailed(Exception):
    pass


def cuobjdump_entries(tool: Path, path: Path) -> list[tuple[str, int, str, bool]]:
    proc = subprocess.run([str(tool), str(path)], check=False, capture_output=True, text=True)
    if "does not contain device code" in proc.stderr:
        return []
    if proc.returncode != 0:
        raise CuobjdumpFailed(proc.stderr.strip())
    blocks: list[dict] = []
    for line in proc.stdout.splitlines():
        m = re.match(r"Fatbin (\w+) code:$", line)
        if m:
            blocks.append({"kind": _CUOBJDUMP_KIND.get(m.group(1), m.group(1)), "compressed": False})
            continue
        m = re.match(r"arch = sm_(\d+)([a-z]?)$", line)
        if m and blocks and "arch" not in blocks[-1]:
            blocks[-1].update(arch=int(m.group(1)), variant=m.group(2))
        elif line.strip() == "compressed" and blocks:
            blocks[-1]["compressed"] = True
    return [(b["kind"], b["arch"], b["variant"], b["compressed"]) for b in blocks]


def cuobjdump_lists(tool: Path, path: Path) -> tuple[list[str], list[str]]:
    """The arch names of --list-elf and --list-ptx ('sm_90a'), sorted, 'f' dropped.

    --list-elf names a family-specific cubin plain sm_100 (its arch line says sm_100f) while
    --list-ptx keeps compute_100f's 'f', so the comparison ignores 'f'.
    """
    out = []
    for option in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([str(tool), option, str(path)], check=False, capture_output=True, text=True)
        if proc.returncode != 0 and "does not contain device code" not in proc.stderr:
            raise CuobjdumpFailed(proc.stderr.strip())
        names = re.findall(r"\.sm_(\d+[a-z]?)\.(?:cubin|ptx)$", proc.stdout, re.MULTILINE)
        out.append(sorted("sm_" + n.rstrip("f") for n in names))
    return out[0], out[1]


def assert_matches_cuobjdump(tool: Path, path: Path, entries: list[FatbinEntry]) -> None:
    ours = [(e.kind, e.arch, e.variant, e.compressed) for e in entries]
    assert ours == cuobjdump_entries(tool, path), path
    sass = sorted(f"sm_{e.arch}{e.variant.rstrip('f')}" for e in entries if e.kind == "sass")
    ptx = sorted(f"sm_{e.arch}{e.variant.rstrip('f')}" for e in entries if e.kind == "ptx")
    assert (sass, ptx) == cuobjdump_lists(tool, path), path


# --------------------------------------------------------------------------- (a) exact entries, coverage


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_entries_of_compiled_library(built, name):
    assert read_fatbin_entries(built[name]) == SINGLE[name][1]


def test_entry_names(built):
    assert [e.name for e in read_fatbin_entries(built["sm100f"])] == ["sm_100f", "compute_100f"]
    assert [e.name for e in read_fatbin_entries(built["sm90a"])] == ["sm_90a"]
    assert [e.name for e in read_fatbin_entries(built["ptx80"])] == ["compute_80"]


def test_every_container_is_walked(built):
    # two objects, each with its container, plus the device-link container nvcc adds
    assert read_fatbin_entries(built["shared_two_sources"]) == [S(80), S(90)] * 3
    # the device-link container of a PTX-only build is empty; the PTX is in the other one
    assert read_fatbin_entries(built["shared_ptx80"]) == [P(80)]


def test_relocatable_fatbin(built):
    # a -rdc shared library: the runtime loads the linked .nv_fatbin (SASS only); the PTX stays
    # in __nv_relfatbin, which (like cuobjdump) is read only when there is no .nv_fatbin
    assert read_fatbin_entries(built["shared_rdc"]) == [S(80)]
    assert read_fatbin_entries(built["rdc_obj"]) == [S(80, compressed=True), P(80)]


def test_lto_ir_is_reported_as_other(built):
    entries = read_fatbin_entries(built["lto_obj"])
    assert entries == [FatbinEntry("other", 80, "", True), S(90, compressed=True)]
    assert entries[0].name == "lto_80"
    assert arch_is_covered(entries, 80) == (False, "")


def test_no_device_code(built):
    assert read_fatbin_entries(built["host_only"]) == []


COVERAGE = [
    ("sm80", 80, True, "SASS sm_80"),
    ("sm80", 86, True, "SASS sm_80"),
    ("sm80", 89, True, "SASS sm_80"),
    ("sm80", 90, False, ""),
    ("sm80", 75, False, ""),
    ("sm80_sm90", 90, True, "SASS sm_90"),
    ("sm80_sm90", 86, True, "SASS sm_80"),
    ("sm80_sm90", 100, False, ""),
    ("ptx80", 80, True, "PTX compute_80 (JIT)"),
    ("ptx80", 90, True, "PTX compute_80 (JIT)"),
    ("ptx80", 120, True, "PTX compute_80 (JIT)"),
    ("ptx80", 75, False, ""),
    ("sm90a", 90, True, "SASS sm_90a"),
    ("sm90a", 80, False, ""),
    ("sm90a", 100, False, ""),
    ("ptx90a", 90, True, "PTX compute_90a (JIT)"),
    ("ptx90a", 100, False, ""),
    ("sm100f", 100, True, "SASS sm_100f"),
    ("sm100f", 103, True, "SASS sm_100f"),
    ("sm100f", 110, False, ""),
    ("sm100f", 120, False, ""),
    ("sm100f", 90, False, ""),
]


@pytest.mark.parametrize(("name", "arch", "covered", "how"), COVERAGE)
def test_coverage_of_compiled_library(built, name, arch, covered, how):
    assert arch_is_covered(read_fatbin_entries(built[name]), arch) == (covered, how)


@pytest.mark.pure
def test_coverage_rule_prefers_sass_then_the_closest_arch():
    assert arch_is_covered([P(80), S(80)], 86) == (True, "SASS sm_80")
    assert arch_is_covered([S(80), S(86)], 89) == (True, "SASS sm_86")
    assert arch_is_covered([S(90, "a"), S(90)], 90) == (True, "SASS sm_90")
    assert arch_is_covered([P(80), P(90)], 100) == (True, "PTX compute_90 (JIT)")
    assert arch_is_covered([S(86), P(90)], 80) == (False, "")
    assert arch_is_covered([S(120, "f")], 121) == (True, "SASS sm_120f")
    assert arch_is_covered([S(120, "a")], 121) == (False, "")
    assert arch_is_covered([], 80) == (False, "")


def test_audit_of_one_library_names_the_missing_arch(built):
    lib = built["sm80"]
    report = audit(lib, [80, 90])
    assert not report.ok
    [b] = report.binaries
    assert b.path == str(lib)
    assert [(r.arch, r.covered, r.how) for r in b.results] == [(80, True, "SASS sm_80"), (90, False, "")]
    text = format_report(report)
    assert f"FAIL {lib}: sm_90 missing (has SASS sm_80, no PTX)" in text.splitlines()
    assert audit(built["ptx80"], [80, 90]).ok
    assert audit(built["sm90a"], [90]).ok
    assert not audit(built["sm90a"], [90, 100]).ok


# --------------------------------------------------------------------------- (b) cuobjdump agrees

CROSS_CHECKED = sorted(SINGLE) + ["shared_two_sources", "shared_ptx80", "shared_rdc", "rdc_obj", "lto_obj", "host_only"]


@pytest.mark.parametrize("name", CROSS_CHECKED)
def test_compiled_binary_matches_cuobjdump(built, cuobjdump, name):
    path = built[name]
    assert_matches_cuobjdump(cuobjdump, path, read_fatbin_entries(path))


# --------------------------------------------------------------------------- (c) third-party wheels


@dataclass(frozen=True)
class ThirdParty:
    requirement: str
    filename: str
    sha256: str
    cuobjdump_cannot_read: frozenset = frozenset()


# 43 MB: libraries built by CUDA 11.8, 12.1, 12.4, 12.6, 12.8, 13.0 and 13.2 (zstd-compressed
# entries, sm_100/sm_120 with long entry headers), plus ROCm/XPU/CPU libraries without CUDA code.
# cuobjdump 13 stops with "Invalid ELF" on the CUDA 12.1 library's sm_70 cubin.
BITSANDBYTES = ThirdParty(
    "bitsandbytes==0.50.2",
    "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl",
    "55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283",
    frozenset({"bitsandbytes/libbitsandbytes_cuda121.so"}),
)
# 31 MB: a CUDA 12 library with LZ4-compressed (flag 0x2000) SASS and PTX entries, 16 containers.
CUEQUIVARIANCE = ThirdParty(
    "cuequivariance-ops-cu12==0.9.1",
    "cuequivariance_ops_cu12-0.9.1-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    "5af92f91dc9b8f5a13ab34e1d6e2809a22952c33d8b5dc0ff7ff70157495fd54",
)
# 102 MB (430 MB unpacked): built by CUDA 12.4 with sm_90a kernels; flash_ops is Hopper-only.
SGL_KERNEL = ThirdParty(
    "sgl-kernel==0.1.0",
    "sgl_kernel-0.1.0-cp39-abi3-manylinux2014_x86_64.whl",
    "d3bdbd2b15eaae701540bf4110fb0bc88c059c5895bbeed2e92e5696f9609e96",
)


def _cache_dir() -> Path:
    base = os.environ.get("BUILDER_TEST_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "builder-tests"


def fetch_wheel(wheel: ThirdParty) -> Path:
    """The wheel from the cache, else from PyPI through pip (pip's own index and CA settings)."""
    dest = _cache_dir() / "wheels" / wheel.sha256 / wheel.filename
    if dest.is_file() and sha256_file(dest) == wheel.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_24_x86_64",
            "--platform", "manylinux2014_x86_64", "--python-version", "3.12",
            "-d", tmp, wheel.requirement,
        ]  # fmt: skip
        proc = subprocess.run(argv, check=False, capture_output=True, text=True)
        got = Path(tmp, wheel.filename)
        if proc.returncode != 0 or not got.is_file():
            pytest.fail(f"could not download {wheel.filename}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        digest = sha256_file(got)
        if digest != wheel.sha256:
            pytest.fail(f"{wheel.filename}: sha256 {digest}, expected {wheel.sha256}")
        os.replace(got, dest)
    return dest


def cross_check_wheel(wheel: Path, expected_unreadable: frozenset, tmp: Path, cuobjdump: Path, archs) -> AuditReport:
    """audit() the wheel in place, then compare each member with cuobjdump on its extracted copy."""
    report = audit(wheel, archs)
    members = [b.path.split("!", 1)[1] for b in report.binaries]
    with zipfile.ZipFile(wheel) as zf:
        assert members == sorted(n for n in zf.namelist() if re.search(r"\.so(\.\d+)*$", n))
        for m in members:
            zf.extract(m, tmp)
    unreadable = set()
    for b, member in zip(report.binaries, members):
        extracted = tmp / member
        assert not b.error, b.error
        assert list(b.entries) == read_fatbin_entries(extracted), member  # zip member == file
        try:
            assert_matches_cuobjdump(cuobjdump, extracted, list(b.entries))
        except CuobjdumpFailed:
            unreadable.add(member)
    assert unreadable == set(expected_unreadable)
    return report


@pytest.mark.network
def test_bitsandbytes_wheel_matches_cuobjdump(tmp_path, cuobjdump):
    wheel = fetch_wheel(BITSANDBYTES)
    report = cross_check_wheel(wheel, BITSANDBYTES.cuobjdump_cannot_read, tmp_path, cuobjdump, [80, 90, 120])
    lib = lambda name: report.binary(f"{wheel.name}!bitsandbytes/{name}")
    assert lib("libbitsandbytes_cuda118.so").names("sass") == [
        "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90",
    ]  # fmt: skip
    assert lib("libbitsandbytes_cuda118.so").missing == [120]
    cuda130 = lib("libbitsandbytes_cuda130.so")
    assert cuda130.ok and all(e.compressed for e in cuda130.entries)
    assert {"sm_100", "sm_120"} <= set(cuda130.names("sass"))
    for other in ("libbitsandbytes_cpu.so", "libbitsandbytes_rocm64.so", "libbitsandbytes_xpu2025.so"):
        assert not lib(other).has_device_code and lib(other).ok
    assert sum(b.has_device_code for b in report.binaries) == 7
    assert not report.ok
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is False and len(data["binaries"]) == len(report.binaries)


@pytest.mark.network
def test_cuda12_lz4_compressed_wheel_matches_cuobjdump(tmp_path, cuobjdump):
    wheel = fetch_wheel(CUEQUIVARIANCE)
    report = cross_check_wheel(wheel, CUEQUIVARIANCE.cuobjdump_cannot_read, tmp_path, cuobjdump, [80, 90, 100, 120])
    [b] = [b for b in report.binaries if b.has_device_code]
    assert any(e.compressed and e.kind == "sass" for e in b.entries)
    assert any(not e.compressed and e.kind == "sass" for e in b.entries)
    assert b.names("ptx") == ["compute_100", "compute_120"]
    assert report.ok


@pytest.mark.network
@pytest.mark.slow
def test_cuda12_sm90a_wheel_matches_cuobjdump(tmp_path, cuobjdump):
    wheel = fetch_wheel(SGL_KERNEL)
    report = cross_check_wheel(wheel, SGL_KERNEL.cuobjdump_cannot_read, tmp_path, cuobjdump, [80, 90])
    flash = report.binary(f"{wheel.name}!sgl_kernel/flash_ops.abi3.so")
    assert flash.names("sass") == ["sm_90a"] and flash.names("ptx") == []
    assert flash.missing == [80]
    common = report.binary(f"{wheel.name}!sgl_kernel/common_ops.abi3.so")
    assert common.names("sass") == ["sm_75", "sm_80", "sm_89", "sm_90", "sm_90a"]
    assert common.ok
    assert f"FAIL {wheel.name}!sgl_kernel/flash_ops.abi3.so: sm_80 missing (has SASS sm_90a, no PTX)" in format_report(
        report
    )


# --------------------------------------------------------------------------- (d) wheels, directories, errors


def _write_wheel(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, (data, compression) in members.items():
            zf.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), data, compress_type=compression)
    return path


def test_audit_wheel_reads_members_without_unpacking(built, tmp_path):
    wheel = _write_wheel(
        tmp_path / "demo-1.0-py3-none-linux_x86_64.whl",
        {
            "demo/__init__.py": (b"", zipfile.ZIP_DEFLATED),
            "demo/_C.so": (built["sm80"].read_bytes(), zipfile.ZIP_DEFLATED),
            "demo/lib/libboth.so.1": (built["sm80_sm90"].read_bytes(), zipfile.ZIP_STORED),
            "demo/lib/libptx.so": (built["shared_ptx80"].read_bytes(), zipfile.ZIP_DEFLATED),
            "demo/script.so": (LINKER_SCRIPT, zipfile.ZIP_STORED),
        },
    )
    report = audit(wheel, [80, 90])
    w = wheel.name
    assert [b.path for b in report.binaries] == [
        f"{w}!demo/_C.so", f"{w}!demo/lib/libboth.so.1", f"{w}!demo/lib/libptx.so", f"{w}!demo/script.so",
    ]  # fmt: skip
    assert report.binary(f"{w}!demo/_C.so").entries == (S(80),)
    assert report.binary(f"{w}!demo/_C.so").missing == [90]
    assert report.binary(f"{w}!demo/lib/libboth.so.1").entries == (S(80), S(90))
    assert report.binary(f"{w}!demo/lib/libptx.so").results[1].how == "PTX compute_80 (JIT)"
    script = report.binary(f"{w}!demo/script.so")
    assert not script.has_device_code and script.ok and script.note == "not an ELF file"
    assert not report.ok
    assert [b.path for b in report.failures] == [f"{w}!demo/_C.so"]
    lines = format_report(report).splitlines()
    assert f"FAIL {w}!demo/_C.so: sm_90 missing (has SASS sm_80, no PTX)" in lines
    assert lines[-1].startswith("FAILED")
    assert audit(wheel, [80]).ok


def test_audit_directory(built, tmp_path):
    root = tmp_path / "tree"
    (root / "pkg" / "sub").mkdir(parents=True)
    shutil.copy(built["sm80_sm90"], root / "pkg" / "_C.abi3.so")
    shutil.copy(built["host_only"], root / "pkg" / "sub" / "libhost.so.2")
    shutil.copy(built["sm80"], root / "pkg" / "sub" / "libold.so")
    (root / "pkg" / "sub" / "libc.so").write_bytes(LINKER_SCRIPT)
    (root / "pkg" / "README.txt").write_text("not a library")
    (root / "pkg" / "sub" / "kernels.o").write_bytes(built["sm80"].read_bytes())  # not a .so: skipped
    os.symlink("_C.abi3.so", root / "pkg" / "_C.so")  # a link: its target is listed once
    (root / "dist").mkdir()
    _write_wheel(
        root / "dist" / "x-1-py3-none-any.whl", {"x/_k.so": (built["sm90a"].read_bytes(), zipfile.ZIP_DEFLATED)}
    )

    report = audit(root, [80])
    assert [b.path for b in report.binaries] == [
        "dist/x-1-py3-none-any.whl!x/_k.so",
        "pkg/_C.abi3.so",
        "pkg/sub/libc.so",
        "pkg/sub/libhost.so.2",
        "pkg/sub/libold.so",
    ]
    assert [b.path for b in report.failures] == ["dist/x-1-py3-none-any.whl!x/_k.so"]
    assert report.binary("pkg/sub/libhost.so.2").status == "no device code"
    assert audit(root / "pkg", [80, 86]).ok
    report90 = audit(root, [90])
    assert [b.path for b in report90.failures] == ["pkg/sub/libold.so"]
    text = format_report(report90)
    assert "FAIL pkg/sub/libold.so: sm_90 missing (has SASS sm_80, no PTX)" in text
    assert "(2 binaries without device code not shown)" in text
    assert "pkg/sub/libhost.so.2" in format_report(report90, verbose=True)


def test_audit_directory_follows_symlinks_out_of_the_tree(built, tmp_path):
    """A library symlinked (or inside a directory symlinked) out of the tree is read, not skipped: here it
    lacks sm_90, so the audit fails naming the link. A dangling link is an error, a loop is walked once."""
    root, outside = tmp_path / "tree", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    (outside / "libs").mkdir(parents=True)
    shutil.copy(built["sm80_sm90"], root / "pkg" / "_C.so")
    shutil.copy(built["sm80"], outside / "libold.so.1")
    shutil.copy(built["sm80"], outside / "libs" / "libdeep.so")
    os.symlink(outside / "libold.so.1", root / "pkg" / "libold.so")
    os.symlink(outside / "libs", root / "pkg" / "vendored")
    os.symlink("..", root / "pkg" / "loop")  # a directory loop: walked once
    report = audit(root, [80, 90])
    assert sorted(b.path for b in report.failures) == ["pkg/libold.so", "pkg/vendored/libdeep.so"]
    assert not report.ok
    os.symlink(tmp_path / "gone.so", root / "pkg" / "libgone.so")
    assert any(b.path == "pkg/libgone.so" and "does not exist" in (b.error or "") for b in audit(root, [80]).binaries)
    from tests.helpers import run_cli

    res = run_cli("audit", str(root / "pkg"), "--arch", "80,90")
    assert res.exit_code != 0 and "libold.so" in res.output


@pytest.mark.pure
def test_empty_directory_passes_but_says_so(tmp_path):
    report = audit(tmp_path, [80])
    assert report.ok and not report.has_device_code and report.binaries == []
    assert "no shared libraries found" in format_report(report)


def test_report_json(built):
    report = audit(built["sm80_sm90"], [80, 100])
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is False and data["archs"] == [80, 100]
    [b] = data["binaries"]
    assert b["sass"] == ["sm_80", "sm_90"] and b["ptx"] == []
    assert b["missing"] == [100]
    assert b["archs"] == [
        {"arch": 80, "covered": True, "how": "SASS sm_80"},
        {"arch": 100, "covered": False, "how": ""},
    ]
    assert b["entries"][0] == {
        "name": "sm_80", "kind": "sass", "arch": 80, "variant": "", "compressed": False, "count": 1,
    }  # fmt: skip


@pytest.mark.pure
def test_missing_path_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        audit(tmp_path / "nope.so", [80])
    with pytest.raises(UserError, match="no such file"):
        read_fatbin_entries(tmp_path / "nope.so")


@pytest.mark.pure
def test_not_an_elf_is_a_user_error(tmp_path):
    text = tmp_path / "libc.so"
    text.write_bytes(LINKER_SCRIPT)
    with pytest.raises(UserError, match="not an ELF"):
        audit(text, [80])
    with pytest.raises(UserError, match="not an ELF"):
        read_fatbin_entries(text)
    fake_wheel = tmp_path / "fake-1-py3-none-any.whl"
    fake_wheel.write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a wheel"):
        audit(fake_wheel, [80])


@pytest.mark.parametrize("archs", [[], ["90"], [9], [True]])
def test_bad_archs_are_a_user_error(built, archs):
    with pytest.raises(UserError):
        audit(built["sm80"], archs)


def _corrupt(src: Path, dst: Path, at_magic_plus: int, data: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    pos = raw.find(b"\x50\xed\x55\xba")  # the first fatbin container's magic
    assert pos > 0
    raw[pos + at_magic_plus : pos + at_magic_plus + len(data)] = data
    dst.write_bytes(bytes(raw))
    return dst


def test_corrupt_fatbin_fails_the_audit(built, tmp_path):
    bad_magic = _corrupt(built["sm80"], tmp_path / "libbadmagic.so", 0, b"\x51")
    with pytest.raises(FatbinFormatError, match="no fatbin magic"):
        read_fatbin_entries(bad_magic)
    # the first entry's payload size (container header 16 + 8) pointing past the container
    bad_size = _corrupt(built["sm80"], tmp_path / "libbadsize.so", 24, (1 << 40).to_bytes(8, "little"))
    with pytest.raises(FatbinFormatError, match="bad fatbin entry"):
        read_fatbin_entries(bad_size)
    report = audit(bad_size, [80])
    assert not report.ok and report.binaries[0].status == "ERROR"
    assert f"FAIL {bad_size}: " in format_report(report)


def test_truncated_file(built, tmp_path):
    raw = built["sm80"].read_bytes()
    cut = tmp_path / "libcut.so"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(FatbinFormatError):
        read_fatbin_entries(cut)
    short = tmp_path / "libshort.so"
    short.write_bytes(raw[:20])
    with pytest.raises(FatbinFormatError):
        read_fatbin_entries(short)


# --------------------------------------------------------------------------- arch scopes (engine data arch_scoped)


def test_a_scoped_binary_is_asked_only_for_the_requested_archs_inside_its_families(built, tmp_path):
    """vLLM's FA3 library carries sm_90a alone by design: in an 80,90 cell it must cover 90 and is not asked
    for 80; the same file unscoped fails for sm_80, and a scoped file that lacks its own family still fails."""
    from builder.archs import ArchScope

    pkg = tmp_path / "site" / "vllm" / "vllm_flash_attn"
    pkg.mkdir(parents=True)
    shutil.copy(built["sm90a"], pkg / "_vllm_fa3_C.abi3.so")
    shutil.copy(built["sm100f"], tmp_path / "site" / "vllm" / "_deepselect_C.abi3.so")
    scopes = [ArchScope("vllm/vllm_flash_attn/_vllm_fa3_C*", (90,), "FlashAttention 3 (Hopper)"),
              ArchScope("vllm/_deepselect_C*", (100, 103), "DeepSelect (sm_100f)")]
    site = tmp_path / "site"
    unscoped = audit(site, [80, 90])
    assert not unscoped.ok and {b.path: b.missing for b in unscoped.failures} == {
        "vllm/_deepselect_C.abi3.so": [80, 90], "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": [80]}
    scoped = audit(site, [80, 90], scopes)
    assert scoped.ok and scoped.proven
    fa3 = scoped.binary("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    assert [r.arch for r in fa3.results] == [90] and fa3.status == "ok (FlashAttention 3 (Hopper): for sm_90 only)"
    ds = scoped.binary("vllm/_deepselect_C.abi3.so")
    assert ds.results == () and ds.status.startswith("ok (not for these archs: DeepSelect")
    assert fa3.to_json()["scope"] == {"files": "vllm/vllm_flash_attn/_vllm_fa3_C*", "archs": [90], "why": "FlashAttention 3 (Hopper)"}
    # inside the family the scope is no excuse: sm_100f does not run on 12.0, the FA3 file has no sm_100
    wider = [ArchScope("vllm/vllm_flash_attn/_vllm_fa3_C*", (90, 100), "FA3 said to cover 100")] + scopes[1:]
    bad = audit(site, [90, 100], wider)
    assert {b.path: b.missing for b in bad.failures} == {"vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": [100]}
    # the same scopes match the file inside a wheel and at its absolute path in an image
    whl = tmp_path / "vllm-1-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(pkg / "_vllm_fa3_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    assert audit(whl, [80, 90], scopes).ok and not audit(whl, [80, 90]).ok
    # the verb: --package applies the engine data's scopes of that release (bad spellings are exit 2)
    from tests.helpers import run_cli

    (tmp_path / "site" / "vllm" / "_deepselect_C.abi3.so").unlink()
    assert run_cli("audit", str(site), "--arch", "80,90").exit_code == 1
    res = run_cli("audit", str(site), "--arch", "80,90", "--package", "vllm==0.33.0")
    assert res.exit_code == 0 and "ok (FlashAttention 3 (Hopper): for sm_90 only)" in res.output, res.output
    res = run_cli("audit", str(site), "--arch", "80,90", "--package", "vllm=0.33.0")
    assert res.exit_code == 2 and "--package: 'vllm=0.33.0' is not NAME==VERSION" in res.output
    assert scopes[0].matches("/opt/venv/lib/python3.12/site-packages/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    assert not scopes[0].matches("/opt/venv/lib/python3.12/site-packages/other/vllm/_vllm_fa3_C.abi3.so")


@pytest.mark.pure
def test_the_engine_data_scopes_the_vllm_libraries_its_cmake_builds_per_family():
    from builder.engines import load_knowledge

    scopes = {s.files: s.archs for s in load_knowledge().recipe("vllm", "0.33.0").arch_scoped}
    assert scopes["vllm/vllm_flash_attn/_vllm_fa3_C*"] == (90,)
    assert scopes["vllm/_deepselect_C*"] == (100, 103)
    assert "vllm/_C*" not in scopes and not any(80 in a for a in scopes.values())  # nothing excuses sm_80 code


def test_a_copy_loaded_on_every_gpu_but_some_is_asked_for_the_others_only(built, tmp_path):
    """sglang-kernel ships common_ops twice: sgl_kernel/load_utils.py loads sm90/ on compute capability 9.0 and
    sm100/ on every other GPU. With `all_but` the sm100/ copy is asked for every requested arch except 9.0, the
    sm90/ copy for 9.0 only; a copy that lacks a GPU it loads on still fails, naming the file."""
    from builder.archs import ArchScope

    site = tmp_path / "site" / "sgl_kernel"
    (site / "sm90").mkdir(parents=True)
    (site / "sm100").mkdir()
    shutil.copy(built["sm90a"], site / "sm90" / "common_ops.abi3.so")
    shutil.copy(built["sm80"], site / "sm100" / "common_ops.abi3.so")
    scopes = [ArchScope("sgl_kernel/sm90/common_ops*", (90,), "sm90/ on 9.0"),
              ArchScope("sgl_kernel/sm100/common_ops*", (), "sm100/ elsewhere", all_but=(90,))]
    assert scopes[1].covers(80) and scopes[1].covers(120) and not scopes[1].covers(90)
    ok = audit(tmp_path / "site", [80, 90], scopes)
    assert ok.ok and ok.proven
    other = ok.binary("sgl_kernel/sm100/common_ops.abi3.so")
    assert [r.arch for r in other.results] == [80]
    assert other.status == "ok (sm100/ elsewhere: for every GPU but sm_90 only)"
    assert other.to_json()["scope"]["all_but"] == [90]
    assert ArchScope.from_json(other.to_json()["scope"]) == scopes[1]
    # an A10G (8.6) loads the sm100/ copy: its sm_80 SASS runs there; a Thor (11.0) loads it too and finds nothing
    assert audit(tmp_path / "site", [86, 90], scopes).ok
    bad = audit(tmp_path / "site", [90, 110], scopes)
    assert {b.path: b.missing for b in bad.failures} == {"sgl_kernel/sm100/common_ops.abi3.so": [110]}


@pytest.mark.pure
def test_the_engine_data_scopes_sglang_kernel_by_what_loads_where():
    from builder.engines import load_knowledge

    scopes = {s.files: s for s in load_knowledge().recipe("sglang-kernel", "0.4.10").arch_scoped}
    assert scopes["sgl_kernel/sm90/common_ops*"].archs == (90,)
    assert scopes["sgl_kernel/sm100/common_ops*"].all_but == (90,)
    assert scopes["sgl_kernel/flashmla_ops*"].archs == (90, 100, 103)
    assert 80 in scopes["sgl_kernel/flash_ops*"].archs and 100 not in scopes["sgl_kernel/flash_ops*"].archs
    assert all(s.why for s in scopes.values())
    # infllm_ops as upstream builds it (sm_80, sm_90, sm_120a): asked for the GPUs that code runs on, not 10.x
    infllm = scopes["sgl_kernel/infllm_ops*"]
    assert infllm.matches("sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so")
    assert all(infllm.covers(a) for a in (80, 86, 89, 90, 120)) and not any(infllm.covers(a) for a in (100, 103, 121))
    assert not any(s.matches("sgl_kernel/spatial_ops.abi3.so") for s in scopes.values())
