"""A snapshot as an OCI artifact in a registry, beside the warm image it was taken of: its key is the manifest's
config, so a pull judges it (GPU names, driver) before a byte of the images is fetched; the directory travels as one
tar layer compressed with zstd, streamed both ways with bounded memory (an engine's dump is GBs: its host memory).

    push DIRECTORY REF   the snapshot's files (images/, key.json, snapshot.json, the engine's log at its dumped
                         size) -> REF (HOST[:PORT]/PATH:TAG)
    pull REF --out DIR   REF (a tag or a digest) -> DIR, a new directory, whole or not at all

What is not shipped: what a restore writes beside the snapshot (restore.pid, the log a restored engine went on
writing, engine.log.N, the checkpoint tool built on its host: each host builds its own)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...errors import UserError
from . import key as key_mod
from .remaps import REMAPS
from .restore import IMAGES, LOG, read_record

ARTIFACT = "application/vnd.builder.snapshot.v1"
KEY_MEDIA = "application/vnd.builder.snapshot.key.v1+json"
LAYER_MEDIA = "application/vnd.builder.snapshot.layer.v1.tar+zstd"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
RECORD = "snapshot.json"
LEVEL = 3  # as the image layers (image/oci.py LEVELS: measured there); a dump's pages are not text
CHUNK = 1 << 20
ROUTE, DIRECTORY = "io.builder.snapshot.route", "io.builder.snapshot.directory"
UNPACKED = "io.builder.snapshot.unpacked-bytes"


@dataclass(frozen=True)
class Shipped:
    ref: str
    digest: str  # the manifest's
    layer_bytes: int  # compressed, as pushed or pulled
    unpacked_bytes: int
    files: int
    seconds: float

    def to_json(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "layer_bytes": self.layer_bytes,
                "unpacked_bytes": self.unpacked_bytes, "files": self.files, "seconds": self.seconds}


def route_of(snapshot: key_mod.Key) -> str:
    """docker: restored in a container of the image, the directory mounted at a fixed path (it may live anywhere
    on the host); process: restored on a host, its open files named by the path it was taken at."""
    return "process" if snapshot.subject.startswith("venv ") else "docker"


def members(directory: Path, record: dict) -> list[tuple[str, Path, int]]:
    """(name in the layer, file, bytes to ship) of every file a restore reads, sorted: CRIU's images and link remaps,
    the key, the record, and the engine's log at the size it had at the dump (CRIU refuses a reopened file of another
    size)."""
    out = [(name, directory / name, (directory / name).stat().st_size) for name in (key_mod.KEY, RECORD)]
    for path in sorted([*(directory / IMAGES).rglob("*"), *(directory / REMAPS).rglob("*")]):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise UserError(f"{path}: not a regular file; a snapshot's images are files (take it again)")
        if path.is_file():
            out.append((path.relative_to(directory).as_posix(), path, path.stat().st_size))
    log, size = directory / LOG, record.get("log_bytes")
    if log.is_file() and isinstance(size, int) and 0 <= size <= log.stat().st_size:
        out.append((LOG, log, size))
    return sorted(out)


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes to `out`."""

    def __init__(self, out):
        self.out, self.sha, self.n = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        self.n += len(b)
        self.out.write(b)
        return len(b)


def write_tar(directory: Path, out) -> tuple[int, int]:
    """The files a restore reads (`members`) as one tar written to `out`: (their bytes, how many)."""
    files = members(directory, read_record(directory))
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path, size in files:
            info = tarfile.TarInfo(name)
            st = path.stat()
            # its mode and time as they are: CRIU reopens the engine's log and refuses another mode ("has bad mode")
            info.size, info.mtime, info.mode = size, int(st.st_mtime), st.st_mode & 0o777
            with path.open("rb") as f:
                tar.addfile(info, f)  # exactly info.size bytes: the log up to its size at the dump
    return sum(size for _, _, size in files), len(files)


def pack(directory: Path, dest) -> tuple[str, int, int, int]:
    """The snapshot's files as a tar compressed with zstd, written to `dest` (a binary file): (sha256 digest of
    what was written, its bytes, the tar's unpacked bytes, files)."""
    import zstandard

    hashing = _Hashing(dest)
    with zstandard.ZstdCompressor(level=LEVEL, threads=-1).stream_writer(hashing, closefd=False) as z:
        unpacked, files = write_tar(directory, z)
    return "sha256:" + hashing.sha.hexdigest(), hashing.n, unpacked, files


