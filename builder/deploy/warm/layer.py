"""The warm layer: what an engine's first boot compiled under the image's cache root, shipped with the image.

A warm image is the cold image plus ONE layer holding exactly the captured files at the cache root (the paths the
caches' keys hold: vLLM's compile-cache hash and DeepGEMM's include path are absolute), built by BuildKit from a
generated Dockerfile (`FROM <image>@<digest>` + `COPY` of the captured tree) with SOURCE_DATE_EPOCH and
rewrite-timestamp, so the same files give the same layer, and the same files and labels the same digest. Its labels
say what it was warmed for (labels.WARM_FIELDS). A capture is a directory: `tree/` (the files, relative to the root)
and `warm.json` (the facts), made by `builder warm` on the GPU host or brought from another machine (`--from-dir`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ... import docker, files
from ...errors import UserError
from ...image import oci

TREE = "tree"
FACTS = "warm.json"


def tag_for(cold_tag: str, strategy: str, gpu: str) -> str:
    """<tag>-warm-<strategy>-<gpu>, lowercase, within a registry's 128 characters."""
    slug = lambda v: re.sub(r"[^a-z0-9.]+", "-", v.lower()).strip("-.") or "none"  # noqa: E731
    tag = f"{cold_tag}-warm-{slug(strategy)}-{slug(gpu)}"
    if len(tag) > 128:
        raise UserError(f"the warm tag {tag!r} is longer than the 128 characters a registry takes")
    return tag


def _walk(tree: Path) -> dict[str, os.stat_result]:
    """{path relative to the tree: its lstat} of every regular file, refused (one line) where a layer would hold
    anything but compiled files: a link, a special file, or a hard link to a file outside the tree, whose bytes are
    a host file's (/etc/shadow linked into a capture brought with --from-dir would be packed into the image). Two
    names of one file, both in the tree, are two files of the layer."""
    out, names = {}, {}
    for p in sorted(tree.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise UserError(f"{p}: not a regular file or directory; a warm layer holds compiled files only")
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(tree))] = st
            names[st.st_dev, st.st_ino] = names.get((st.st_dev, st.st_ino), 0) + 1
    for rel, st in out.items():
        if st.st_nlink > names[st.st_dev, st.st_ino]:
            raise UserError(f"{tree / rel}: a hard link to a file outside {tree} ({st.st_nlink} names, "
                            f"{names[st.st_dev, st.st_ino]} in it); a warm layer holds compiled files, never a host "
                            "file's bytes")
    return out


def file_list(tree: Path) -> dict[str, int]:
    """{path relative to the tree: size} of every regular file (what _walk refuses, refused)."""
    return {rel: st.st_size for rel, st in _walk(tree).items()}


