"""What a snapshot weighs as it ships (issue 52 item 4): the files `builder snapshot push` sends (per kind: CRIU's
memory pages, its other images, the key, record and log), and that tar compressed as push does (zstd -3, every core)
against single-threaded gzip -6 (what an image layer would be by default before zstd) and zstd -19, each with its
seconds. Nothing is pushed: the tar is streamed through each codec and counted.

    .venv/bin/python benchmarks/snapshot_bytes.py --snapshot DIR [--codecs zstd:3,gzip:6,zstd:19] [--json OUT]
    .venv/bin/python benchmarks/snapshot_bytes.py --quick    # a made-up directory of a snapshot's shape: the script runs

DIR is what `builder snapshot take --out DIR` wrote (a real engine's on a GPU host, or the stand-in's here). The
figures of --quick say nothing about a real snapshot (its pages are half random, half zeros, by construction)."""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import io
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.deploy.snapshot import ship  # noqa: E402
from builder.deploy.snapshot.restore import read_record  # noqa: E402


class Counter(io.RawIOBase):
    def __init__(self):
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.n += len(b)
        return len(b)


def measure(directory: Path, codec: str) -> dict:
    kind, _, level = codec.partition(":")
    level_n = int(level or 3)
    counter = Counter()
    t0 = time.monotonic()
    if kind == "zstd" and level_n == ship.LEVEL:  # exactly what push makes
        _, size, _, _ = ship.pack(directory, counter)
    elif kind == "zstd":
        import zstandard

        with zstandard.ZstdCompressor(level=level_n, threads=-1).stream_writer(counter, closefd=False) as z:
            ship.write_tar(directory, z)
        size = counter.n
    elif kind == "gzip":
        with gzip.GzipFile(fileobj=counter, mode="wb", compresslevel=level_n, mtime=0) as z:
            ship.write_tar(directory, z)
        size = counter.n
    elif kind == "none":
        ship.write_tar(directory, counter)
        size = counter.n
    else:
        raise SystemExit(f"--codecs: {codec!r}: say zstd:N, gzip:N or none")
    return {"codec": codec, "bytes": size, "seconds": round(time.monotonic() - t0, 2)}


def made_up(directory: Path) -> Path:
    """A directory of a snapshot's shape (not a snapshot of anything): 8 MiB of pages, half random, half zeros."""
    from builder.deploy.snapshot import key as key_mod

    (directory / "images").mkdir(parents=True)
    (directory / "images" / "inventory.img").write_bytes(b"inventory")
    (directory / "images" / "pages-1.img").write_bytes(os.urandom(4 << 20) + bytes(4 << 20))
    key_mod.Key(gpus=("none",), driver="none", subject="sha256:" + "0" * 64, model="m", model_config_sha256="",
                engine_args=("python3",), tp=1, criu="4.1.1").write(directory)
    (directory / "engine.log").write_text("booted\n")
    (directory / "snapshot.json").write_text(json.dumps({"answer": "x", "served_model": "m", "log_bytes": 7}))
    return directory


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--snapshot", type=Path)
    what.add_argument("--quick", action="store_true")
    ap.add_argument("--codecs", default="none,zstd:3,gzip:6,zstd:19")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            args.snapshot = made_up(Path(tmp) / "snap")
            return report(args)
    return report(args)


def report(args) -> int:
    files = ship.members(args.snapshot, read_record(args.snapshot))
    kinds: dict[str, int] = {}
    for name, _, size in files:
        kind = ("memory pages (images/pages-*.img)" if name.startswith("images/pages-") else
                "other CRIU images" if name.startswith("images/") else name)
        kinds[kind] = kinds.get(kind, 0) + size
    shipped = sum(kinds.values())
    print(f"{args.snapshot}: {len(files)} files, {shipped:,} bytes shipped")
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind}: {n:,} bytes ({n / shipped:.1%})")
    results = []
    for codec in args.codecs.split(","):
        r = measure(args.snapshot, codec.strip())
        r["ratio"] = round(r["bytes"] / shipped, 4) if shipped else None
        results.append(r)
        print(f"  {r['codec']:>8}: {r['bytes']:>15,} bytes ({r['ratio']:.3f} of the files) in {r['seconds']} s")
    by = {r["codec"]: r for r in results}
    if "zstd:3" in by and "gzip:6" in by:
        z, g = by["zstd:3"], by["gzip:6"]
        print(f"snapshot bytes: {shipped / 1e9:.3f} GB in {len(files)} files; zstd-3 (as push) {z['bytes'] / 1e9:.3f} GB in "
              f"{z['seconds']} s, gzip-6 {g['bytes'] / 1e9:.3f} GB in {g['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps({"snapshot": str(args.snapshot), "files": len(files), "bytes": shipped,
                                         "kinds": kinds, "codecs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
