"""Where an image's bytes go: its OCI archive read layer by layer as a stream (builder/image/oci.py), each file
hashed as it passes, the final filesystem (whiteouts applied) summed per layer, per distribution (the RECORD files
of site-packages), per kind of content (CUDA libraries, bytecode, headers, tests, JIT caches, ...), with the files
shipped twice (the same bytes at two paths) and the device code the cell's archs never load: per-arch files of
other archs (named by arch, as FlashInfer's cubins are) and, inside each ELF's fatbin, the SASS/PTX entries no GPU
of the cell's archs would pick (builder/audit.py). What `benchmarks/image_bytes.py` prints.

`walk` is that one pass over the layers, the final filesystem it leaves: the SBOM (sbom.py) reads the image through
it too."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import posixpath
import re
import tarfile
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .. import archs as archs_mod
from .. import audit
from ..errors import UserError
from . import oci

CHUNK = 1 << 20
ELF_MAGIC = b"\x7fELF"
# a path that names one arch: sm_90, sm90a, sm100f, _90a_ (FlashInfer's cubins, DeepGEMM's and CUTLASS's per-arch files)
_ARCH_IN_PATH = re.compile(r"(?:^|[/_.-])sm_?(\d{2,3})([af]?)(?=$|[/_.-])")


@dataclass
class File:
    size: int
    sha256: str
    layer: int
    dead: int = 0  # bytes of device code no GPU of the cell's archs picks (fatbin entries)
    device: int = 0  # bytes of device code in all
    linked: bool = False  # a hard link to another path of the image: no bytes of its own
    entries: tuple[audit.FatbinEntry, ...] = ()  # its fatbin's entries (an ELF file with device code)
    sha1: str = ""  # of an ELF file with device code
    text: bytes | None = None  # its contents, when the walk was asked to keep them


@dataclass
class Layer:
    index: int
    created_by: str
    compressed: int
    media_type: str
    bytes: int = 0  # what the layer's tar holds (regular files)
    files: int = 0


@dataclass
class Sizes:
    digest: str
    archs: tuple[int, ...]
    layers: list[Layer]
    files: dict[str, File]
    owner: dict[str, str]  # path -> the distribution whose RECORD lists it
    cache_roots: tuple[str, ...]
    shadowed: int = 0  # bytes in a layer that a later layer replaced or deleted
    per_kind: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files.values() if not f.linked)

    @property
    def compressed(self) -> int:
        return sum(l.compressed for l in self.layers)


def kind_of(path: str, cache_roots: tuple[str, ...]) -> str:
    """The kind of content a path is, first match wins (what the size table sums)."""
    name = posixpath.basename(path)
    if any(path == r or path.startswith(r + "/") for r in cache_roots):
        return "JIT cache (prebuilt modules)"
    if name.endswith(".pyc"):
        return "Python bytecode"
    site = "/site-packages/" in path
    if site and re.search(r"/site-packages/nvidia/[^/]+/(bin|nvvm)/", path):
        return "JIT toolchain (nvcc, ptxas, nvvm)"
    if name.endswith((".h", ".hpp", ".cuh", ".hxx", ".inl", ".inc")):
        return "headers"
    if site and re.search(r"/site-packages/[^/]+/(.+/)?tests?/", path):
        return "tests"
    if name.endswith(".cubin"):
        return "cubins"
    if site and "/site-packages/nvidia/" in path:
        return "CUDA libraries (nvidia-* wheels)"
    if site and "/site-packages/torch/" in path:
        return "torch"
    if site:
        return "other Python packages"
    return "base OS and the rest"


def _chosen(entries: tuple[audit.FatbinEntry, ...], archs: tuple[int, ...]) -> set[tuple]:
    """The (kind, arch, variant) entries a GPU of one of `archs` picks: SASS that runs on it, the closest first,
    else PTX (audit.arch_is_covered's order)."""
    keys = set()
    for arch in archs:
        for kind in ("sass", "ptx"):
            fits = [e for e in entries if e.kind == kind and archs_mod.runs_on(e.kind, e.arch, e.variant, arch)]
            if fits:
                best = min(fits, key=lambda e: (e.arch != arch, -e.arch, {"": 0, "f": 1, "a": 2}.get(e.variant, 9)))
                keys.add((best.kind, best.arch, best.variant))
                break
    return keys


def device_code(entries: tuple[audit.FatbinEntry, ...], archs: tuple[int, ...]) -> tuple[int, int]:
    """(all device-code bytes, those no GPU of `archs` loads) of one ELF file's fatbin entries."""
    chosen = _chosen(entries, archs)
    return (sum(e.size for e in entries),
            sum(e.size for e in entries if (e.kind, e.arch, e.variant) not in chosen))


def record_paths(text: str, record_path: str) -> list[str]:
    """The image paths one RECORD file lists (paths in it are relative to its site-packages)."""
    site = posixpath.dirname(posixpath.dirname(record_path))
    return [posixpath.normpath(posixpath.join(site, row[0])) for row in csv.reader(io.StringIO(text)) if row and row[0]]


def distribution_of(dist_info: str) -> str:
    """"foo" of /…/site-packages/foo-1.0.dist-info."""
    return posixpath.basename(dist_info).removesuffix(".dist-info").rsplit("-", 1)[0]


def _apply_whiteout(files: dict[str, File], path: str) -> int:
    """Remove what a whiteout names (one path, or a directory's contents for an opaque one); the bytes removed."""
    parent, name = posixpath.split(path)
    gone = 0
    if name == ".wh..wh..opq":
        prefix = parent.rstrip("/") + "/"
        for p in [p for p in files if p.startswith(prefix)]:
            gone += files.pop(p).size
        return gone
    target = posixpath.join(parent, name[len(".wh."):])
    if target in files:
        gone += files.pop(target).size
    prefix = target + "/"
    for p in [p for p in files if p.startswith(prefix)]:
        gone += files.pop(p).size
    return gone


@dataclass
class Walk:
    """The image's final filesystem as one pass over its layers left it (whiteouts, overwrites and hard links
    applied), with each layer's figures."""

    image: oci.Image
    layers: list[Layer]
    files: dict[str, File]
    shadowed: int  # bytes in a layer that a later layer replaced or deleted


def _fatbin(spool: Path) -> tuple[audit.FatbinEntry, ...]:
    try:
        return tuple(audit.read_fatbin_entries(spool))
    except UserError:  # not an ELF this reader takes, or a fatbin it cannot decode: host code
        return ()


def walk(archive: Path, keep=lambda path: False, say=lambda line: None) -> Walk:
    """Read the archive's image once, layer by layer, in bounded memory: every regular file hashed as it passes,
    ELF files spooled to a temporary file to read their fatbins, and the contents of the files `keep(path)` asks
    for held (RECORD, METADATA, dpkg's status: small text)."""
    files: dict[str, File] = {}
    layers: list[Layer] = []
    shadowed = 0
    with oci.Archive(archive) as a, tempfile.TemporaryDirectory(prefix="builder-sizes-") as tmp:
        image = a.image()
        history = [h for h in image.config.get("history", []) if not h.get("empty_layer")]
        spool = Path(tmp) / "elf"
        for i, desc in enumerate(image.layers):
            made_by = (history[i].get("created_by", "") if i < len(history) else "").replace("\n", " ")
            layer = Layer(i, made_by, int(desc.get("size", 0)), desc.get("mediaType", ""))
            layers.append(layer)
            say(f"layer {i + 1}/{len(image.layers)}: {layer.compressed / 1e6:,.1f} MB compressed")
            with a.open_layer(desc) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                for m in tar:
                    path = "/" + m.name.lstrip("./").rstrip("/")
                    if posixpath.basename(path).startswith(".wh."):
                        shadowed += _apply_whiteout(files, path)
                        continue
                    if m.islnk():
                        target = "/" + m.linkname.lstrip("./")
                        if target in files:
                            old = files.get(path)
                            shadowed += old.size if old and not old.linked else 0
                            files[path] = dataclasses.replace(files[target], layer=i, linked=True)
                        continue
                    if not m.isreg():
                        if path in files and not m.isdir():
                            shadowed += files.pop(path).size
                        continue
                    digest, head, elf, elf_sha1 = hashlib.sha256(), b"", None, hashlib.sha1()
                    src = tar.extractfile(m)
                    text = [] if keep(path) else None
                    while True:
                        chunk = src.read(CHUNK)
                        if not chunk:
                            break
                        if not head:
                            head = chunk[:4]
                            if head == ELF_MAGIC and m.size > 4096:
                                elf = spool.open("wb")
                        digest.update(chunk)
                        if elf is not None:
                            elf.write(chunk)
                            elf_sha1.update(chunk)  # SPDX wants a file's SHA1 (builder/image/sbom.py)
                        if text is not None:
                            text.append(chunk)
                    entries: tuple[audit.FatbinEntry, ...] = ()
                    if elf is not None:
                        elf.close()
                        entries = _fatbin(spool)
                    old = files.get(path)
                    if old is not None and not old.linked:
                        shadowed += old.size
                    files[path] = File(m.size, digest.hexdigest(), i, entries=entries,
                                       sha1=elf_sha1.hexdigest() if entries else "",
                                       text=b"".join(text) if text is not None else None)
                    layer.bytes += m.size
                    layer.files += 1
                while stream.read(CHUNK):  # the rest of the blob: read whole, so its digest is checked
                    pass
    return Walk(image, layers, files, shadowed)


def measure(archive: Path, archs: tuple[int, ...], say=lambda line: None) -> Sizes:
    """Read the archive's image once (walk) and return where its bytes go."""
    walked = walk(archive, keep=lambda path: path.endswith(".dist-info/RECORD"), say=say)
    files = walked.files
    roots = []
    for env in (walked.image.config.get("config") or {}).get("Env") or []:
        name, _, value = env.partition("=")
        if ("CACHE" in name or "WORKSPACE" in name) and value.startswith("/") and ":" not in value:
            roots.append(value.rstrip("/"))
    # path -> distribution, of the RECORD files still in the image
    owner = {p: distribution_of(posixpath.dirname(record))
             for record, f in files.items() if f.text is not None
             for p in record_paths(f.text.decode("utf-8", "replace"), record)}
    for f in files.values():
        if f.entries and not f.linked:
            f.device, f.dead = device_code(f.entries, archs)
    sizes = Sizes(walked.image.digest, archs, walked.layers, files, owner, tuple(roots), walked.shadowed)
    per_kind: dict[str, int] = defaultdict(int)
    for path, f in files.items():
        if not f.linked:
            per_kind[kind_of(path, sizes.cache_roots)] += f.size
    sizes.per_kind = dict(per_kind)
    return sizes


def per_distribution(sizes: Sizes) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for path, f in sizes.files.items():
        if not f.linked:
            out[sizes.owner.get(path, "(no distribution)")] += f.size
    return dict(out)


def duplicates(sizes: Sizes) -> list[tuple[int, list[str]]]:
    """(bytes shipped more than once, the paths) per content that two or more paths hold, largest first."""
    by: dict[tuple[str, int], list[str]] = defaultdict(list)
    for path, f in sizes.files.items():
        if f.size and not f.linked:
            by[(f.sha256, f.size)].append(path)
    out = [(size * (len(paths) - 1), sorted(paths)) for (_, size), paths in by.items() if len(paths) > 1]
    return sorted(out, key=lambda t: -t[0])


def other_arch_files(sizes: Sizes) -> dict[str, int]:
    """Bytes of files whose path names an arch the cell does not have, per that arch (sm_100, sm_120a, ...);
    a path naming one of the cell's archs, or a family/arch variant of it, is not counted."""
    out: dict[str, int] = defaultdict(int)
    for path, f in sizes.files.items():
        if f.linked:
            continue
        found = _ARCH_IN_PATH.findall(posixpath.relpath(path, "/"))
        named = {int(n) for n, _ in found}
        if named and not named & set(sizes.archs):
            out["sm_" + "/".join(str(n) for n in sorted(named))] += f.size
    return dict(out)


def report(sizes: Sizes, top: int = 15) -> list[str]:
    gb = lambda n: f"{n / 1e6:10,.1f} MB"  # noqa: E731
    lines = [f"image {sizes.digest}: {gb(sizes.total)} in files, {gb(sizes.compressed)} compressed "
             f"({len(sizes.layers)} layers), archs {','.join(map(str, sizes.archs))}", "", "per layer:"]
    for l in sizes.layers:
        lines.append(f"  {l.index:>2} {gb(l.bytes)} {gb(l.compressed)} compressed {l.files:>7} files  "
                     f"{l.created_by[:90]}")
    lines += [f"  bytes a later layer replaced or deleted: {gb(sizes.shadowed)}", "", "per kind of content:"]
    for k, v in sorted(sizes.per_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {gb(v)}  {k}")
    lines += ["", f"per distribution (top {top}):"]
    for k, v in sorted(per_distribution(sizes).items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {gb(v)}  {k}")
    dups = duplicates(sizes)
    lines += ["", f"shipped twice: {gb(sum(d for d, _ in dups))} in {len(dups)} contents (top {min(top, len(dups))}):"]
    for d, paths in dups[:top]:
        lines.append(f"  {gb(d)}  {len(paths)}× {paths[0]}" + (f" = {paths[1]}" if len(paths) > 1 else ""))
    other = other_arch_files(sizes)
    lines += ["", f"files of other archs (by path): {gb(sum(other.values()))}"]
    for k, v in sorted(other.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {gb(v)}  {k}")
    dev = sum(f.device for f in sizes.files.values() if not f.linked)
    dead = [(f.dead, p) for p, f in sizes.files.items() if f.dead and not f.linked]
    lines += ["", f"device code in ELF fatbins: {gb(dev)}, of which no GPU of sm_"
              f"{'/'.join(map(str, sizes.archs))} loads {gb(sum(d for d, _ in dead))} (top {min(top, len(dead))}):"]
    for d, p in sorted(dead, reverse=True)[:top]:
        lines.append(f"  {gb(d)}  {p}")
    return lines


def to_json(sizes: Sizes) -> dict:
    dups = duplicates(sizes)
    return {"digest": sizes.digest, "archs": list(sizes.archs), "bytes": sizes.total, "compressed": sizes.compressed,
            "layers": [{"index": l.index, "created_by": l.created_by, "bytes": l.bytes, "compressed": l.compressed,
                        "files": l.files, "media_type": l.media_type} for l in sizes.layers],
            "shadowed": sizes.shadowed, "per_kind": sizes.per_kind, "per_distribution": per_distribution(sizes),
            "duplicates": {"bytes": sum(d for d, _ in dups), "contents": [{"bytes": d, "paths": p} for d, p in dups]},
            "other_arch_files": other_arch_files(sizes),
            "device_code": {"bytes": sum(f.device for f in sizes.files.values() if not f.linked),
                            "never_loaded": sum(f.dead for f in sizes.files.values() if not f.linked)}}
