"""OCI image archives (what `docker buildx build --output type=oci,dest=FILE` writes): the image digest, its
layers, and — when two builds of the same cell differ — which files differ in which layer.

Pure Python (tarfile, gzip, zstandard, json): `builder verify-repro` and the publish step read archives without
Docker. Layers are read as streams (gzip, zstd or uncompressed, told by their first bytes), verified against their
digest as they are read: a multi-GB layer of a real engine image costs a few MiB of memory, not its size.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20
# What the image exporter writes (BuildKit's OCI exporter options; the OCI exporter writes OCI media types anyway).
# The level: BuildKit maps zstd's compression-level to four encoders of klauspost/compress (<3 fastest, <7 default,
# <9 better, else best); level 3, its default, is the one benchmarks/layer_compression.py chose on a real torch + CUDA
# image (docs/evidence/2026-12-05-zstd-layers.md: 7.4 % smaller than gzip, 8x faster to compress; levels 7 and 9 save
# 3-5 % more for 2.4-3.2x the time), and gzip's default is 6. Both are BuildKit's defaults, so the exporter is not
# told a level (the command lines stay short); LEVELS says which they are (the content key holds them).
# force-compression recompresses the layers taken from a base image too, so every layer of the image is of one kind.
LEVELS = {"zstd": 3, "gzip": 6}


def export_options(compression: str, force: bool = True) -> dict[str, str]:
    if compression not in LEVELS:
        raise UserError(f"layer compression {compression!r}: zstd or gzip")
    return {"compression": compression, **({"force-compression": "true"} if force else {})}


INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
ATTESTATION_TYPE = "attestation-manifest"  # vnd.docker.reference.type of BuildKit's attestation manifests


@dataclass(frozen=True)
class Entry:
    """One file of a layer, as far as reproducibility goes."""

    path: str
    kind: str  # file | dir | symlink | hardlink | other
    mode: int
    uid: int
    gid: int
    mtime: int
    size: int
    sha256: str  # of the contents (files), the link target (links), "" otherwise
    xattrs: tuple[tuple[str, str], ...] = ()

    def differences(self, other: "Entry") -> list[str]:
        out = []
        for what in ("kind", "mode", "uid", "gid", "mtime", "size", "sha256", "xattrs"):
            a, b = getattr(self, what), getattr(other, what)
            if a != b:
                shown = (f"{a:o} → {b:o}" if what == "mode" else
                         f"{str(a)[:12]} → {str(b)[:12]}" if what == "sha256" else f"{a} → {b}")
                out.append(f"{what} {shown}")
        return out


@dataclass(frozen=True)
class Image:
    """One image of an archive: its top digest (what a registry serves under the tag), the platform manifest
    digest, the config and the layer descriptors in order."""

    digest: str  # the archive's top-level descriptor: an index when attestations are attached
    manifest_digest: str  # the image manifest itself
    config: dict
    layers: tuple[dict, ...]
    attestations: tuple[str, ...] = ()  # digests of attestation manifests (provenance, SBOM)
    # the descriptors ({mediaType, digest, size}) of the top and of the platform manifest: what an attestation's
    # subject names (builder/image/attest.py)
    descriptor: dict = field(default_factory=dict, compare=False)
    manifest_descriptor: dict = field(default_factory=dict, compare=False)


class Archive:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._tar = tarfile.open(self.path)
        except (OSError, tarfile.TarError) as exc:
            raise UserError(f"{self.path}: not a readable OCI archive ({exc})") from None
        self._names = {m.name.lstrip("./"): m for m in self._tar.getmembers()}

    def close(self) -> None:
        self._tar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _open(self, name: str):
        member = self._names.get(name)
        if member is None:
            raise UserError(f"{self.path}: no {name} in the OCI archive")
        fh = self._tar.extractfile(member)
        if fh is None:
            raise UserError(f"{self.path}: {name} is not a file")
        return fh

    def read(self, name: str) -> bytes:
        return self._open(name).read()

    def blob(self, digest: str) -> bytes:
        algo, _, hexpart = digest.partition(":")
        data = self.read(f"blobs/{algo}/{hexpart}")
        if algo == "sha256" and hashlib.sha256(data).hexdigest() != hexpart:
            raise UserError(f"{self.path}: blob {digest[:19]}… does not match its digest")
        return data

    def open_blob(self, digest: str) -> io.BufferedReader:
        """The blob as a stream, its sha256 checked when the stream ends (a short or altered blob raises there)."""
        algo, _, hexpart = digest.partition(":")
        fh = self._open(f"blobs/{algo}/{hexpart}")
        return io.BufferedReader(_Verified(fh, hexpart if algo == "sha256" else "", f"{self.path}: blob {digest[:19]}…"),
                                 CHUNK)

    def open_layer(self, descriptor: dict):
        """A layer's tar stream: decompressed as it is read (gzip, zstd, or none), its blob verified at the end."""
        return decompressed(self.open_blob(descriptor["digest"]))

    def json_blob(self, digest: str) -> dict:
        return json.loads(self.blob(digest))

    def image(self) -> Image:
        """The one image of the archive (BuildKit's OCI exporter writes exactly one top descriptor)."""
        index = json.loads(self.read("index.json"))
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise UserError(f"{self.path}: expected one image in index.json, found {len(manifests)}")
        top = manifests[0]
        digest = top["digest"]
        platform, attestations = top, []
        if top.get("mediaType") in INDEX_TYPES:
            inner = self.json_blob(digest)
            images = []
            for d in inner.get("manifests", []):
                if (d.get("annotations") or {}).get("vnd.docker.reference.type") == ATTESTATION_TYPE:
                    attestations.append(d["digest"])
                else:
                    images.append(d)
            if len(images) != 1:
                raise UserError(f"{self.path}: expected one platform image in the index, found {len(images)}")
            platform = images[0]
        manifest = self.json_blob(platform["digest"])
        return Image(digest=digest, manifest_digest=platform["digest"],
                     config=self.json_blob(manifest["config"]["digest"]), layers=tuple(manifest.get("layers", [])),
                     attestations=tuple(attestations), descriptor=_descriptor(top), manifest_descriptor=_descriptor(platform))

    def layer_entries(self, descriptor: dict) -> dict[str, Entry]:
        with self.open_layer(descriptor) as stream:
            try:
                entries = entries_of_stream(stream)
                while stream.read(CHUNK):  # tar's end blocks and padding: the whole blob is read, so it is verified
                    pass
            except (OSError, EOFError, tarfile.TarError, ValueError) as exc:
                if isinstance(exc, UserError):
                    raise
                raise UserError(f"{self.path}: layer {descriptor['digest'][:19]}… cannot be read "
                                f"({type(exc).__name__}: {exc})") from None
        return entries


