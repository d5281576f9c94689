"""The OCI archive reader (builder/image/oci.py) reads layers as streams: gzip, zstd (BuildKit's compression=zstd,
possibly several frames) and uncompressed layers give the same entries; a blob that does not match its digest, or a
compressed stream cut short, is a one-line UserError; and a layer larger than the memory the reader may use is read
in a few MiB (a child process's peak RSS, against a layer of 768 MiB)."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

from builder.errors import UserError
from builder.image import oci
from tests.helpers import REPO

FILES = {"usr/lib/libx.so": b"\x7fELF" + bytes(range(256)) * 64, "etc/motd": b"hello\n"}


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1700000000, 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zstd_frames(data: bytes, frames: int = 3) -> bytes:
    c = zstandard.ZstdCompressor(level=3)
    step = -(-len(data) // frames)
    return b"".join(c.compress(data[i:i + step]) for i in range(0, len(data), step))


def _write_archive(path: Path, layer_blob_path: Path, media: str) -> dict:
    """An OCI archive whose one layer is the file at layer_blob_path (streamed in, never read whole); its descriptor."""
    config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    return oci.write_archive(path, config, [(media, layer_blob_path)])[1][0]


@pytest.mark.parametrize("kind, media, make", [
    ("gzip", "application/vnd.oci.image.layer.v1.tar+gzip", lambda b: gzip.compress(b, mtime=0)),
    ("zstd", "application/vnd.oci.image.layer.v1.tar+zstd", _zstd_frames),
    ("none", "application/vnd.oci.image.layer.v1.tar", lambda b: b),
])
def test_every_compression_gives_the_same_entries(tmp_path, kind, media, make):
    blob = tmp_path / "layer"
    blob.write_bytes(make(_tar(FILES)))
    layer = _write_archive(tmp_path / "a.tar", blob, media)
    with oci.Archive(tmp_path / "a.tar") as a:
        (got,) = a.image().layers
        assert got == layer
        entries = a.layer_entries(got)
    assert entries == oci.entries_of(_tar(FILES))
    assert entries["/usr/lib/libx.so"].sha256 == hashlib.sha256(FILES["usr/lib/libx.so"]).hexdigest()


def test_a_blob_that_is_not_its_digest_or_is_cut_short_is_refused_in_one_line(tmp_path):
    data = _zstd_frames(_tar(FILES))
    blob = tmp_path / "layer"
    blob.write_bytes(data)
    layer = _write_archive(tmp_path / "a.tar", blob, "application/vnd.oci.image.layer.v1.tar+zstd")
    altered = dict(layer, digest="sha256:" + "0" * 64)
    with oci.Archive(tmp_path / "a.tar") as a:
        with pytest.raises(UserError, match="no blobs/sha256/0000"):
            a.layer_entries(altered)
    # the same digest over other bytes: the archive lies about its blob
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    _write_archive(tmp_path / "b.tar", blob, "application/vnd.oci.image.layer.v1.tar+zstd")
    with tarfile.open(tmp_path / "b.tar") as src, tarfile.open(tmp_path / "c.tar", "w") as dst:
        for m in src:
            f = src.extractfile(m)
            if m.name.startswith("blobs/sha256/") and m.size == len(data):
                m = tarfile.TarInfo(f"blobs/sha256/{layer['digest'][7:]}")
                m.size = len(data)
            dst.addfile(m, f)
    with oci.Archive(tmp_path / "c.tar") as c:
        with pytest.raises(UserError) as exc:
            c.layer_entries(layer)
    assert str(exc.value).count("\n") == 0
    assert "does not match its digest" in str(exc.value) or "cannot be read" in str(exc.value)
    # cut short: a gzip layer missing its end
    short = gzip.compress(_tar(FILES), mtime=0)[:-40]
    blob.write_bytes(short)
    cut = _write_archive(tmp_path / "d.tar", blob, "application/vnd.oci.image.layer.v1.tar+gzip")
    with oci.Archive(tmp_path / "d.tar") as d:
        with pytest.raises(UserError, match="cannot be read"):
            d.layer_entries(cut)


# VmHWM (this process's own peak resident set), not getrusage's ru_maxrss: Linux carries ru_maxrss across execve,
# so a child of a big pytest worker would report the worker's size
READ = """
import re, sys
from pathlib import Path
from builder.image import oci
with oci.Archive(sys.argv[1]) as a:
    (layer,) = a.image().layers
    entries = a.layer_entries(layer)
hwm = re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)
print(entries["/big"].size, hwm)
"""


@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_a_layer_larger_than_the_memory_it_may_use_is_read_in_a_few_mib(tmp_path, kind):
    """768 MiB of layer (one file) read by a child process whose peak RSS stays under 128 MiB (51 measured; the interpreter and
    builder's imports take most of it): the reader holds chunks, never the layer. The old reader (gzip.decompress of
    the whole blob) peaked above the layer's size."""
    size = 768 << 20
    blob = tmp_path / "layer"
    with blob.open("wb") as out:
        writer = (zstandard.ZstdCompressor(level=1).stream_writer(out, closefd=False) if kind == "zstd"
                  else gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0))
        with writer:
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as t:
                info = tarfile.TarInfo("big")
                info.size = size

                class Zeros(io.RawIOBase):
                    left = size

                    def readable(self):
                        return True

                    def readinto(self, b):
                        n = min(len(b), self.left)
                        b[:n] = bytes(n)
                        self.left -= n
                        return n

                t.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    assert blob.stat().st_size < 8 << 20  # zeros compress: the archive is small, the layer is not
    _write_archive(tmp_path / "big.tar", blob, f"application/vnd.oci.image.layer.v1.tar+{kind}")
    out = subprocess.run([sys.executable, "-c", READ, str(tmp_path / "big.tar")], capture_output=True, text=True,
                         cwd=REPO, check=True)
    read_size, peak_kib = map(int, out.stdout.split())
    assert read_size == size
    assert peak_kib < 128 * 1024, f"peak RSS {peak_kib // 1024} MiB for a {size >> 20} MiB layer"
