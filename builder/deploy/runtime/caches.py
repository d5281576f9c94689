"""The engine's compile caches at a boot: where they go (one `CacheSetting`, made here and nowhere else) and what a
boot wrote there (the cache watch).

The setting is the cache root, the variables that point each of the engine's compile caches under it, the globs a
boot from a warm layer may still write there, and where it came from: an image's labels (`of_image`: its own root
and variables, io.builder.cache-*), or a cell's engine data for the process route (`of_cell`: the cell's
compile_caches under its root, or under --cache-root). It is a value: a caller puts it into its options
(`SmokeOptions(caches=...)`, `dataclasses.replace`); nothing here fills an options object.

The watch: what a container added or changed under the root (its `docker diff`, the root copied out with `docker
cp`, a file of the image saved again with the same bytes left out) or what a process changed under this host's
directory (by content), and the paths a container wrote outside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ...image import labels as labels_mod

if TYPE_CHECKING:
    import tarfile

# where a setting came from
LABELS = "labels"  # the image's own (io.builder.cache-root, io.builder.cache-env, io.builder.warm-allowance)
CELL = "cell"  # the cell's engine data (compile_caches under jit_cache_root)
FLAG = "--cache-root"  # the cell's engine data under the directory --cache-root names


@dataclass(frozen=True)
class CacheSetting:
    """Where a boot's compile caches go. `root` "": no cache root (nothing set, nothing watched). `variables`:
    (variable, directory) of each cache, set in the engine's environment (an image's ENV sets the same).
    `allowance` not None: a boot from a warm layer, which fails when it writes anything under the root beyond
    these globs. `source`: LABELS, CELL or FLAG ("" for no setting)."""

    root: str = ""
    variables: tuple[tuple[str, str], ...] = ()
    allowance: tuple[str, ...] | None = None
    source: str = ""
    # what the warm layer was made for (an image's io.builder.warm.* labels as labels.warm reads them, or a capture's
    # warm.json), its key among them: what the judge (deploy/runtime/warmjudge.py) holds the boot against before it starts;
    # () where none is known
    warm_facts: tuple[tuple[str, object], ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """{variable: directory}: what the engine's environment gets."""
        return dict(self.variables)

    @property
    def warm(self) -> bool:
        """A boot from a warm layer (an image that has one, or --expect-warm): it may write only the allowance."""
        return self.allowance is not None

    def warm_boot(self, globs: tuple[str, ...]) -> "CacheSetting":
        """The same root and variables for a boot from a warm layer restored there, which may write only `globs`."""
        return dataclasses.replace(self, allowance=tuple(globs))


NONE = CacheSetting()


def of_image(labels: dict[str, str], given: CacheSetting = NONE) -> CacheSetting:
    """An image's own setting, from its labels: its root and variables, and for an image with a warm layer its
    allowance. What `given` already holds wins: its root (with its variables), its allowance."""
    root = labels_mod.cache_root(labels)
    base = given if given.root or not root else CacheSetting(root, tuple(labels_mod.cache_env(labels).items()),
                                                             given.allowance, LABELS)
    if base.allowance is None and labels_mod.warm(labels):
        base = base.warm_boot(tuple(labels_mod.warm_allowance(labels)))
    if labels_mod.warm(labels) and not base.warm_facts and not labels_mod.warm_problem(labels):
        base = dataclasses.replace(base, warm_facts=tuple(sorted(labels_mod.warm(labels).items())))
    return base


def of_cell(cell, cache_root: str | None = None) -> CacheSetting:
    """The process route's setting: a cell's (resolve.Cell) compile caches (engine data compile_caches) at the same
    paths as in its image, under `cache_root` (--cache-root) when given, else under the image's own root
    (jit_cache_root). NONE for a cell whose engine data gives it no compile caches."""
    if not cell.cache_root:
        return NONE
    root = (cache_root or cell.cache_root).rstrip("/") or "/"
    return CacheSetting(root, tuple((k, root + v[len(cell.cache_root):]) for k, v in cell.compile_caches),
                        source=FLAG if cache_root else CELL)