def _descriptor(d: dict) -> dict:
    return {"mediaType": d.get("mediaType", ""), "digest": d["digest"], "size": d.get("size", 0)}


class _Verified(io.RawIOBase):
    """A member's bytes as they are read, hashed; at the end the sha256 must be the digest's."""

    def __init__(self, fh, sha256: str, what: str):
        self._fh, self._want, self._what, self._hash, self._done = fh, sha256, what, hashlib.sha256(), False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._fh.read(len(buffer))
        if not data:
            if not self._done and self._want and self._hash.hexdigest() != self._want:
                raise UserError(f"{self._what} does not match its digest")
            self._done = True
            return 0
        self._hash.update(data)
        buffer[:len(data)] = data
        return len(data)


def decompressed(stream: io.BufferedReader):
    """`stream` decompressed as read: gzip or zstd by its magic bytes, else as it is (an uncompressed tar)."""
    head = stream.peek(4)[:4]
    if head[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if head == ZSTD_MAGIC:
        import zstandard

        # read_across_frames: BuildKit may write a layer as several frames; closefd closes the blob with it
        return zstandard.ZstdDecompressor().stream_reader(stream, read_size=CHUNK, read_across_frames=True,
                                                          closefd=True)
    return stream


def entries_of(layer_tar: bytes) -> dict[str, Entry]:
    return entries_of_stream(io.BytesIO(layer_tar))


def entries_of_stream(stream) -> dict[str, Entry]:
    """Every entry of a layer tar read from `stream` front to back (tar's stream mode: one pass, a file's contents
    hashed in chunks, never held whole)."""
    out: dict[str, Entry] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            if m.isreg():
                fh, h = tar.extractfile(m), hashlib.sha256()
                for chunk in iter(lambda: fh.read(CHUNK), b""):
                    h.update(chunk)
                kind, digest = "file", h.hexdigest()
            elif m.issym() or m.islnk():
                kind, digest = ("symlink" if m.issym() else "hardlink"), hashlib.sha256(m.linkname.encode()).hexdigest()
            elif m.isdir():
                kind, digest = "dir", ""
            else:
                kind, digest = "other", ""
            xattrs = tuple(sorted((k, v) for k, v in (m.pax_headers or {}).items() if k.startswith("SCHILY.xattr.")))
            path = "/" + m.name.lstrip("./").rstrip("/")
            out[path] = Entry(path, kind, m.mode, m.uid, m.gid, int(m.mtime), m.size, digest, xattrs)
    return out


def write_archive(path: Path, config: dict | bytes, layers: list[tuple[str, bytes | Path]]) -> tuple[str, list[dict]]:
    """Write an OCI archive of one image: its `config` (a dict, or another image's config blob as it is), and its `layers` as (media type, blob) with the blob given as
    bytes or as a file that is streamed in (never read whole). Returns the manifest's digest (what the archive's
    index names) and the layers' descriptors. Builds never call this (BuildKit writes their archives); tests and
    benchmarks make images with it."""
    def sha256_of(blob: bytes | Path) -> str:
        h = hashlib.sha256()
        if isinstance(blob, bytes):
            h.update(blob)
        else:
            with blob.open("rb") as f:
                for chunk in iter(lambda: f.read(CHUNK), b""):
                    h.update(chunk)
        return f"sha256:{h.hexdigest()}"

    blobs: dict[str, bytes | Path] = {}
    descriptors = []
    for media, blob in layers:
        digest = sha256_of(blob)
        blobs[digest] = blob
        descriptors.append({"mediaType": media, "digest": digest,
                            "size": len(blob) if isinstance(blob, bytes) else blob.stat().st_size})
    config_bytes = config if isinstance(config, bytes) else json.dumps(config).encode()
    config_digest = sha256_of(config_bytes)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": config_digest, "size": len(config_bytes)},
                           "layers": descriptors}).encode()
    top = sha256_of(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                            "digest": top, "size": len(manifest)}]}).encode()
    with tarfile.open(path, "w") as tar:
        for name, blob in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                           (f"blobs/sha256/{config_digest[7:]}", config_bytes), (f"blobs/sha256/{top[7:]}", manifest),
                           *((f"blobs/sha256/{d[7:]}", b) for d, b in blobs.items())]:
            if isinstance(blob, bytes):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
            else:
                tar.add(blob, arcname=name)
    return top, descriptors