def manifest(key_digest: str, key_size: int, layer_digest: str, layer_size: int, unpacked: int,
             snapshot: key_mod.Key, record: dict) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA, "artifactType": ARTIFACT,
           "config": {"mediaType": KEY_MEDIA, "digest": key_digest, "size": key_size},
           "layers": [{"mediaType": LAYER_MEDIA, "digest": layer_digest, "size": layer_size,
                       "annotations": {UNPACKED: str(unpacked)}}],
           "annotations": {ROUTE: route_of(snapshot), DIRECTORY: record.get("directory", "")}}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _client_and_repo(ref):
    from ... import registry_api

    where = registry_api.endpoint(ref.api_host, given=True)
    return registry_api.Client(where), f"{ref.api_host}/{ref.api_repository}"


def push(directory: Path, ref, say=lambda s: None) -> Shipped:
    """The snapshot in `directory` pushed as REF's artifact. The layer is packed to a temporary file beside the
    snapshot first (its digest must be known before the upload ends), then streamed; nothing is tagged unless every
    blob is in the registry."""
    snapshot = key_mod.read(directory)
    record = read_record(directory)
    if not ref.tag or ref.digest:
        raise UserError(f"{ref}: name a tag to push to (HOST[:PORT]/PATH:TAG), not a digest")
    t0 = time.monotonic()
    key_bytes = (directory / key_mod.KEY).read_bytes()
    packed = directory / f".push-{secrets.token_hex(6)}.tar.zst"  # named first: an interrupt anywhere removes it
    try:
        with packed.open("xb") as tmp:
            layer_digest, layer_size, unpacked, files = pack(directory, tmp)
        say(f"packed {files} files, {unpacked:,} bytes -> {layer_size:,} bytes (zstd -{LEVEL}) in "
            f"{time.monotonic() - t0:.1f} s")
        body = manifest("sha256:" + hashlib.sha256(key_bytes).hexdigest(), len(key_bytes), layer_digest, layer_size,
                        unpacked, snapshot, record)
        client, repo = _client_and_repo(ref)
        with client:
            client.upload(repo, key_bytes)
            client.upload_file(repo, packed, layer_digest, layer_size)
            client.put_manifest(repo, ref.tag, body, MANIFEST_MEDIA)
    finally:
        packed.unlink(missing_ok=True)
    return Shipped(str(ref), "sha256:" + hashlib.sha256(body).hexdigest(), layer_size, unpacked, files,
                   round(time.monotonic() - t0, 2))


def _manifest_of(client, repo: str, ref) -> tuple[dict, str]:
    from ...registry_api import Unusable

    got = client.manifest(repo, ref.reference, accept=MANIFEST_MEDIA)
    if got is None:
        raise UserError(f"{ref}: no such snapshot in its registry (builder snapshot push puts one there)")
    body, media, digest = got
    try:
        doc = json.loads(body)
        config, layers = doc["config"], doc["layers"]
        ok = media.split(";")[0].strip() == MANIFEST_MEDIA and config["mediaType"] == KEY_MEDIA and \
            len(layers) == 1 and layers[0]["mediaType"] == LAYER_MEDIA and \
            all(isinstance(d.get("digest"), str) and isinstance(d.get("size"), int) for d in (config, layers[0]))
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise Unusable(f"{ref}: not a builder snapshot (its manifest is not {ARTIFACT} with one {LAYER_MEDIA} layer)",
                       "shape")
    return doc, digest


def pull(ref, out: Path, here_gpus: tuple[str, ...], here_driver: str, any_gpu: bool = False,
         say=lambda s: None) -> Shipped:
    """REF's snapshot into `out` (new, or an empty directory), judged before its layer is fetched: another GPU or
    driver than this host's is refused (`any_gpu` fetches it all the same, for another host), and a process-route
    snapshot only lands at the path it was taken at. The layer is checked against its digest as it streams into a
    temporary directory beside `out`, which becomes `out` only whole."""
    from ...registry_api import Unusable

    t0 = time.monotonic()
    client, repo = _client_and_repo(ref)
    with client:
        doc, digest = _manifest_of(client, repo, ref)
        config, layer = doc["config"], doc["layers"][0]
        key_bytes = client.blob(repo, config["digest"], limit=1 << 20)
        if "sha256:" + hashlib.sha256(key_bytes).hexdigest() != config["digest"]:
            raise Unusable(f"{ref}: its key blob is not the bytes of its digest {config['digest']}", "digest")
        snapshot = key_mod.parse(key_bytes, f"{ref}: its key")
        wrong = [] if any_gpu else [part for part, mine, here in (("GPUs", snapshot.gpus, here_gpus),
                                                                 ("driver", snapshot.driver, here_driver))
                                    if mine != here]
        if wrong:
            raise UserError(f"{ref}: taken on {' '.join(snapshot.gpus)} (driver {snapshot.driver}), here "
                            f"{' '.join(here_gpus)} (driver {here_driver}): its {' and '.join(wrong)} differ, so it "
                            "cannot restore here; nothing fetched (--any-gpu fetches it for another host)")
        taken_at = (doc.get("annotations") or {}).get(DIRECTORY, "")
        if route_of(snapshot) == "process" and taken_at and Path(taken_at) != out.resolve():
            raise UserError(f"{ref}: a snapshot of the process route restores only at the path it was taken at, "
                            f"{taken_at} (its processes' open files are named by it): pull it there; nothing fetched")
        # named before it is made, so that an interrupt at any point (even inside mkdir) finds it to remove
        tmp = out.parent / f".{out.name}.pull-{secrets.token_hex(6)}"
        try:
            tmp.mkdir()
            say(f"{ref}: the key holds here; fetching {layer['size']:,} bytes")
            files, unpacked = _fetch(client, repo, layer, tmp)
            if (tmp / key_mod.KEY).read_bytes() != key_bytes:
                raise Unusable(f"{ref}: the key in its layer is not its config's", "digest")
            read_record(tmp)
            if out.is_dir():
                out.rmdir()  # empty (checked by the caller): replaced by the whole snapshot at once
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Shipped(str(ref), digest, layer["size"], unpacked, files, round(time.monotonic() - t0, 2))


