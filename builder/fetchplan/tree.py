"""The CMake files of a source tree: a directory, or an sdist read in place (never unpacked)."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

from ..errors import UserError

def _wanted(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (
        name == "CMakeLists.txt"
        or name.endswith(".cmake")
        or rel in ("setup.py", "pyproject.toml", "rust-toolchain.toml", "rust-toolchain", "Cargo.lock",
                   "rust/Cargo.lock")
    )


class Tree:
    def __init__(self, files: dict[str, str], label: str):
        self.files = files  # relative posix path -> text
        self.label = label

    def read(self, rel: str) -> str | None:
        return self.files.get(rel)

    @classmethod
    def from_dir(cls, root: Path) -> "Tree":
        root = Path(root)
        if not root.is_dir():
            raise UserError(f"not a directory: {root}")
        files: dict[str, str] = {}
        for p in root.rglob("*"):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and _wanted(rel) and p.stat().st_size < 4_000_000:
                files[rel] = p.read_text(encoding="utf-8", errors="replace")
        return cls(files, str(root))

    @classmethod
    def from_sdist(cls, path: Path) -> "Tree":
        path = Path(path)
        if not path.is_file():
            raise UserError(f"no such sdist: {path}")
        raw: dict[str, bytes] = {}
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if not info.is_dir() and info.file_size < 4_000_000 \
                            and _wanted_member(info.filename):
                        raw[info.filename] = zf.read(info)
        else:
            try:
                tf = tarfile.open(path, "r:*")
            except tarfile.TarError as e:
                raise UserError(f"{path}: not a readable sdist: {e}") from e
            with tf:
                for member in tf:
                    if member.isfile() and member.size < 4_000_000 and _wanted_member(member.name):
                        fh = tf.extractfile(member)
                        raw[member.name] = fh.read() if fh else b""
        # Strip the single top directory (name-version/) that sdists have.
        tops = {n.split("/", 1)[0] for n in raw if "/" in n}
        files: dict[str, str] = {}
        for name, data in raw.items():
            rel = name.split("/", 1)[1] if len(tops) == 1 and "/" in name else name
            if _wanted(rel):
                files[rel] = data.decode("utf-8", errors="replace")
        return cls(files, str(path))


def _wanted_member(name: str) -> bool:
    parts = name.split("/", 1)
    return _wanted(parts[1] if len(parts) == 2 else name)