def digest_of(path: Path) -> str:
    """The top digest of an OCI archive (the digest a registry serves after a digest-preserving copy)."""
    with Archive(path) as a:
        return a.image().digest


def _layer_name(i: int, history: list[dict]) -> str:
    """"layer 3 (RUN apt-get update ...)" — the Dockerfile step that made layer i, from the config history."""
    made = [h for h in history if not h.get("empty_layer")]
    step = made[i].get("created_by", "") if i < len(made) else ""
    step = step.replace("/bin/sh -c ", "").replace("|", " ").strip()
    return f"layer {i + 1}" + (f" ({step[:90]}{'…' if len(step) > 90 else ''})" if step else "")


def diff(a_path: Path, b_path: Path, limit: int = 40) -> list[str]:
    """Human-readable differences between two archives of the same build: the config fields that differ,
    then per layer the files that were added, removed or changed (and how). Empty when they are equal."""
    out: list[str] = []
    with Archive(a_path) as a, Archive(b_path) as b:
        ia, ib = a.image(), b.image()
        if ia.digest == ib.digest:
            return []
        ca = {k: v for k, v in ia.config.items() if k != "rootfs"}
        cb = {k: v for k, v in ib.config.items() if k != "rootfs"}
        for key in sorted(set(ca) | set(cb)):
            if ca.get(key) != cb.get(key):
                out.append(f"config: {key} differs")
        if len(ia.attestations) or len(ib.attestations):
            out.append(f"attestations: {len(ia.attestations)} vs {len(ib.attestations)} manifests (provenance holds "
                       "build times: an attested index is never bit-for-bit reproducible)")
        history = ia.config.get("history", [])
        if len(ia.layers) != len(ib.layers):
            out.append(f"layers: {len(ia.layers)} vs {len(ib.layers)}")
        for i, (la, lb) in enumerate(zip(ia.layers, ib.layers)):
            if la["digest"] == lb["digest"]:
                continue
            ea, eb = a.layer_entries(la), b.layer_entries(lb)
            lines = []
            for path in sorted(set(ea) | set(eb)):
                if path not in eb:
                    lines.append(f"  - {path} (only in the first build)")
                elif path not in ea:
                    lines.append(f"  + {path} (only in the second build)")
                else:
                    why = ea[path].differences(eb[path])
                    if why:
                        lines.append(f"  ~ {path}: {', '.join(why)}")
            head = f"{_layer_name(i, history)}: {la['digest'][:19]}… vs {lb['digest'][:19]}…"
            if not lines:
                lines = ["  (same files, different tar encoding: order or headers)"]
            out.append(f"{head}, {len(lines)} file(s) differ")
            out += lines[:limit] + ([f"  … and {len(lines) - limit} more"] if len(lines) > limit else [])
    return out
