"""Lazy pulling, measured (issue 48 item 5): the time from nothing on the node to the engine imported in a container,
with the image's layers as eStargz pulled lazily by the stargz snapshotter, against a full pull of builder's zstd
layers by containerd's overlayfs snapshotter.

Each run starts a fresh node: a containerd of its own (its own root, state and socket; this machine's containerd
binary, runc and shim) with the stargz snapshotter (scripts/stargz-snapshotter builds it) as a proxy plugin, both
from empty directories. The image's OCI archive is pushed to a registry on 127.0.0.1 as built (zstd) and converted to
eStargz once (`ctr-remote image convert --estargz --oci`: gzip layers with a table of contents, readable by any
runtime). Then, n times each:

  lazy   ctr-remote image rpull (only the manifest, config and each layer's table of contents), then
         `ctr run --snapshotter stargz IMAGE python -c 'import ENGINE'`: the files the import reads are fetched
  full   ctr image pull (every layer fetched and unpacked), then the same run on overlayfs

    .venv/bin/python benchmarks/lazy_pull.py --archive WORK/<cell>/image.oci.tar [--runs 3]
    .venv/bin/python benchmarks/lazy_pull.py --quick      # the fixture cell, built here first, one run

Root (FUSE, overlayfs, the snapshotter's mounts). Prints
`lazy (eStargz) vs full (zstd): to the engine imported median X s vs Y s (n = N), pull A s vs B s; compressed E GB vs
Z GB`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import REPO  # noqa: E402
from image_bytes import chosen_archive  # noqa: E402
from pull import registry, sh  # noqa: E402

from builder.image import labels as labels_mod  # noqa: E402
from builder.image import oci  # noqa: E402
from tests.engines import PREFIX  # noqa: E402


def snapshotter_binary() -> Path:
    out = REPO / ".cache" / "stargz-snapshotter"
    if not out.exists():
        built = sh([str(REPO / "scripts" / "stargz-snapshotter"), str(out)], check=False)
        if built.returncode != 0:
            sys.exit(f"scripts/stargz-snapshotter failed:\n{built.stderr[-2000:]}")
    return out


@contextlib.contextmanager
def node(root: Path, reg: str, snapshotter: Path):
    """A fresh containerd with the stargz snapshotter, both from empty directories; yields ctr-remote's argv head."""
    root.mkdir(parents=True)
    (root / "stargz.toml").write_text(f'[[resolver.host."{reg}".mirrors]]\nhost = "{reg}"\ninsecure = true\n')
    (root / "containerd.toml").write_text(
        f'version = 2\nroot = "{root}/containerd"\nstate = "{root}/state"\n[grpc]\n  address = "{root}/containerd.sock"\n'
        f'[proxy_plugins]\n  [proxy_plugins.stargz]\n    type = "snapshot"\n    address = "{root}/stargz.sock"\n')
    env = {**os.environ, "PATH": f"{PREFIX / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    procs = [subprocess.Popen([str(snapshotter), "-address", str(root / "stargz.sock"), "-root", str(root / "stargz"),
                               "-config", str(root / "stargz.toml")], stdout=(root / "stargz.log").open("wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)]
    procs.append(subprocess.Popen([shutil.which("containerd") or "containerd", "--config", str(root / "containerd.toml")],
                                  stdout=(root / "containerd.log").open("wb"), stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True))
    ctr = ["ctr-remote", "-a", str(root / "containerd.sock")]
    try:
        deadline = time.monotonic() + 60
        while sh([*ctr, "plugins", "ls"], check=False).stdout.count("stargz") == 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                sys.exit("containerd or the stargz snapshotter did not start:\n"
                         + (root / "containerd.log").read_text()[-1500:] + (root / "stargz.log").read_text()[-1500:])
            time.sleep(0.3)
        yield ctr
    finally:
        for p in reversed(procs):
            p.send_signal(2)  # SIGINT: the snapshotter unmounts its layers and removes its cache
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
        for m in sorted(mounts, key=len, reverse=True):
            sh(["umount", "-l", m], check=False)
        shutil.rmtree(root, ignore_errors=True)


def layer_bytes(ctr: list[str], ref: str) -> int:
    """The compressed bytes of REF's layers, read from the node's content store (an index: its first platform image)."""
    doc = json.loads(sh([*ctr, "content", "get", _digest(ctr, ref)]).stdout)
    if "manifests" in doc:
        doc = json.loads(sh([*ctr, "content", "get", doc["manifests"][0]["digest"]]).stdout)
    return sum(d["size"] for d in doc["layers"])


def _digest(ctr: list[str], ref: str) -> str:
    for line in sh([*ctr, "images", "ls"]).stdout.splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == ref:
            return next(p for p in parts if p.startswith("sha256:"))
    raise SystemExit(f"{ref} is not in the node's image store")


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = sh(argv, check=False)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} ... failed:\n{res.stdout[-1500:]}{res.stderr[-1500:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the fixture cell, built here first; one run")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("root is needed (FUSE mounts, overlayfs, containerd)")
    with tempfile.TemporaryDirectory(prefix="bench-lazy-") as tmp_dir:
        tmp = Path(tmp_dir)
        archive = chosen_archive(args.quick, args.archive, tmp)
        if args.quick:
            args.runs = 1
        with oci.Archive(archive) as a:
            config = a.image().config
        engine, _ = labels_mod.engine((config.get("config") or {}).get("Labels") or {})
        command = ["python", "-c", f"import {(engine or 'sys').replace('-', '_')}"]
        snapshotter = snapshotter_binary()
        (tmp / "registry").mkdir()
        with registry(tmp / "registry") as reg:
            zstd, esgz = f"{reg}/bench/image:zstd", f"{reg}/bench/image:esgz"
            sh(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci-archive:{archive}", f"docker://{zstd}"])
            with node(tmp / "convert", reg, snapshotter) as ctr:
                sh([*ctr, "image", "pull", "--plain-http", zstd])
                t0 = time.perf_counter()
                sh([*ctr, "image", "convert", "--estargz", "--oci", zstd, esgz])
                convert_s = time.perf_counter() - t0
                sh([*ctr, "image", "push", "--plain-http", esgz])
                sizes = {ref: layer_bytes(ctr, ref) for ref in (zstd, esgz)}
            runs: dict[str, list[tuple[float, float]]] = {"lazy": [], "full": []}
            for i in range(args.runs):
                for kind in ("lazy", "full"):
                    with node(tmp / f"{kind}{i}", reg, snapshotter) as ctr:
                        if kind == "lazy":
                            pull = timed([*ctr, "image", "rpull", "--plain-http", esgz])
                            first = timed([*ctr, "run", "--rm", "--snapshotter", "stargz", esgz,
                                           f"lazy-{uuid.uuid4().hex[:8]}", *command])
                        else:
                            pull = timed([*ctr, "image", "pull", "--plain-http", zstd])
                            first = timed([*ctr, "run", "--rm", zstd, f"full-{uuid.uuid4().hex[:8]}", *command])
                        runs[kind].append((pull, first))
                        print(f"run {i + 1} {kind}: pull {pull:.1f} s, then `{' '.join(command)}` {first:.1f} s",
                              flush=True)
    med = {k: statistics.median(p + f for p, f in v) for k, v in runs.items()}
    pulls = {k: statistics.median(p for p, _ in v) for k, v in runs.items()}
    print(f"converted to eStargz in {convert_s:.1f} s")
    print(f"lazy (eStargz) vs full (zstd): to the engine imported median {med['lazy']:.1f} s vs {med['full']:.1f} s "
          f"(n = {args.runs}), pull {pulls['lazy']:.1f} s vs {pulls['full']:.1f} s; compressed "
          f"{sizes[esgz] / 1e9:.2f} GB vs {sizes[zstd] / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
