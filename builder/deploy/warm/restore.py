"""A warm layer restored on a host without Docker (scripts/gpu-host-run --restore): the layer's tar (as `builder
warm` packs it, builder/deploy/warm/layer.py) unpacked at the image's cache root, with the layer's own file times.
Refusals are UserErrors (one line, exit 2)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from ...errors import UserError


def layer_time(layer: Path) -> int:
    """The newest time of a warm layer's files: builder warm gives them all the cold image's SOURCE_DATE_EPOCH."""
    try:
        with tarfile.open(layer) as tar:
            return max((int(m.mtime) for m in tar.getmembers() if m.isfile()), default=0)
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"--restore {layer}: {exc}") from None


def restore(layer: Path, root: str) -> int:
    """Put a warm layer's files (its tar, gzip or not) at the image's cache root, which must be empty: members under
    the root only (its parent directories are skipped), no link, no device. Their times are the layer's own; how
    many files.

    Why the times matter: FlashInfer JIT-builds with ninja, which rebuilds an output older than one of its inputs
    and one newer than the time its deps log recorded for it. The layer's times (the cold image's
    SOURCE_DATE_EPOCH) are not older than any input in the image and older than the capture that recorded them;
    stamped with this moment instead, the H200's restored boot rebuilt fp8_blockscale_gemm_90 ("stored deps info
    out of date"). The venv's own files are set back to the layer's time for the same reason
    (builder/deploy/runtime/hostenv.py image_venv)."""
    rel = root.strip("/")
    target = Path(root)
    if target.is_dir() and any(target.rglob("*")):
        raise UserError(f"--restore: the cache root {root} is not empty (a fresh host has it empty)")
    try:
        with tarfile.open(layer) as tar:
            members = []
            for m in tar.getmembers():
                name = m.name.removeprefix("./").rstrip("/")
                if rel.startswith(name + "/") and m.isdir():
                    continue  # opt/, the root's parents
                if not (name == rel or name.startswith(rel + "/")) or not (m.isfile() or m.isdir()) \
                        or "/.wh." in "/" + name:
                    raise UserError(f"--restore {layer}: member {m.name!r} is not a file under {root}: not a warm layer")
                members.append(m)
            tar.extractall("/", members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"--restore {layer}: {exc}") from None
    files = sum(m.isfile() for m in members)
    print(f"restored {files} files of {layer.name} under {root}", flush=True)
    return files
