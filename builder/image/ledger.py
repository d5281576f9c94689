"""The image ledger: which image digests builder itself produced for a content key (steps/image.py), so that an
unchanged cell reuses only an image builder built, never one that merely carries the key's label.

A label is inherited: an image built `FROM` the cell's image plus one more layer, or any image given a copied
`io.builder.content-key` label, carries the key too. The digest cannot be copied: it is the sha256 of the
image's manifest (or index), which covers its config (labels included) and every layer. In the containerd image
store that digest is the image's id (`docker image inspect {{.Id}}`); it stays the same under `docker tag` and
`docker load`, and it is the digest a registry serves for the pushed image (publish pushes the OCI archive as
it is and checks that). So one digest binds the local image and its registry copies alike; the config digest
(the classic store's id) would not match the registry's.

Where: <wheelhouse>/.images/<content key>.json, next to the wheels the image installs (it survives between runs
as they do, and a fresh wheelhouse starts a fresh ledger). One file per key, written to a temporary file and
renamed into place under a lock (two builds of one cell record at the same moment without losing either), read
through schema.LEDGER_ENTRY. An entry that does not read or does not fit the shape is ignored with one line, so
the image is built and the entry written again:

  {"format": 1, "content_key": K,
   "images": {"sha256:...": {"cell": ID, "recorded": UTC time}},   every digest builder produced for K
   "published": {"REPO:TAG": "sha256:..."}}                          where publish pushed which of them

An image this host did not build but pulled from a registry (builder/image/reuse.py) is recorded only when the
registry's ledger record was signed by the key the matrix names, and then apart from what builder built here: its
image entry says who vouched, {"cell", "recorded", "vouched_by": "ledger record REF, signed by key K"}, and a later
reuse says so. A digest built here is never demoted to a vouched one. A record taken on the registry's unsigned
word is never written here.

A digest is vouched for when it is in `images`: the local reuse checks the image under the cell's tag, and a
registry-side reuse must check the registry's manifest digest for the tag the same way (`vouches`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import files, schema
from ..errors import UserError

DIR_NAME = ".images"  # under the wheelhouse
FORMAT = 1
MAX_BYTES = 1 << 20  # an entry is a few hundred bytes; anything near this is not one of builder's
KEEP = 16  # digests kept per key (a key rebuilt with --no-cache may give another digest; newest kept)
LOCK_NAME = ".lock"
_PART = re.compile(r"\.[0-9a-f]{12}-[a-z0-9_]{8}\.part")  # _update's mkstemp


def ledger_dir(wheelhouse_root: Path) -> Path:
    return Path(wheelhouse_root) / DIR_NAME


def check_dir(path: Path) -> None:
    """Refuse (UserError) a ledger place that is not a real directory: a file, a FIFO or a symlink where builder
    keeps its records is not builder's (a missing one is created on the first record)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserError(f"--wheelhouse: {path}: cannot use builder's image ledger there: "
                        f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "a file" if stat.S_ISREG(st.st_mode) else "not a directory"
        raise UserError(f"--wheelhouse: {path} is {what}; builder keeps its image ledger there in a directory of "
                        "its own (move it away)")


@dataclass
class Entry:
    key: str
    images: dict[str, dict] = field(default_factory=dict)  # digest → {"cell", "recorded"}
    published: dict[str, str] = field(default_factory=dict)  # REPO:TAG → digest

    def to_json(self) -> dict:
        out = {"format": FORMAT, "content_key": self.key, "images": self.images}
        if self.published:
            out["published"] = self.published
        return out


