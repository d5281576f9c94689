"""Prove which GPU archs are really compiled into binaries, in pure Python.

A CUDA binary (an ELF ``.so``, executable or object) carries its device code in the
``.nv_fatbin`` section (relocatable objects use ``__nv_relfatbin``). That section holds one or
more fatbin containers back to back; each container holds entries: SASS (a cubin for one
``sm_XY``), PTX (``compute_XY``, JIT-compiled by the driver) or LTO IR.

Layout, all little-endian (checked against ``cuobjdump`` on binaries from CUDA 11.8 to 13.2):

Container header, 16 bytes::

    0  u32 magic        0xBA55ED50
    4  u16 version      1
    6  u16 header_size  16: the first entry starts here
    8  u64 fat_size     bytes of entries that follow the header

Containers may be separated by zero padding; an empty container (fat_size 0) is legal.

Entry header (64 bytes or more; entries follow each other with no gap)::

    0  u16 kind          1 = PTX, 2 = ELF (SASS), 8 = NVVM / LTO IR
    2  u16 (0x0101)
    4  u32 header_size   64, 72, 80, 96, 104, 112...: extra bytes carry the object name
                         (debug builds) or toolkit info (sm_100 and newer)
    8  u64 payload_size  padded to 8; the next entry starts at header_size + payload_size
    16 u32 compressed payload size (0 when not compressed)
    24 u16 code version minor, 26 u16 major (ELF [1,8]; PTX: the ISA, e.g. [9,0])
    28 u32 arch          80, 90, 100, 120...
    32 u32 name offset,  36 u32 name length (of the extra header bytes)
    40 u64 flags         0x1 64-bit, 0x2 debug, 0x10 linux,
                         0x2000 compressed (LZ4, CUDA 11/12), 0x8000 compressed (zstd, CUDA 13),
                         0x100000 arch-specific ("a": sm_90a, compute_100a),
                         0x200000 family-specific ("f": sm_100f)
    56 u64 uncompressed payload size (0 when not compressed)

The arch and its ``a``/``f`` variant are in the entry header even when the payload is
compressed, so no decompression is needed. ``cuobjdump`` reads the same fields: its ``arch =``
lines print ``sm_90a`` / ``sm_100f`` exactly as decoded here (its ``--list-elf`` file names drop
the ``f``).

Like ``cuobjdump``, the executable fatbin (``.nv_fatbin``) is read when there is one, else the
relocatable one (``__nv_relfatbin``): in a ``-rdc`` shared library the relocatable copy is not what
the runtime loads.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
import subprocess
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from builder import archs as archs_mod
from builder import docker
from builder.errors import CommandError, UserError

FATBIN_MAGIC = 0xBA55ED50
FATBIN_VERSION = 1

KIND_PTX = 1
KIND_ELF = 2
KIND_NVVM = 8

FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_LINUX = 0x10
FLAG_COMPRESSED_LZ4 = 0x2000
FLAG_COMPRESSED_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

EXECUTABLE_FATBIN_SECTION = ".nv_fatbin"
RELOCATABLE_FATBIN_SECTION = "__nv_relfatbin"

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY_MIN = 48  # enough for kind .. flags
_SHARED_LIB = re.compile(r"\.so(\.[0-9A-Za-z_]+)*$")


class FatbinFormatError(UserError):
    """An ELF file whose fatbin cannot be decoded."""


class NotElfError(UserError):
    """A file that is not an ELF object."""


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" | "ptx" | "other"
    arch: int  # 80, 90, 100...
    variant: str  # "" or "a" or "f"
    compressed: bool
    raw_kind: int = field(default=0, compare=False, repr=False)
    size: int = field(default=0, compare=False, repr=False)  # bytes in the file: the entry's header and payload

    @property
    def name(self) -> str:
        if self.kind == "sass":
            prefix = "sm"
        elif self.kind == "ptx":
            prefix = "compute"
        elif self.raw_kind == KIND_NVVM:
            prefix = "lto"
        else:
            prefix = f"kind{self.raw_kind}" if self.raw_kind else "other"
        return f"{prefix}_{self.arch}{self.variant}"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "arch": self.arch,
            "variant": self.variant,
            "compressed": self.compressed,
        }


def _entry_from_header(raw_kind: int, arch: int, flags: int, size: int = 0) -> FatbinEntry:
    kind = {KIND_ELF: "sass", KIND_PTX: "ptx"}.get(raw_kind, "other")
    if flags & FLAG_ARCH_SPECIFIC:
        variant = "a"
    elif flags & FLAG_FAMILY_SPECIFIC:
        variant = "f"
    else:
        variant = ""
    compressed = bool(flags & (FLAG_COMPRESSED_LZ4 | FLAG_COMPRESSED_ZSTD))
    return FatbinEntry(kind, arch, variant, compressed, raw_kind, size)


# --------------------------------------------------------------------------- readers


class _Reader:
    """Random access to one file's bytes: read_at(offset, size)."""

    size: int

    def read_at(self, offset: int, size: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def read_exact(self, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise FatbinFormatError(f"{what} lies outside the file (offset {offset}, {size} bytes)")
        data = self.read_at(offset, size)
        if len(data) != size:
            raise FatbinFormatError(f"{what}: short read at offset {offset}")
        return data


class _FileReader(_Reader):
    """A seekable file object, optionally a window [base, base + size) of it."""

    def __init__(self, fh: BinaryIO, size: int, base: int = 0):
        self._fh = fh
        self._base = base
        self.size = size

    def read_at(self, offset: int, size: int) -> bytes:
        self._fh.seek(self._base + offset)
        return self._fh.read(size)


class _StreamReader(_Reader):
    """A forward-only stream (a deflated zip member) made random-access.

    Reading ahead discards data but keeps a trailing window, so the ELF section-name table, which
    sits just before the section headers at the end of the file, costs no second pass. Reading
    behind the window reopens the stream.
    """

    _CHUNK = 1 << 20
    _KEEP = 8 << 20

    def __init__(self, opener: Callable[[], BinaryIO], size: int):
        self._opener = opener
        self.size = size
        self._stream: BinaryIO | None = None
        self._pos = 0  # stream position == end of the window
        self._buf = bytearray()  # bytes [pos - len(buf), pos)
        self.reopens = 0

    def _restart(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self.reopens += 1
        self._stream = self._opener()
        self._pos = 0
        self._buf = bytearray()

    def read_at(self, offset: int, size: int) -> bytes:
        if self._stream is None or offset < self._pos - len(self._buf):
            self._restart()
        assert self._stream is not None
        end = offset + size
        while self._pos < end:
            chunk = self._stream.read(max(self._CHUNK, min(end - self._pos, 64 << 20)))
            if not chunk:
                break
            self._buf += chunk
            self._pos += len(chunk)
            keep = max(self._KEEP, self._pos - offset)
            if len(self._buf) > keep:
                del self._buf[: len(self._buf) - keep]
        start = offset - (self._pos - len(self._buf))
        return bytes(self._buf[start : start + size])

    def drain(self) -> None:
        """Read the member to its end, so zipfile checks its CRC-32 (raising BadZipFile on a mismatch)."""
        if self._stream is None:
            self._restart()
        assert self._stream is not None
        while self._stream.read(self._CHUNK):
            pass

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


# --------------------------------------------------------------------------- ELF


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int


def _elf_sections(reader: _Reader, what: str) -> list[_Section]:
    ident = reader.read_at(0, 64)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise NotElfError(f"{what}: not an ELF file")
    elf_class, data = ident[4], ident[5]
    if elf_class not in (1, 2) or data not in (1, 2):
        raise FatbinFormatError(f"{what}: unsupported ELF class {elf_class} / data encoding {data}")
    end = "<" if data == 1 else ">"
    if elf_class == 2:
        if len(ident) < 64:
            raise FatbinFormatError(f"{what}: truncated ELF header")
        (shoff,) = struct.unpack_from(end + "Q", ident, 40)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", ident, 58)
        shdr = struct.Struct(end + "IIQQQQIIQQ")
        min_shentsize = 64
    else:
        if len(ident) < 52:
            raise FatbinFormatError(f"{what}: truncated ELF header")
        (shoff,) = struct.unpack_from(end + "I", ident, 32)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", ident, 46)
        shdr = struct.Struct(end + "IIIIIIIIII")
        min_shentsize = 40
    if shoff == 0:
        raise FatbinFormatError(f"{what}: ELF file without section headers; cannot locate the fatbin")
    if shentsize < min_shentsize:
        raise FatbinFormatError(f"{what}: bad ELF section header size {shentsize}")

    def unpack(raw: bytes) -> tuple[int, int, int, int, int]:
        name, stype, _flags, _addr, off, size, link, _info, _align, _ent = shdr.unpack_from(raw)
        return name, stype, off, size, link

    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: the real values live in section 0
        _, _, _, size0, link0 = unpack(reader.read_exact(shoff, shentsize, f"{what}: section header 0"))
        if shnum == 0:
            shnum = size0
        if shstrndx == 0xFFFF:
            shstrndx = link0
    if shnum > 1_000_000:
        raise FatbinFormatError(f"{what}: implausible section count {shnum}")
    table = reader.read_exact(shoff, shnum * shentsize, f"{what}: section headers")
    raw = [unpack(table[i * shentsize : (i + 1) * shentsize]) for i in range(shnum)]
    if not 0 < shstrndx < shnum:
        raise FatbinFormatError(f"{what}: bad section-name table index {shstrndx}")
    _, _, str_off, str_size, _ = raw[shstrndx]
    names = reader.read_exact(str_off, str_size, f"{what}: section-name table")
    sections = []
    for name_off, stype, off, size, _link in raw:
        nul = names.find(b"\0", name_off)
        name = names[name_off : nul if nul >= 0 else len(names)].decode("latin-1")
        sections.append(_Section(name, stype, off, size))
    return sections


_SHT_NOBITS = 8


def _fatbin_entries(reader: _Reader, what: str) -> list[FatbinEntry]:
    sections = _elf_sections(reader, what)
    for wanted in (EXECUTABLE_FATBIN_SECTION, RELOCATABLE_FATBIN_SECTION):
        found = [s for s in sections if s.name == wanted and s.type != _SHT_NOBITS and s.size]
        if found:
            entries: list[FatbinEntry] = []
            for section in found:
                entries.extend(_walk_section(reader, section, what))
            return entries
    return []


def _walk_section(reader: _Reader, section: _Section, what: str) -> Iterator[FatbinEntry]:
    if section.offset + section.size > reader.size:
        raise FatbinFormatError(f"{what}: section {section.name} runs past the end of the file")
    base, size = section.offset, section.size
    where = f"{what}: {section.name}"
    pos = 0
    while pos < size:
        head = reader.read_exact(base + pos, min(16, size - pos), where)
        if not any(head):  # zero padding between containers
            pos += len(head)
            continue
        if head[0] == 0:
            pos += len(head) - len(head.lstrip(b"\0"))
            continue
        if len(head) < 16:
            raise FatbinFormatError(f"{where}: truncated fatbin header at offset {pos:#x}")
        magic, version, header_size, fat_size = _CONTAINER.unpack(head)
        if magic != FATBIN_MAGIC:
            raise FatbinFormatError(f"{where}: no fatbin magic at offset {pos:#x} (found {magic:#010x})")
        if version != FATBIN_VERSION or header_size < 16:
            raise FatbinFormatError(
                f"{where}: unknown fatbin header at offset {pos:#x} (version {version}, size {header_size})"
            )
        end = pos + header_size + fat_size
        if end > size:
            raise FatbinFormatError(f"{where}: fatbin at offset {pos:#x} runs past the section end")
        p = pos + header_size
        while p < end:
            raw = reader.read_exact(base + p, min(64, end - p), where)
            if len(raw) < _ENTRY_MIN:
                raise FatbinFormatError(f"{where}: truncated fatbin entry at offset {p:#x}")
            raw_kind, _, entry_header_size, payload_size = struct.unpack_from("<HHIQ", raw, 0)
            (arch,) = struct.unpack_from("<I", raw, 28)
            (flags,) = struct.unpack_from("<Q", raw, 40)
            if entry_header_size < _ENTRY_MIN or p + entry_header_size + payload_size > end:
                raise FatbinFormatError(
                    f"{where}: bad fatbin entry at offset {p:#x} "
                    f"(header {entry_header_size} bytes, payload {payload_size} bytes)"
                )
            yield _entry_from_header(raw_kind, arch, flags, entry_header_size + payload_size)
            p += entry_header_size + payload_size
        pos = end


def read_fatbin_entries(path: Path) -> list[FatbinEntry]:
    """Every fatbin entry of one ELF file, in file order; [] when it has no device code.

    Raises UserError if the file does not exist or is not ELF, FatbinFormatError (a UserError)
    if its fatbin cannot be decoded.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not an ELF file")
    return _fatbin_entries_file(path, str(path))


def _zip_member_reader(zf: zipfile.ZipFile, info: zipfile.ZipInfo, zip_fh: BinaryIO) -> _Reader:
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        zip_fh.seek(info.header_offset)
        local = zip_fh.read(30)
        if len(local) == 30 and local[:4] == b"PK\x03\x04":
            name_len, extra_len = struct.unpack_from("<HH", local, 26)
            return _FileReader(zip_fh, info.file_size, info.header_offset + 30 + name_len + extra_len)
    return _StreamReader(lambda: zf.open(info), info.file_size)


# --------------------------------------------------------------------------- coverage


def _runs_on(entry: FatbinEntry, arch: int) -> bool:
    return archs_mod.runs_on(entry.kind, entry.arch, entry.variant, arch)


_VARIANT_RANK = {"": 0, "f": 1, "a": 2}


def arch_is_covered(entries: Iterable[FatbinEntry], arch: int) -> tuple[bool, str]:
    """Whether a GPU of compute capability ``arch`` (86 = 8.6) can run this device code.

    Returns (True, "SASS sm_86") / (True, "PTX compute_80 (JIT)") / (False, "").
    SASS is preferred over PTX, then the closest arch.
    """
    uniq = set(entries)
    for kind, label in (("sass", "SASS {}"), ("ptx", "PTX {} (JIT)")):
        fits = [e for e in uniq if e.kind == kind and _runs_on(e, arch)]
        if fits:
            best = min(fits, key=lambda e: (e.arch != arch, -e.arch, _VARIANT_RANK.get(e.variant, 9)))
            return True, label.format(best.name)
    return False, ""


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True)
class ArchResult:
    arch: int
    covered: bool
    how: str

    @property
    def name(self) -> str:
        return f"sm_{self.arch}"


def _order(e: FatbinEntry) -> tuple:
    return (e.kind, e.arch, _VARIANT_RANK.get(e.variant, 9), e.raw_kind)


@dataclass(frozen=True)
class BinaryReport:
    path: str
    entries: tuple[FatbinEntry, ...]
    results: tuple[ArchResult, ...]  # empty when the binary has no device code
    note: str = ""  # why a binary holds no device code ("not an ELF file"), when not obvious
    error: str = ""  # the fatbin could not be read: the audit fails
    scope: archs_mod.ArchScope | None = None  # built for some arch families only, by design: asked only for those

    @property
    def has_device_code(self) -> bool:
        return bool(self.entries)

    @property
    def ok(self) -> bool:
        return not self.error and all(r.covered for r in self.results)

    @property
    def missing(self) -> list[int]:
        return [r.arch for r in self.results if not r.covered]

    def names(self, kind: str) -> list[str]:
        seen: dict[str, None] = {}
        for e in sorted(set(self.entries), key=_order):
            if e.kind == kind:
                seen.setdefault(e.name, None)
        return list(seen)

    @property
    def status(self) -> str:
        if self.error:
            return "ERROR"
        if not self.has_device_code:
            return "no device code"
        only = f"{self.scope.why}: for {self.scope.spelled} only" if self.scope else ""
        if self.ok:
            if self.scope and not self.results:
                return f"ok (not for these archs: {only})"
            return f"ok ({only})" if self.scope else "ok"
        return "FAIL (missing " + ", ".join(f"sm_{a}" for a in self.missing) + ")" + (f" ({only})" if self.scope else "")

    def to_json(self) -> dict:
        counts: dict[FatbinEntry, list[int]] = {}
        for e in self.entries:
            c = counts.setdefault(e, [0, 0])
            c[0] += 1
            c[1] += e.compressed
        return {
            "path": self.path,
            "device_code": self.has_device_code,
            "ok": self.ok,
            "status": self.status,
            "note": self.note or None,
            "error": self.error or None,
            "sass": self.names("sass"),
            "ptx": self.names("ptx"),
            "other": self.names("other"),
            "entries": [
                {**e.to_json(), "compressed": c[1] > 0, "count": c[0]}
                for e, c in sorted(counts.items(), key=lambda kv: _order(kv[0]))
            ],
            "archs": [{"arch": r.arch, "covered": r.covered, "how": r.how} for r in self.results],
            "missing": self.missing,
            "scope": self.scope.to_json() if self.scope else None,
        }


@dataclass
class AuditReport:
    target: str
    archs: tuple[int, ...]
    binaries: list[BinaryReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(b.ok for b in self.binaries)

    @property
    def has_device_code(self) -> bool:
        """False when no binary at all carried device code (worth a warning: nothing was proven)."""
        return any(b.has_device_code for b in self.binaries)

    @property
    def failures(self) -> list[BinaryReport]:
        return [b for b in self.binaries if not b.ok]

    @property
    def errors(self) -> list[BinaryReport]:
        """Binaries that could not be read (corrupt, unreadable): nothing is known about them."""
        return [b for b in self.binaries if b.error]

    @property
    def proven(self) -> bool:
        """Every binary covers every arch, and at least one carries device code: something was proven. (A
        target with no device code at all passes `ok` — a pure-Python wheel — but proves nothing.)"""
        return self.ok and self.has_device_code

    def binary(self, path: str) -> BinaryReport:
        for b in self.binaries:
            if b.path == path:
                return b
        raise KeyError(path)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "archs": list(self.archs),
            "ok": self.ok,
            "proven": self.proven,
            "binaries_with_device_code": sum(b.has_device_code for b in self.binaries),
            "binaries": [b.to_json() for b in self.binaries],
        }


# What reading a corrupt or unreadable input raises: a bad CRC or a broken zip (BadZipFile), bad deflate data
# (zlib.error), a truncated member (EOFError), an encrypted or unsupported member (RuntimeError,
# NotImplementedError), a file that cannot be opened or read (OSError).
READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError, OSError)


def _read_error(exc: BaseException) -> str:
    if isinstance(exc, zipfile.BadZipFile):
        return f"corrupt: {exc}"
    if isinstance(exc, zlib.error):
        return f"corrupt: its compressed data is damaged ({exc})"
    if isinstance(exc, EOFError):
        return f"corrupt: truncated ({exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read: {exc.strerror}"
    return f"cannot read: {type(exc).__name__}: {exc}"


def _binary_report(path: str, read: Callable[[], list[FatbinEntry]], archs: tuple[int, ...],
                   scopes: tuple[archs_mod.ArchScope, ...] = ()) -> BinaryReport:
    try:
        entries = read()
    except NotElfError:
        return BinaryReport(path, (), (), note="not an ELF file")
    except FatbinFormatError as exc:
        return BinaryReport(path, (), (), error=str(exc))
    except READ_ERRORS as exc:
        return BinaryReport(path, (), (), error=f"{path}: {_read_error(exc)}")
    if not entries:
        return BinaryReport(path, (), ())
    scope = archs_mod.scope_for(path, scopes)
    asked = tuple(a for a in archs if scope.covers(a)) if scope else archs
    results = tuple(ArchResult(a, *arch_is_covered(entries, a)) for a in asked)
    return BinaryReport(path, tuple(entries), results, scope=scope)


def is_shared_lib(name: str) -> bool:
    """A file the audit reads (foo.so, foo.so.1.2): the image's SBOM holds the same binaries to its labels."""
    return bool(_SHARED_LIB.search(PurePosixPath(name).name))


def _audit_wheel(wheel: Path, label: str, archs: tuple[int, ...],
                 scopes: tuple[archs_mod.ArchScope, ...] = ()) -> list[BinaryReport]:
    try:
        zf = zipfile.ZipFile(wheel)
        raw = open(wheel, "rb")
    except READ_ERRORS as exc:
        return [BinaryReport(label, (), (), error=f"{label}: not a readable wheel ({exc})")]
    reports = []
    with zf, raw:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir() or not is_shared_lib(info.filename):
                continue
            member = f"{label}!{info.filename}"

            def read(info: zipfile.ZipInfo = info, member: str = member) -> list[FatbinEntry]:
                reader = _zip_member_reader(zf, info, raw)
                try:
                    try:
                        entries = _fatbin_entries(reader, member)
                    except (NotElfError, FatbinFormatError):
                        _check_crc(reader, info)  # a corrupt member is a corrupt member, not "not an ELF file"
                        raise
                    _check_crc(reader, info)
                    return entries
                finally:
                    if isinstance(reader, _StreamReader):
                        reader.close()

            reports.append(_binary_report(member, read, archs, scopes))
    return reports


def _check_crc(reader: _Reader, info: zipfile.ZipInfo) -> None:
    """The whole member matches the CRC-32 the zip records (BadZipFile else): what was read is what was
    packed. A deflated member is read to its end (zipfile checks the CRC there); a stored one is summed."""
    if isinstance(reader, _StreamReader):
        reader.drain()
        return
    crc, pos = 0, 0
    while pos < reader.size:
        chunk = reader.read_at(pos, min(1 << 20, reader.size - pos))
        if not chunk:
            raise EOFError(f"{info.filename}: truncated at byte {pos}")
        crc = zlib.crc32(chunk, crc)
        pos += len(chunk)
    if crc != info.CRC:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")


def _audit_file(path: Path, label: str, archs: tuple[int, ...],
                scopes: tuple[archs_mod.ArchScope, ...] = ()) -> list[BinaryReport]:
    if path.suffix == ".whl":
        return _audit_wheel(path, label, archs, scopes)
    return [_binary_report(label, lambda: read_fatbin_entries(path), archs, scopes)]


def audit(target: str | os.PathLike, archs: list[int], scopes: Iterable[archs_mod.ArchScope] = ()) -> AuditReport:
    """Audit a .so / ELF file, a wheel, or a directory (every .so, .so.* and .whl in it). A binary an arch
    scope matches is asked only for the requested archs inside the scope (see archs.ArchScope)."""
    scopes = tuple(scopes)
    wanted = archs_mod.requested(archs)
    path = Path(target)
    report = AuditReport(str(target), wanted)
    if path.is_dir():
        def unreadable(exc: OSError) -> None:  # os.walk would skip an unreadable directory without a word
            where = Path(exc.filename).relative_to(path).as_posix() if exc.filename else str(path)
            report.binaries.append(BinaryReport(where or ".", (), (), error=f"{where or path}: {_read_error(exc)}"))

        # every library and wheel, each real file once: a symlink is followed (into a directory too) unless its
        # target is audited under its own name in the tree; one pointing out of the tree is audited, not skipped
        direct, linked, seen_dirs = [], [], {os.path.realpath(path)}
        for root, dirs, files in os.walk(path, onerror=unreadable, followlinks=True):
            dirs.sort()
            for d in list(dirs):
                real = os.path.realpath(os.path.join(root, d))
                if real in seen_dirs:  # a loop, or a tree reached twice
                    dirs.remove(d)
                seen_dirs.add(real)
            via_link = os.path.realpath(root) != os.path.normpath(os.path.join(os.path.realpath(path),
                                                                                os.path.relpath(root, path)))
            for name in sorted(files):
                full = Path(root, name)
                if not (is_shared_lib(name) or name.endswith(".whl")):
                    continue
                (linked if via_link or full.is_symlink() else direct).append(full)
        audited = set()
        for full in direct:
            if full.is_file():
                audited.add(os.path.realpath(full))
                report.binaries.extend(_audit_file(full, full.relative_to(path).as_posix(), wanted, scopes))
        for full in linked:
            label = full.relative_to(path).as_posix()
            real = os.path.realpath(full)
            if real in audited:
                continue
            audited.add(real)
            if not os.path.exists(real):
                report.binaries.append(BinaryReport(label, (), (), error=f"{label}: a symlink to {real}, which does not exist"))
            elif not os.path.isfile(real):
                continue
            else:
                report.binaries.extend(_audit_file(Path(real), label, wanted, scopes))
        return report
    if not path.exists():
        raise UserError(f"audit: {target}: no such file or directory")
    if not path.is_file():
        raise UserError(f"audit: {target}: not a regular file or directory")
    if path.suffix == ".whl":
        if not zipfile.is_zipfile(path):
            raise UserError(f"audit: {target}: not a wheel (not a zip archive)")
        report.binaries.extend(_audit_wheel(path, path.name, wanted, scopes))
        return report
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise UserError(f"audit: {target}: cannot read: {exc.strerror or exc}") from None
    if magic != b"\x7fELF":
        raise UserError(f"audit: {target}: not an ELF file, a wheel or a directory")
    report.binaries.extend(_audit_file(path, str(target), wanted, scopes))
    return report


# --------------------------------------------------------------------------- docker images


def audit_image(image: str, archs: list[int], scopes: Iterable[archs_mod.ArchScope] = ()) -> AuditReport:
    """Audit every .so of a local Docker image (docker create + export, streamed).

    Each shared library is copied out of the export stream into a temporary file, read, and
    deleted, so disk use stays at one library at a time. Paths in the report are absolute paths
    inside the image; a hard link is listed under its own name with its target's result, a
    symbolic link is not listed (its target is, under its own name). The image is never pulled.
    """
    wanted = archs_mod.requested(archs)
    scopes = tuple(scopes)
    report = AuditReport(image, wanted)
    cid = docker.create_container(image)
    try:
        export = ["docker", "export", cid]
        with tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory(prefix="builder-audit-") as tmp:
            proc = docker.popen(export, stdout=subprocess.PIPE, stderr=err)
            stream_error: Exception | None = None
            read_all = False
            try:
                assert proc.stdout is not None
                with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                    seen: dict[str, BinaryReport] = {}
                    for member in tar:
                        if not is_shared_lib(member.name):
                            continue
                        name = _image_path(member.name)
                        if member.islnk():  # a hard link: same bytes as a file already read
                            first = seen.get(_image_path(member.linkname))
                            if first is not None:
                                report.binaries.append(dataclasses.replace(first, path=name))
                            continue
                        src = tar.extractfile(member) if member.isfile() else None
                        if src is None:
                            continue  # symlinks, devices: a link's target is read under its own name
                        local = Path(tmp, "lib")
                        with open(local, "wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        seen[name] = _binary_report(
                            name, lambda local=local, name=name: _fatbin_entries_file(local, name), wanted, scopes
                        )
                        report.binaries.append(seen[name])
                        local.unlink()
                read_all = True
            except (tarfile.TarError, OSError) as exc:
                stream_error = exc
            finally:
                if proc.stdout is not None:
                    if read_all:  # the tar reader stops at the end-of-archive block: read the padding
                        try:              # after it too, or docker export dies of SIGPIPE (exit -13)
                            while proc.stdout.read(1 << 16):
                                pass
                        except OSError:
                            pass
                    proc.stdout.close()
                rc = proc.wait()
            if rc != 0 or stream_error is not None:
                err.seek(0)
                output = err.read().decode("utf-8", "replace")
                if stream_error is not None:
                    output += f"\nreading the export stream: {stream_error}"
                raise CommandError(export, rc or 1, output)
    finally:
        docker.remove_container(cid)
    report.binaries.sort(key=lambda b: b.path)
    return report


def _image_path(name: str) -> str:
    return "/" + name.lstrip("/").removeprefix("./").lstrip("/")


def _fatbin_entries_file(local: Path, label: str) -> list[FatbinEntry]:
    with open(local, "rb") as fh:
        return _fatbin_entries(_FileReader(fh, os.fstat(fh.fileno()).st_size), label)


# --------------------------------------------------------------------------- text report


def _failure_line(b: BinaryReport) -> list[str]:
    if b.error:
        return [f"FAIL {b.path}: {b.error}"]
    sass, ptx = b.names("sass"), b.names("ptx")
    has = ("SASS " + " ".join(sass)) if sass else "no SASS"
    has += (", PTX " + " ".join(ptx)) if ptx else ", no PTX"
    return [f"FAIL {b.path}: sm_{a} missing (has {has})" for a in b.missing]


def format_report(report: AuditReport, *, verbose: bool = False) -> str:
    """A table of file, SASS, PTX and status, then one FAIL line per missing arch.

    Binaries without device code are counted, and listed only with verbose=True.
    """
    wanted = ", ".join(f"sm_{a}" for a in report.archs)
    lines = [f"audit {report.target} for {wanted}"]
    shown = [b for b in report.binaries if verbose or b.has_device_code or b.error]
    rows = [("FILE", "SASS", "PTX", "STATUS")]
    for b in shown:
        ptx = b.names("ptx") + b.names("other")
        status = b.status + (f" ({b.note})" if b.note else "")
        rows.append((b.path, " ".join(b.names("sass")) or "-", " ".join(ptx) or "-", status))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    hidden = len(report.binaries) - len(shown)
    if hidden:
        lines.append(f"({hidden} binaries without device code not shown)")
    for b in report.failures:
        lines.extend(_failure_line(b))
    n_dev = sum(b.has_device_code for b in report.binaries)
    if not report.binaries:
        lines.append("no shared libraries found")
    elif not n_dev and not report.failures:
        lines.append("no binary carries device code")
    if report.ok and not n_dev:
        lines.append(f"NOTHING PROVEN: no binary carries device code, so nothing shows that {wanted} are covered")
    elif report.ok:
        lines.append(f"OK: {n_dev} binaries with device code cover {wanted}")
    else:
        lines.append(f"FAILED: {len(report.failures)} of {len(report.binaries)} binaries fail the audit")
    return "\n".join(lines)


# --------------------------------------------------------------------------- what a published wheel links against
_SHT_DYNAMIC = 6
_DT_NEEDED = 1
_CUDART = re.compile(r"libcudart\.so\.(\d+)$")


def _needed(reader: _Reader, what: str) -> list[str]:
    """The DT_NEEDED names of an ELF shared library (its .dynamic entries, names in .dynstr)."""
    sections = _elf_sections(reader, what)
    ident = reader.read_at(0, 6)
    wide, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
    dyn = next((s for s in sections if s.type == _SHT_DYNAMIC and s.size), None)
    strtab = next((s for s in sections if s.name == ".dynstr" and s.size), None)
    if dyn is None or strtab is None:
        return []
    entry = struct.Struct(end + ("qQ" if wide else "iI"))
    raw = reader.read_exact(dyn.offset, dyn.size, f"{what}: .dynamic")
    names = reader.read_exact(strtab.offset, strtab.size, f"{what}: .dynstr")
    out = []
    for i in range(0, len(raw) - entry.size + 1, entry.size):
        tag, val = entry.unpack_from(raw, i)
        if tag == 0:
            break
        if tag == _DT_NEEDED and val < len(names):
            nul = names.find(b"\0", val)
            out.append(names[val: nul if nul >= 0 else len(names)].decode("latin-1"))
    return out


def wheel_links(wheel: Path) -> dict[str, list[str]]:
    """Per shared library of a wheel (path inside it), the libraries it needs (DT_NEEDED), read from its ELF."""
    out: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as raw:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir() or not is_shared_lib(info.filename):
                continue
            reader = _zip_member_reader(zf, info, raw)
            try:
                out[info.filename] = _needed(reader, f"{wheel.name}!{info.filename}")
            except (NotElfError, FatbinFormatError):
                continue
            finally:
                if isinstance(reader, _StreamReader):
                    reader.close()
    return out


def cuda_majors(links: dict[str, list[str]]) -> dict[int, list[str]]:
    """CUDA runtime major → the binaries that need its libcudart.so.N (a wheel built for CUDA 13 needs .so.13)."""
    out: dict[int, list[str]] = {}
    for path, needed in links.items():
        for name in needed:
            m = _CUDART.match(name)
            if m:
                out.setdefault(int(m.group(1)), []).append(path)
    return out


# --------------------------------------------------------------------------- an audit from recorded entries
_ENTRY_NAME = re.compile(r"(sm|compute)_(\d+)([af]?)$")


def entry_from_name(name: str) -> FatbinEntry:
    """sm_90a → SASS 90 "a"; compute_80 → PTX 80: the names format_report and the engine data use."""
    m = _ENTRY_NAME.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a SASS or PTX name like sm_90a or compute_80")
    kind = "sass" if m.group(1) == "sm" else "ptx"
    return FatbinEntry(kind, int(m.group(2)), m.group(3), False, KIND_ELF if kind == "sass" else KIND_PTX)


def audit_recorded(target: str, binaries: dict[str, list[str]], archs: list[int],
                   scopes: Iterable[archs_mod.ArchScope] = ()) -> AuditReport:
    """The audit's verdict on device code recorded earlier (path → SASS/PTX names, as an audit of the real file read
    them): the same coverage rules and arch scopes as `audit`, without the file. What plan predicts with."""
    scopes = tuple(scopes)
    wanted = archs_mod.requested(archs)
    report = AuditReport(target, wanted)
    for path, names in sorted(binaries.items()):
        entries = [entry_from_name(n) for n in names]
        report.binaries.append(_binary_report(f"{target}!{path}", lambda entries=entries: entries, wanted, scopes))
    return report