@dataclass
class Written:
    """What an engine run wrote: under the cache root (path relative to it -> size) and outside it (a container's
    diff; a process's writes outside the root are not watched: None)."""

    root: str
    files: dict[str, int]
    outside: list[str] | None = None
    held_before: int | None = None  # the files under the root when the run began (None: not counted)

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@contextlib.contextmanager
def _root_tar(container, root: str) -> Iterator["tarfile.TarFile | None"]:
    """`docker cp` of `root` out of the container (spooled to a temporary file) as an open tar; None when the
    container has no such path."""
    import tarfile
    import tempfile

    try:
        stream, _ = container.get_archive(root)
    except Exception:  # noqa: BLE001 - docker.errors.NotFound: the run made no root at all
        yield None
        return
    with tempfile.TemporaryFile() as buf:
        for chunk in stream:
            buf.write(chunk)
        buf.seek(0)
        with tarfile.open(fileobj=buf) as tar:
            yield tar


def container_written(container, root: str, dest: Path | None, mounts: tuple[str, ...] = ()) -> Written:
    """The files the container added or changed under `root` (`docker diff` kinds 0 and 1, regular files of
    `docker cp` of the root; a file of the image written again with the same bytes left out) and the paths it wrote
    elsewhere (its ancestors and the mount points left out)."""
    from ...files import sha256_stream

    diff = container.diff() or []
    changed = {c["Path"] for c in diff if c.get("Kind") in (0, 1)}  # 0 changed, 1 added (2 deleted)
    added = {c["Path"] for c in diff if c.get("Kind") == 1}
    root = root.rstrip("/")
    keep = set(mounts) | {root}
    outside = sorted(p for p in changed if not _under(p, root)
                     and not any(_under(k, p) for k in keep) and not any(_under(p, m) for m in mounts))
    files: dict[str, int] = {}
    held = 0  # files under the root that the run did not add: the image's own (a warm layer, prebuilt JIT)
    with _root_tar(container, root) as tar:
        if tar is None:
            return Written(root, files, outside, 0)
        members = {}
        for member in tar:
            rel = member.name.partition("/")[2]
            if not rel or not member.isfile():
                continue
            held += f"{root}/{rel}" not in added
            if f"{root}/{rel}" in changed:
                members[rel] = member
        # a file the image had, saved again with the same bytes (a cache hit that re-saves its entry: Inductor's
        # autotune results, AOT-autograd entries on the H200) is not a compile: compared with the image's copy
        again = [rel for rel in members if f"{root}/{rel}" not in added]
        if again:
            theirs = _image_sha256(container, root, set(again))
            for rel in again:
                with tar.extractfile(members[rel]) as src:
                    if theirs.get(rel) == sha256_stream(src):
                        del members[rel]
        for rel, member in members.items():
            files[rel] = member.size
            if dest is not None:
                target = Path(dest) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, member.mode & 0o777)
    return Written(root, files, outside, held)


def _image_sha256(container, root: str, wanted: set[str]) -> dict[str, str]:
    """{path relative to root: sha256} of the `wanted` files as the container's image holds them, read from a
    container of the image that is created and never started."""
    from ...files import sha256_stream

    probe = container.client.containers.create(container.attrs["Image"], labels={"io.builder.smoke": "1"})
    out = {}
    try:
        with _root_tar(probe, root) as tar:
            for member in tar or ():
                rel = member.name.partition("/")[2]
                if rel in wanted and member.isfile():
                    with tar.extractfile(member) as src:
                        out[rel] = sha256_stream(src)
    finally:
        probe.remove(force=True)
    return out


def snapshot(root: str) -> dict[str, tuple[int, str]]:
    """{path relative to root: (size, sha256)} of every file under a host directory (empty when it is absent): by
    content, so a cache entry an engine writes again with the same bytes (a hit that re-saves or touches it) is not
    taken for a compile."""
    from ...files import sha256_file

    out = {}
    base = Path(root)
    if base.is_dir():
        for p in base.rglob("*"):
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(base))] = (p.stat().st_size, sha256_file(p))
    return out


def process_written(root: str, before: dict[str, tuple[int, str]], dest: Path | None) -> Written:
    """The files a process added or changed (their content) under the host directory `root` since `before`, copied
    to `dest`."""
    after = snapshot(root)
    files = {rel: st[0] for rel, st in after.items() if before.get(rel) != st}
    if dest is not None:
        for rel in files:
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(root) / rel, target)
    return Written(root, files, None, len(before))
