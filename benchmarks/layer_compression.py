"""The runtime image's layer compression, measured on an image's own layers.

1. Levels. BuildKit's exporter writes the image once with uncompressed layers; each layer is then compressed here
   with gzip -6 and zstd -1, -3, -7, -9 (the four encoders BuildKit maps compression-level to: <3 fastest, <7
   default, <9 better, else best), one thread each, and decompressed again: bytes, compress and decompress seconds.
   (Exporting once per level with BuildKit measures nothing: it keeps a layer's first zstd blob and reuses it
   whatever level is asked next, so every level after the first "exports" the same bytes.)
2. The exporter as builder runs it. The image exported with builder's options (oci.export_options) for gzip and for
   zstd, each archive unpacked into the daemon by `docker load` (the unpack half of a pull): bytes and seconds.

    .venv/bin/python benchmarks/layer_compression.py --image IMAGE   # an image the daemon holds (a real runtime image)
    .venv/bin/python benchmarks/layer_compression.py --quick         # the local Debian base: the script works

It ends with `zstd-3 vs gzip-6: size X %, export Y x faster, unpack Z x faster`.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import ensure_local_bases  # noqa: E402

from builder import docker  # noqa: E402
from builder.image import oci  # noqa: E402

LEVELS = [("gzip", 6), ("zstd", 1), ("zstd", 3), ("zstd", 7), ("zstd", 9)]
CHUNK = 1 << 20


def export(image: str, dest: Path, name: str, options: dict[str, str]) -> float:
    ctx = dest.parent / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(f"FROM {image}\n")
    output = docker.csv_options(type="oci", dest=dest, name=name, **{"rewrite-timestamp": "true"}, **options)
    start = time.monotonic()
    subprocess.run(["docker", "buildx", "build", "--quiet", "--output", output, str(ctx)], check=True,
                   capture_output=True, env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"})
    return time.monotonic() - start


def load(archive: Path, name: str) -> float:
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True)
    start = time.monotonic()
    subprocess.run(["docker", "load", "--input", str(archive)], check=True, capture_output=True)
    took = time.monotonic() - start
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True)
    return took


def compress(kind: str, level: int, src, dst) -> None:
    if kind == "gzip":
        with gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=level, mtime=0) as out:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                out.write(chunk)
    else:
        zstandard.ZstdCompressor(level=level, threads=0).copy_stream(src, dst, read_size=CHUNK, write_size=CHUNK)


def decompress(path: Path) -> None:
    with path.open("rb") as f:
        stream = oci.decompressed(io.BufferedReader(f, CHUNK))
        while stream.read(CHUNK):
            pass


def levels(archive: Path, tmp: Path) -> dict[tuple[str, int], tuple[int, float, float]]:
    """Per level: (bytes, compress seconds, decompress seconds) over every layer of the uncompressed archive."""
    out = {}
    with oci.Archive(archive) as a:
        layers = a.image().layers
        raw = sum(layer["size"] for layer in layers)
        print(f"uncompressed: {raw / 1e6:.1f} MB in {len(layers)} layers", flush=True)
        for kind, level in LEVELS:
            size = ctime = dtime = 0
            for layer in layers:
                target = tmp / "layer.out"
                with a.open_blob(layer["digest"]) as src, target.open("wb") as dst:
                    start = time.process_time()
                    compress(kind, level, src, dst)
                    ctime += time.process_time() - start
                size += target.stat().st_size
                start = time.process_time()
                decompress(target)
                dtime += time.process_time() - start
                target.unlink()
            out[(kind, level)] = (size, ctime, dtime)
            print(f"{kind}-{level}: {size / 1e6:.1f} MB ({size / raw * 100:.1f} % of the tar), compress {ctime:.1f} s, "
                  f"decompress {dtime:.1f} s CPU (one thread)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", help="an image the daemon holds (default with --quick: the local Debian base)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick and not args.image:
        ensure_local_bases()
        args.image = "builder-local/debian:bookworm"
    if not args.image:
        ap.error("--image IMAGE (or --quick)")
    with tempfile.TemporaryDirectory(prefix="builder-compression-", dir=os.environ.get("TMPDIR", "/tmp")) as tmp_name:
        tmp = Path(tmp_name)
        raw = tmp / "uncompressed.tar"
        export(args.image, raw, "builder-bench/compression:raw", {"compression": "uncompressed",
                                                                 "force-compression": "true", "oci-mediatypes": "true"})
        by_level = levels(raw, tmp)
        raw.unlink()
        exported = {}
        for kind in ("gzip", "zstd"):
            archive = tmp / f"{kind}.tar"
            name = f"builder-bench/compression:{kind}"
            seconds = export(args.image, archive, name, oci.export_options(kind))  # BuildKit's default levels
            with oci.Archive(archive) as a:
                image = a.image()
            size = sum(layer["size"] for layer in image.layers)
            unpack = load(archive, name)
            exported[kind] = (seconds, size, unpack)
            print(f"builder's {kind} export: {seconds:.1f} s, {size / 1e6:.1f} MB, docker load {unpack:.1f} s", flush=True)
            archive.unlink()
    level = oci.LEVELS["zstd"]
    g, z = by_level[("gzip", 6)], by_level[("zstd", level)]
    print(f"zstd-{level} vs gzip-6: size {z[0] / g[0] * 100:.1f} %, export {g[1] / z[1]:.2f}x faster, "
          f"unpack {g[2] / z[2]:.2f}x faster (one thread each; {args.image})")


if __name__ == "__main__":
    main()