def _fetch(client, repo: str, layer: dict, into: Path) -> tuple[int, int]:
    """The layer streamed from the registry, hashed as read, decompressed and unpacked into `into`: only regular
    files and directories, under relative names a snapshot has; its digest and size checked at the end."""
    import zstandard

    from ...registry_api import Unusable

    from ... import net

    resp = client.open_blob(repo, layer["digest"])
    watchdog = getattr(resp, "deadline", None)
    if watchdog is not None:  # the request's deadline grows by what the layer may take at the slowest rate allowed
        watchdog.extend(net.transfer_seconds(layer["size"]))
    raw = _Counting(net.chunks(resp, f"the snapshot layer {layer['digest'][:19]}…", layer["size"]))
    files = unpacked = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK, read_across_frames=True,
                                                               closefd=False)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for m in tar:
                name = PurePosixPath(m.name)
                top = name.parts[0] if name.parts else ""
                if name.is_absolute() or ".." in name.parts or \
                        top not in (IMAGES, REMAPS, key_mod.KEY, RECORD, LOG) or \
                        not (m.isreg() or m.isdir()):
                    raise Unusable(f"its layer holds {m.name!r} ({'a link or device' if not (m.isreg() or m.isdir()) else 'outside a snapshot'}): "
                                   "not a builder snapshot", "shape")
                target = into.joinpath(*name.parts)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                with target.open("wb") as f:
                    shutil.copyfileobj(src, f, CHUNK)
                os.chmod(target, m.mode & 0o777)  # permission bits only: no set-id bit from a registry
                os.utime(target, (m.mtime, m.mtime))
                files += 1
                unpacked += m.size
            while reader.read(CHUNK):  # the tar's end padding, and anything after it, counts toward the digest
                pass
        while raw.read(CHUNK):
            pass
    except (zstandard.ZstdError, tarfile.TarError) as exc:
        raise Unusable(f"its layer does not unpack: {exc}", "shape") from None
    except (net.TooSlow, net.TooLarge, *net.NETWORK_ERRORS) as exc:
        raise Unusable(f"reading its layer: {exc}", "timeout" if isinstance(exc, net.TooSlow) else
                       "too-large" if isinstance(exc, net.TooLarge) else "unreachable") from None
    finally:
        resp.close()
    if raw.n != layer["size"] or "sha256:" + raw.sha.hexdigest() != layer["digest"]:
        raise Unusable(f"its layer's bytes ({raw.n:,}) are not those of its digest {layer['digest'][:19]}… "
                       f"({layer['size']:,} bytes)", "digest")
    return files, unpacked


class _Counting(io.RawIOBase):
    """A read-only stream over the blocks of a body, hashing and counting them as they are read."""

    def __init__(self, blocks):
        self.blocks, self.sha, self.n, self.buf = iter(blocks), hashlib.sha256(), 0, b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if not self.buf:
            self.buf = next(self.blocks, b"")
            self.sha.update(self.buf)
            self.n += len(self.buf)
        size = len(self.buf) if size is None or size < 0 else size
        out, self.buf = self.buf[:size], self.buf[size:]
        return out

    def readinto(self, buf) -> int:
        b = self.read(len(buf))
        buf[:len(b)] = b
        return len(b)


def check_out(out: Path) -> None:
    """OUT for a pull: new, or an empty directory, in a directory that exists."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory; a snapshot is pulled into a new one")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: {out.parent} is no directory to pull into")