class Ledger:
    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    # -- reading --------------------------------------------------------------------------------------------
    def read(self, key: str) -> tuple[Entry | None, str]:
        """(the entry for `key`, "") or (None, "") when builder recorded nothing for it, or (None, why) when the
        file there is not a readable entry for that key."""
        path = self.path(key)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            return None, f"{path}: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return None, f"{path} is not a regular file"
        try:
            raw = files.read_regular(path, MAX_BYTES)  # a FIFO put there after the look above: refused, not read
        except OSError as exc:
            return None, f"{path}: {exc.strerror or exc}"
        return parse(raw, str(path), key)

    # -- writing --------------------------------------------------------------------------------------------
    def record_image(self, key: str, digest: str, cell: str, vouched_by: str = "") -> str:
        """Record that builder produced image `digest` for `key` (or, with `vouched_by`, that it was pulled on the
        word of that signed record); returns a note on an entry that was unreadable and is replaced ("" otherwise)."""
        return self._update(key, lambda entry: add_image(entry, digest, cell, vouched_by))

    def record_published(self, key: str, ref: str, digest: str, cell: str, vouched_by: str = "") -> str:
        """Record that publish pushed `digest` (an image builder built for `key`, or one `vouched_by` vouches for)
        as REPO:TAG `ref`."""
        return self._update(key, lambda entry: add_published(entry, ref, digest, cell, vouched_by))

    def _update(self, key: str, change) -> str:
        check_dir(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._remove_stale_parts()
            entry, problem = self.read(key)
            entry = entry or Entry(key)
            change(entry)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:12]}-", suffix=".part", dir=self.root)
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(entry.to_json(), fh, indent=1, sort_keys=True)
                    fh.write("\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path(key))  # replaces a symlink or a bad file itself, never its target
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return f"replaced an unreadable ledger entry ({problem})" if problem else ""

    def _remove_stale_parts(self, older_than_s: float = 3600) -> None:
        """The temporary files a killed build left (only names _update makes: .<key12>-<random>.part)."""
        now = time.time()
        for p in self.root.glob(".*.part"):
            with contextlib.suppress(OSError):
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than_s and _PART.fullmatch(p.name):
                    os.unlink(p)

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def parse(raw: bytes, where: str, key: str) -> tuple[Entry | None, str]:
    """An entry's bytes (a file of the wheelhouse's ledger, or a registry's ledger record: builder/image/reuse.py)
    read and checked: (entry, "") or (None, why) when they are not an entry builder writes for `key`."""
    if len(raw) > MAX_BYTES:
        return None, f"{where} is larger than {MAX_BYTES} bytes"
    try:
        data = json.loads(raw)
    except RecursionError:
        return None, f"{where}: nested too deeply"
    except ValueError as exc:
        return None, f"{where}: not JSON ({exc})"
    try:
        schema.check(where, data, schema.LEDGER_ENTRY)
    except UserError as exc:
        return None, str(exc)
    if data["format"] != FORMAT:
        return None, f"{where}: format {data['format']}, this builder writes {FORMAT}"
    if data["content_key"] != key:
        return None, f"{where}: it records content key {data['content_key']}, not the {key} its name says"
    return Entry(key, dict(data["images"]), dict(data.get("published", {}))), ""


def vouches(entry: Entry, digest: str) -> tuple[bool, str]:
    """Whether `entry` records `digest`; when not, why, as the end of a sentence."""
    if digest in entry.images:
        return True, ""
    recorded = sorted(entry.images, key=lambda d: entry.images[d]["recorded"])
    return False, (f"its digest {digest} is not the one builder recorded for it ({recorded[0]})"
                   if len(recorded) == 1 else
                   f"its digest {digest} is none of those builder recorded for it ({', '.join(recorded)})"
                   if recorded else f"its digest {digest} is not recorded for it (the entry lists none)")


def add_image(entry: Entry, digest: str, cell: str, vouched_by: str = "") -> None:
    """Record that builder produced image `digest` for the entry's key (the newest KEEP digests are kept); with
    `vouched_by`, that it took the digest on the word of that (signed) record: a digest built here stays built here."""
    built_here = digest in entry.images and not entry.images[digest].get("vouched_by")
    entry.images[digest] = {"cell": cell, "recorded": _now()}
    if vouched_by and not built_here:
        entry.images[digest]["vouched_by"] = vouched_by
    for old in sorted(entry.images, key=lambda d: entry.images[d]["recorded"])[:-KEEP]:
        if old != digest:
            del entry.images[old]


def add_published(entry: Entry, ref: str, digest: str, cell: str, vouched_by: str = "") -> None:
    """Record that publish pushed `digest` (an image builder built for the entry's key) as REPO:TAG `ref`."""
    if digest not in entry.images:
        entry.images[digest] = {"cell": cell, "recorded": _now(), **({"vouched_by": vouched_by} if vouched_by else {})}
    entry.published[ref] = digest


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
