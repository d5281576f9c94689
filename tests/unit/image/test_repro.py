"""Reproducible images: `builder lock` pins the base images by digest, and `builder verify-repro` builds the
fixture cell twice from nothing (empty wheelhouse, no BuildKit cache) and gets the same wheel and the same image
digest — and when two builds differ it names the files, per layer and per wheel member."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from builder import repro
from builder.image import oci

from tests.support.repro import FIXTURE


# -- the differ, on archives made here ----------------------------------------------------------------------
def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mtime) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def _archive(path: Path, layers: list[bytes], history: list[str]) -> str:
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
              "history": [{"created_by": h} for h in history]}
    return oci.write_archive(path, config, [("application/vnd.oci.image.layer.v1.tar+gzip", l) for l in layers])[0]


@pytest.mark.pure
def test_the_differ_names_the_files_that_differ_per_layer(tmp_path):
    base = _layer({"etc/os-release": (b"debian\n", 100)})
    a = _archive(tmp_path / "a.tar", [base, _layer({"var/log/dpkg.log": (b"one\n", 5), "opt/x.pyc": (b"A", 7)})],
                 ["ADD rootfs", "RUN apt-get install python3"])
    b = _archive(tmp_path / "b.tar", [base, _layer({"var/log/dpkg.log": (b"two\n", 6), "opt/x.pyc": (b"A", 7),
                                                    "tmp/new": (b"", 1)})],
                 ["ADD rootfs", "RUN apt-get install python3"])
    assert a != b and oci.digest_of(tmp_path / "a.tar") == a
    lines = oci.diff(tmp_path / "a.tar", tmp_path / "b.tar")
    text = "\n".join(lines)
    assert "layer 2 (RUN apt-get install python3)" in text and "layer 1" not in text  # the equal layer is skipped
    assert "~ /var/log/dpkg.log: mtime 5 → 6, sha256" in text
    assert "+ /tmp/new (only in the second build)" in text
    assert "/opt/x.pyc" not in text
    assert oci.diff(tmp_path / "a.tar", tmp_path / "a.tar") == []


@pytest.mark.pure
def test_wheel_differences_name_members_and_timestamps(tmp_path):
    for name, stamp, body in (("a.whl", (2023, 11, 14, 22, 13, 20), b"x"), ("b.whl", (2024, 1, 1, 0, 0, 0), b"x")):
        with zipfile.ZipFile(tmp_path / name, "w") as zf:
            zf.writestr(zipfile.ZipInfo("pkg/__init__.py", stamp), body)
            zf.writestr(zipfile.ZipInfo("pkg/lib.so", stamp), b"same")
    lines = repro.wheel_differences(tmp_path / "a.whl", tmp_path / "b.whl")
    assert lines == ["  ~ pkg/__init__.py: timestamp (2023, 11, 14, 22, 13, 20) → (2024, 1, 1, 0, 0, 0)",
                     "  ~ pkg/lib.so: timestamp (2023, 11, 14, 22, 13, 20) → (2024, 1, 1, 0, 0, 0)"]


def test_nvcc_objects_are_reproducible_only_with_the_engine_datas_flag(nvcc, tmp_path):
    """Why engines.toml gives CUDA 13.0 builds NVCC_APPEND_FLAGS=-objtemp: nvcc embeds the name of its temporary
    file (tmpxft_<pid>_...) in each object, so two compiles of one source differ; with -objtemp they do not."""
    from builder.engines import load_knowledge

    flags = load_knowledge().nvcc_append_flags("13.0.88")
    assert flags == ("-objtemp",)
    src = FIXTURE / "pkg" / "csrc" / "saxpy.cu"

    def compile_twice(env_flags: str | None) -> list[str]:
        out = []
        for i in (1, 2):
            d = tmp_path / f"{env_flags or 'none'}-{i}"
            d.mkdir()
            env = {k: v for k, v in __import__("os").environ.items() if k != "NVCC_APPEND_FLAGS"}
            if env_flags:
                env["NVCC_APPEND_FLAGS"] = env_flags
            subprocess.run([str(nvcc), "-O2", "-c", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
                            "-o", "saxpy.o", str(src)], cwd=d, env=env, check=True, capture_output=True)
            out.append(hashlib.sha256((d / "saxpy.o").read_bytes()).hexdigest())
        return out

    plain = compile_twice(None)
    assert plain[0] != plain[1]  # different nvcc pids, different objects
    fixed = compile_twice(" ".join(flags))
    assert fixed[0] == fixed[1]