def copy_tree(tree: Path, dest: Path) -> dict[str, int]:
    """The tree copied to `dest` (file_list's files and every directory), each file opened without following a link
    and checked to be the file that was walked, so a name swapped for a link after the check is not copied."""
    walked = _walk(tree)
    dest.mkdir(parents=True)
    for d in sorted(p for p in tree.rglob("*") if p.is_dir() and not p.is_symlink()):
        (dest / d.relative_to(tree)).mkdir()
    for rel, st in walked.items():
        with open(os.open(tree / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as src:
            now = os.fstat(src.fileno())
            if (now.st_dev, now.st_ino, now.st_nlink) != (st.st_dev, st.st_ino, st.st_nlink):
                raise UserError(f"{tree / rel}: changed while it was packed; pack the capture again")
            with open(dest / rel, "wb") as out:
                shutil.copyfileobj(src, out)
    return {rel: st.st_size for rel, st in walked.items()}


def tar_layer(tree: Path, root: str, dest: Path, epoch: int | None = None) -> tuple[dict[str, int], int]:
    """The capture's tree as a warm layer's tar (gzip) without Docker, for a host that has none: what `--restore`
    (restore.py) puts at the cache root of a fresh GPU host. Members `<root>/<path>` (the root's own directories
    first), each file opened without following links and checked to be the file that was walked (_walk's refusals:
    a link, a special file, a hard link out of the tree); every member's time is `epoch`, its owner 0 and its mode
    0644 / 0755; the gzip stream carries no name or time: the same tree gives the same bytes.

    `epoch` (default: the oldest captured file's time, in whole seconds) stands where the image route has the cold
    image's SOURCE_DATE_EPOCH: no later than anything the boot compiled (ninja's deps log recorded later times) and,
    on the host, not older than the toolkit's and torch's headers; `--restore` sets the venv's own files back to it.
    ({path: size}, the epoch)."""
    import gzip
    import tarfile

    if not root.startswith("/") or root.rstrip("/") == "":
        raise UserError(f"the cache root {root!r} is not an absolute directory")
    walked = _walk(tree)
    if not walked:
        raise UserError(f"{tree}: empty: the boot compiled nothing under the cache root, there is no warm layer to make")
    if epoch is None:
        epoch = int(min(st.st_mtime for st in walked.values()))
    from .restore import LATEST_TIME  # the times a restore takes

    if not 0 <= epoch <= LATEST_TIME:
        raise UserError(f"--epoch {epoch}: not a time a layer's files can have (0 to {LATEST_TIME})")
    base = root.strip("/")
    dirs = sorted({str(p) for rel in walked for p in Path(rel).parents if str(p) != "."})
    parts = base.split("/")

    def info(name: str, kind: bytes, size: int = 0) -> tarfile.TarInfo:
        t = tarfile.TarInfo(name)
        t.type, t.size, t.mtime, t.uid, t.gid, t.uname, t.gname = kind, size, epoch, 0, 0, "", ""
        t.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
        return t

    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(1, len(parts) + 1):  # opt/, opt/jit-cache/
            tar.addfile(info("/".join(parts[:i]), tarfile.DIRTYPE))
        for d in dirs:
            tar.addfile(info(f"{base}/{d}", tarfile.DIRTYPE))
        for rel, st in sorted(walked.items()):
            with open(os.open(tree / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as src:
                now = os.fstat(src.fileno())
                if (now.st_dev, now.st_ino, now.st_nlink, now.st_size) != (st.st_dev, st.st_ino, st.st_nlink, st.st_size):
                    raise UserError(f"{tree / rel}: changed while it was packed; pack the capture again")
                tar.addfile(info(f"{base}/{rel}", tarfile.REGTYPE, st.st_size), src)
    return {rel: st.st_size for rel, st in walked.items()}, epoch


def split(path: Path, out: Path, part_mib: int) -> list[Path]:
    """`path` cut into out/part-00, part-01, ... of at most `part_mib` MiB, with out/SHA256SUMS naming each part and
    the whole (as `path`'s name): what comes back from a GPU host call (files of 16 MiB at most) and travels to the
    next one, joined again by restore.join."""
    out.mkdir(parents=True, exist_ok=True)
    size, made = part_mib << 20, []
    lines = [f"{files.sha256_file(path)}  {path.name}"]
    with open(path, "rb") as src:
        while chunk := src.read(size):
            part = out / f"part-{len(made):02d}"
            part.write_bytes(chunk)
            made.append(part)
            lines.append(f"{files.sha256_file(part)}  {part.name}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return made


def read_capture(directory: Path) -> tuple[Path, dict]:
    """(tree, facts) of a capture directory, refused (one line) when it is not one."""
    tree, facts_file = directory / TREE, directory / FACTS
    if tree.is_symlink():  # its files would be another directory's: a host's, packed into the image
        raise UserError(f"{tree}: a symlink; a capture's {TREE}/ is a directory holding the compiled files themselves")
    if not tree.is_dir() or not facts_file.is_file():
        raise UserError(f"{directory}: not a warm capture (it needs {TREE}/ and {FACTS}, as `builder warm` writes them)")
    facts = files.load_json(facts_file, "warm capture's facts")  # a FIFO, 100,000 nested arrays: one line
    if not isinstance(facts, dict) or not isinstance(facts.get("cache_root"), str):
        raise UserError(f"{facts_file}: no cache_root: not a warm capture")
    if not file_list(tree):
        raise UserError(f"{tree}: empty: the boot compiled nothing under the cache root, there is no warm layer to make")
    return tree, facts


def read_facts(path: Path) -> dict:
    """A capture's warm.json alone (smoke --warm-key: what a restored layer was made for), refused in one line when
    it is not one: a JSON object with the capture's cache_root and a key builder warm wrote (or none, an older one)."""
    files.check_kind(path, "--warm-key", "file")
    facts = files.load_json(path, "warm capture's facts")
    if not isinstance(facts, dict) or not isinstance(facts.get("cache_root"), str):
        raise UserError(f"--warm-key {path}: no cache_root: not a warm capture's {FACTS}")
    if not all(isinstance(k, str) and isinstance(v, (str, int, float, bool, type(None), dict, list))
               for k, v in facts.items()):
        raise UserError(f"--warm-key {path}: not a warm capture's {FACTS}")
    return facts


def write_capture(directory: Path, facts: dict) -> None:
    (directory / FACTS).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")


def image_epoch(image: str) -> str:
    """The cold image's creation time as SOURCE_DATE_EPOCH: the warm image is as old as its content."""
    _, out, _ = docker.probe(["docker", "image", "inspect", "--format", "{{.Created}}", image], timeout=60)
    try:
        return str(int(datetime.fromisoformat(re.sub(r"\.\d+", "", out.strip())).timestamp()))
    except ValueError:  # not 0: the layer's files must not be older than the image's (pack says why)
        raise UserError(f"{image}: its creation time {out.strip()!r} is not a date: the warm layer's file times are "
                        "taken from it") from None


def dockerfile(base: str, root: str, labels: list[tuple[str, str]]) -> str:
    lines = [f"FROM {base}", f"COPY {TREE}/ {root}/"]
    lines += [f"LABEL {k}={json.dumps(v)}" for k, v in labels]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Packed:
    archive: Path
    digest: str  # the warm image's manifest digest
    layer: str  # the warm layer's digest
    files: dict[str, int]


def pack(tree: Path, root: str, base: str, labels: list[tuple[str, str]], work: Path, name: str,
         epoch: str, builder: str | None = None, compression: str = "zstd") -> Packed:
    """Build the warm image FROM `base` (an image by digest that the daemon holds) with `tree` at `root` as one
    layer, into an OCI archive under `work` named `name`. Nothing is loaded or tagged here (`load` does that)."""
    if not root.startswith("/"):
        raise UserError(f"the cache root {root!r} is not an absolute path")
    work.mkdir(parents=True, exist_ok=True)
    context = work / "context"
    if context.exists():
        shutil.rmtree(context)
    copied = copy_tree(tree, context / TREE)
    # The files' own times and modes are not part of it: in the layer every one has the cold image's
    # SOURCE_DATE_EPOCH, which is not older than any file of the cold image. That order is what a ninja-built JIT
    # cache needs: ninja rebuilds an output older than one of its inputs, and with time 0 FlashInfer rebuilt its
    # fp8_blockscale_gemm_90 module at the restored first boot on the H200 (155-167 s, where the same caches in place
    # booted in 52-56 s: docs/evidence/2026-12-02-h200-warm-layer.md). The context's files get this moment, later
    # than the epoch, and BuildKit's rewrite-timestamp clamps them to it: a time fixed here would make BuildKit,
    # which sends a context file again only when its size, mode or time changed, pack another capture's bytes of the
    # same sizes (tests/docker/deploy/test_warm.py).
    now = max(time.time_ns(), (int(epoch) + 1) * 10**9)
    for p in [context / TREE, *(context / TREE).rglob("*")]:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)  # any user the container runs as writes the caches
        os.utime(p, ns=(now, now), follow_symlinks=False)
    (work / "Dockerfile").write_text(dockerfile(base, root, labels))
    archive = work / "warm.oci.tar"
    # the new layer compressed as asked; the cold image's layers are kept as they are (no force-compression), so a
    # node that holds the cold image pulls the warm layer alone
    output = docker.csv_options(type="oci", dest=archive, name=name, **{"rewrite-timestamp": "true"},
                                **oci.export_options(compression, force=False))
    call = docker.BuildxCall(dockerfile=work / "Dockerfile", context=context, target="", output=output,
                             build_args=(("SOURCE_DATE_EPOCH", epoch),), builder=builder, attest=())
    argv = [a for a in call.argv() if a not in ("--target", "")]
    docker.run(argv, timeout=1800, env={**os.environ, "SOURCE_DATE_EPOCH": epoch})
    with oci.Archive(archive) as a:
        image = a.image()
    return Packed(archive, image.digest, image.layers[-1]["digest"], copied)


def load(packed: Packed, name: str) -> None:
    """The packed archive into the local daemon, and the name NAME moved to it."""
    docker.load_archive(packed.archive)
    docker.point_tag(name, packed.digest)
