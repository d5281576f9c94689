"""A warm layer restored on a host without Docker (scripts/gpu-host-run --restore): the layer's tar (as `builder
warm` packs it, builder/deploy/warm/layer.py) unpacked at the image's cache root, with the layer's own file times.
Refusals are UserErrors (one line, exit 2); a restore that fails part way leaves the root as empty as it found it."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from ...errors import UserError
from ...image import oci

# A member's time is a SOURCE_DATE_EPOCH: after 1970 and before 2200 (what os.utime and every file system take).
# Outside that, the layer was not made by `builder warm`.
LATEST_TIME = 7_258_118_400
# What a damaged layer raises while it is read: tar's own errors, the file system's, gzip's (a cut stream is an
# EOFError, a corrupt one zlib.error) and a header field tarfile cannot parse.
UNREADABLE = (tarfile.TarError, OSError, EOFError, zlib.error, ValueError, OverflowError)


def _said(exc: BaseException, limit: int) -> str:
    """An exception as one clipped line (tarfile's open error spans a line per method)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def _members(tar: tarfile.TarFile, layer: Path, root: str) -> list[tuple[tarfile.TarInfo, str]]:
    """(member, its path under the root) of every file and directory under the root; the root's parents are skipped.
    Anything else is refused: a name with '..' or '.' parts or a doubled slash (`opt/jit-cache/../../etc/x` starts
    with the root and is not under it), a link, a device, a FIFO, a whiteout, a time no epoch has."""
    rel = PurePosixPath(root.strip("/"))
    out = []
    for m in tar.getmembers():
        name = m.name.removeprefix("./").rstrip("/")
        parts = name.split("/")
        bad = (not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts)
               or not (m.isfile() or m.isdir()) or any(p.startswith(".wh.") for p in parts))
        path = PurePosixPath(name)
        if not bad and m.isdir() and path in rel.parents:
            continue  # opt/, the root's parents
        if bad or not (path == rel or rel in path.parents):
            raise UserError(f"--restore {layer}: member {m.name[:200]!r} is not a file under {root}: not a warm layer")
        if not 0 <= m.mtime <= LATEST_TIME:
            raise UserError(f"--restore {layer}: member {m.name[:200]!r} has the time {str(m.mtime)[:40]}, which no "
                            "SOURCE_DATE_EPOCH has: not a warm layer")
        out.append((m, str(path.relative_to(rel))))
    return out


@contextlib.contextmanager
def _open(layer: Path):
    """The layer's tar, whatever the warm image's layers are: gzip or uncompressed (tarfile reads them), or zstd
    (the default of builder's images, builder/image/oci.py), decompressed as a stream into a temporary file first."""
    with open(layer, "rb") as f:
        head = f.read(4)
    if head != oci.ZSTD_MAGIC:
        with tarfile.open(layer) as tar:
            yield tar
        return
    import zstandard

    with tempfile.TemporaryFile() as plain:
        with open(layer, "rb") as f:
            try:
                zstandard.ZstdDecompressor().copy_stream(f, plain, read_size=1 << 20, write_size=1 << 20)
            except zstandard.ZstdError as exc:  # a damaged stream: what tarfile says of a damaged gzip one
                raise tarfile.ReadError(f"zstd: {exc}") from None
        plain.seek(0)
        with tarfile.open(fileobj=plain) as tar:
            yield tar


def layer_time(layer: Path) -> int:
    """The newest time of a warm layer's files: builder warm gives them all the cold image's SOURCE_DATE_EPOCH."""
    try:
        with _open(layer) as tar:
            times = [int(m.mtime) for m in tar.getmembers() if m.isfile()]
    except UNREADABLE as exc:
        raise UserError(f"--restore {layer}: not a readable tar ({_said(exc, 200)})") from None
    if odd := [t for t in times if not 0 <= t <= LATEST_TIME]:
        raise UserError(f"--restore {layer}: a member has the time {str(odd[0])[:40]}, which no SOURCE_DATE_EPOCH has: "
                        "not a warm layer")
    return max(times, default=0)


