"""Pull-and-unpack seconds of one image with gzip layers and with zstd layers, on a daemon that does not hold it
(issue 48 item 4). A pull on the daemon that built the image measures nothing (its blobs are in its containerd
store already), so the pulls run on a second engine: a dockerd of its own (data root, bridge, socket) started here,
or the daemon `--docker-host` names. Each variant is pushed once to the registry, then pulled `--runs` times by
digest, the image and its content removed before each pull.

    .venv/bin/python benchmarks/pull.py --archive WORK/<cell>/image.oci.tar [--runs 3] [--registry HOST:PORT]
                                        [--docker-host unix:///path/to/docker.sock]
    .venv/bin/python benchmarks/pull.py --quick     # the local CUDA base image, one run each: the script works

The archive is builder's image.oci.tar (zstd layers by default): pushed as it is (skopeo, digests kept) and once
more with its layers recompressed to gzip -6 (skopeo --dest-compress-format gzip), or the other way round for a gzip
archive. Without --registry a docker-registry is started on 127.0.0.1 with its data in a temporary directory. It
ends with `pull zstd vs gzip: median X s vs Y s (n = N), Z x faster; compressed A GB vs B GB, unpacked U GB`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import ensure_local_bases  # noqa: E402

from builder.image import oci  # noqa: E402
from tests.engines import second_engine  # noqa: E402

MANIFESTS = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                       "application/vnd.docker.distribution.manifest.v2+json"])


def sh(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    """`argv` run; with `check`, a failure stops the benchmark naming the command and what it said (a pull that
    fails for want of disk says so)."""
    res = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} exited {res.returncode}: {(res.stderr or res.stdout).strip()[-1500:]}")
    return res


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def registry(root: Path):
    """docker-registry on 127.0.0.1:PORT, its data under root."""
    host = f"127.0.0.1:{free_port()}"
    (root / "config.yml").write_text("\n".join(["version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:",
                                                f"    rootdirectory: {root / 'data'}", "http:", f"  addr: {host}"]))
    proc = subprocess.Popen([shutil.which("docker-registry") or "docker-registry", "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"docker-registry on {host} did not come up")
                time.sleep(0.2)
        yield host
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def manifest(host: str, repo: str, ref: str) -> tuple[str, dict]:
    """(digest, manifest) the registry serves for repo:ref (one platform image)."""
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{ref}", headers={"Accept": MANIFESTS})
    with urllib.request.urlopen(req, timeout=30) as resp:
        digest, body = resp.headers["Docker-Content-Digest"], json.loads(resp.read())
    if "manifests" in body:  # an index: its one image (attestations aside)
        inner = [m for m in body["manifests"] if (m.get("annotations") or {}).get("vnd.docker.reference.type") is None]
        return digest, manifest(host, repo, inner[0]["digest"])[1]
    return digest, body


def recompressed(archive: Path, dest: Path, kind: str) -> tuple[Path, int]:
    """The archive's image with every layer decompressed and compressed again as `kind` (gzip -6, mtime 0; or
    zstd -3), one new manifest over the same config (the layers' uncompressed digests do not change), and the
    bytes of the layers' tars, uncompressed. skopeo 1.9 cannot force another compression on a copy, so the
    archive is rewritten here."""
    import gzip

    import zstandard

    tar_bytes = 0
    work = dest.parent / f"{dest.name}.blobs"
    work.mkdir()
    with oci.Archive(archive) as a:
        image = a.image()
        layers = []
        for i, desc in enumerate(image.layers):
            out = work / f"layer-{i}"
            with a.open_layer(desc) as src, out.open("wb") as raw:
                sink = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) if kind == "gzip" else \
                    zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
                with sink:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        sink.write(chunk)
                        tar_bytes += len(chunk)
            layers.append((f"application/vnd.oci.image.layer.v1.tar+{kind}", out))
        config = a.blob(json.loads(a.blob(image.manifest_digest))["config"]["digest"])
    oci.write_archive(dest, config, layers)
    shutil.rmtree(work)
    return dest, tar_bytes


def push(archive: Path, dest: str) -> None:
    sh(["skopeo", "copy", "--dest-tls-verify=false", "--retry-times", "0", "--preserve-digests",
        f"oci-archive:{archive}", f"docker://{dest}"])


def held_bytes(data_root: Path | None) -> int | None:
    """Bytes under the second engine's data root (None for a daemon this script did not start)."""
    if data_root is None:
        return None
    return sum(p.stat().st_size for p in data_root.rglob("*") if p.is_file() and not p.is_symlink())


def pull_once(docker_host: str, ref: str, data_root: Path | None) -> tuple[float, int | None]:
    """Seconds of one pull by digest (the image, and with it its content, removed first) and the bytes the
    engine's data root held just before it (so a pull that found its blobs still there shows)."""
    sh(["docker", "-H", docker_host, "image", "rm", "-f", ref], check=False)
    sh(["docker", "-H", docker_host, "image", "prune", "-af"], check=False)
    held = held_bytes(data_root)
    start = time.monotonic()
    sh(["docker", "-H", docker_host, "pull", "--quiet", ref])
    return time.monotonic() - start, held


def measure(archive: Path, reg: str, docker_host: str, runs: int, scratch: Path, data_root: Path | None = None) -> dict:
    with oci.Archive(archive) as a:
        media = {l.get("mediaType", "") for l in a.image().layers}
    own = "zstd" if any(m.endswith("+zstd") for m in media) else "gzip"
    other = "gzip" if own == "zstd" else "zstd"
    repo = f"bench-pull-{uuid.uuid4().hex[:8]}"
    out = {}
    for kind in (own, other):
        started = time.monotonic()
        source, unpacked = (archive, 0) if kind == own else recompressed(archive, scratch / f"{kind}.oci.tar", kind)
        push(source, f"{reg}/{repo}:{kind}")
        if source != archive:
            source.unlink()
        pushed = time.monotonic() - started
        digest, body = manifest(reg, repo, kind)
        compressed = sum(l["size"] for l in body["layers"])
        ref = f"{reg}/{repo}@{digest}"
        pulls = [pull_once(docker_host, ref, data_root) for _ in range(runs)]
        seconds = [round(s, 2) for s, _ in pulls]
        out[kind] = {"digest": digest, "compressed": compressed, "seconds": seconds, "push_s": round(pushed, 1),
                     "recompressed": kind != own, "unpacked": unpacked,
                     "held_before_each_pull": [h for _, h in pulls]}
        sh(["docker", "-H", docker_host, "image", "rm", "-f", ref], check=False)
        print(f"{kind}: {compressed / 1e9:.2f} GB compressed, pulled in " + ", ".join(f"{s:.1f}" for s in seconds)
              + f" s; {'recompressed and ' if kind != own else ''}pushed in {pushed:.1f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", type=Path, help="builder's image.oci.tar of the image")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--registry", help="HOST:PORT of a registry to push to (default: one started here)")
    ap.add_argument("--docker-host", help="the daemon that pulls (default: a second dockerd started here)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--quick", action="store_true", help="the local CUDA base image, one run each")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bpl-", dir="/tmp") as tmp:  # short: a socket path has <= 107 bytes
        root = Path(tmp)
        archive, runs = args.archive, args.runs
        if args.quick or archive is None:
            ensure_local_bases()
            archive, runs = root / "base.oci.tar", 1
            (root / "ctx").mkdir()
            (root / "ctx" / "Dockerfile").write_text("FROM builder-local/cuda:13.0-base\n")
            sh(["docker", "buildx", "build", "--quiet", "--output",
                f"type=oci,dest={archive},compression=zstd,force-compression=true", str(root / "ctx")])
        with contextlib.ExitStack() as stack:
            (root / "reg").mkdir()
            (root / "eng").mkdir()
            reg = args.registry or stack.enter_context(registry(root / "reg"))
            host = args.docker_host or stack.enter_context(second_engine(root / "eng")).host
            found = measure(archive, reg, host, runs, root, None if args.docker_host else root / "eng" / "data")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    z, g = found["zstd"], found["gzip"]
    unpacked = z["unpacked"] or g["unpacked"]  # the layers' tars, counted when the other variant was made
    mz, mg = statistics.median(z["seconds"]), statistics.median(g["seconds"])
    print(f"pull zstd vs gzip: median {mz:.1f} s vs {mg:.1f} s (n = {runs}), {mg / mz:.2f}x faster; compressed "
          f"{z['compressed'] / 1e9:.2f} GB vs {g['compressed'] / 1e9:.2f} GB, unpacked {unpacked / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