def join(directory: Path) -> Path:
    """A layer that came in parts (layer.split: part-NN and SHA256SUMS, whose first line names the whole): the parts
    checked one by one, joined in the order of their numbers into <directory>/<the whole's name>, and that checked;
    its path. A part missing, damaged or of another layer is refused in one line, and nothing joined is left."""
    import re

    from ... import files

    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        raise UserError(f"--restore {directory}: a directory of a layer's parts holds SHA256SUMS (scripts/gpu-host-run "
                        "layer writes it)")
    lines = [ln.split("  ", 1) for ln in sums.read_text(errors="replace").splitlines()[:10000] if ln.strip()]
    if not lines or any(len(ln) != 2 or not re.fullmatch(r"[0-9a-f]{64}", ln[0]) for ln in lines):
        raise UserError(f"--restore {sums}: not '<sha256>  <name>' lines")
    (whole_sum, whole), parts = lines[0], lines[1:]
    names = [name for _, name in parts]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", whole) or \
            names != [f"part-{i:02d}" for i in range(len(names))] or not names:
        raise UserError(f"--restore {sums}: names no layer in parts part-00, part-01, ... (its first line the whole)")
    for digest, name in parts:
        if not (directory / name).is_file():
            raise UserError(f"--restore {directory}: {name} has not arrived (carry it, then stash)")
        if files.sha256_file(directory / name) != digest:
            raise UserError(f"--restore {directory}/{name}: its sha256 differs from SHA256SUMS (damaged, or a part of "
                            "another layer)")
    out = directory / whole
    with open(out, "wb") as dst:
        for _, name in parts:
            with open(directory / name, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    if files.sha256_file(out) != whole_sum:
        out.unlink()
        raise UserError(f"--restore {directory}: the joined {whole} differs from SHA256SUMS")
    return out


def _empty(target: Path) -> None:
    """The root as a fresh host has it: empty (what a failed restore wrote, removed)."""
    for p in target.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def restore(layer: Path, root: str) -> int:
    """Put a warm layer's files (its tar, gzip or not) at the image's cache root, which must be empty: members under
    the root only (its parent directories are skipped), no link, no device. Their times are the layer's own; how
    many files. The files are extracted into the root itself (tarfile's data filter with the root as its
    destination), so no name reaches outside it; on any failure (a damaged layer, a full disk) what was written is
    removed again.

    Why the times matter: FlashInfer JIT-builds with ninja, which rebuilds an output older than one of its inputs
    and one newer than the time its deps log recorded for it. The layer's times (the cold image's
    SOURCE_DATE_EPOCH) are not older than any input in the image and older than the capture that recorded them;
    stamped with this moment instead, the H200's restored boot rebuilt fp8_blockscale_gemm_90 ("stored deps info
    out of date"). The venv's own files are set back to the layer's time for the same reason
    (builder/deploy/runtime/hostenv.py image_venv)."""
    target = Path(root)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UserError(f"--restore: the cache root {root} is not a directory")
    if target.is_dir() and any(target.iterdir()):
        raise UserError(f"--restore: the cache root {root} is not empty (a fresh host has it empty)")
    made = not target.exists()
    try:
        with _open(layer) as tar:
            members = _members(tar, layer, root)
            target.mkdir(parents=True, exist_ok=True)
            for m, under in members:
                m.name = under  # relative to the root: extracted there, never above it
            try:
                tar.extractall(target, members=[m for m, under in members if under != "."], filter="data")
            except BaseException:
                _empty(target)
                if made:
                    target.rmdir()
                raise
    except UNREADABLE as exc:
        raise UserError(f"--restore {layer}: {_said(exc, 300)}; the cache root {root} is left "
                        "empty") from None
    files = sum(m.isfile() for m, _ in members)
    print(f"restored {files} files of {layer.name} under {root}", flush=True, file=sys.stderr)  # stdout: the verb's
    return files
