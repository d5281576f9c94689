"""Reading the files a user hands builder (matrix.toml, matrix.lock, knowledge files) and checking the
directories it will write to — every fault a one-line UserError naming the path, never a traceback or a hang.

- a file that is missing, a directory, a FIFO or device (reading one would block), unreadable, absurdly
  large, not UTF-8, not TOML (or a TOML file with a line of over 64 KiB), or nested deeper than any real file is
  refused;
- an output directory must exist as a writable directory or be creatable under one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from .errors import UserError

MAX_BYTES = 16 << 20  # no matrix, lock or knowledge file comes near this
MAX_DEPTH = 32  # tables and arrays nested deeper than this are no data builder reads
MAX_LINE = 64 << 10  # characters of one line of a TOML file builder reads (its longest real line: under 1,000)


NOT_REGULAR = "not a regular file (a FIFO, socket or device)"


class NotRegular(OSError):
    """A path that is a FIFO, a socket or a device where a file is read (read_regular): never opened to be read."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`: at most `limit` + 1 of them (a caller tells a file over `limit` by
    the length). Never blocks and never reads forever: a directory is IsADirectoryError and a FIFO, socket or device
    NotRegular before anything is opened, and the file is opened without blocking and checked again on the open
    descriptor (a FIFO put in its place after the first look is refused too). Other faults: the OSError."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(errno.EINVAL, NOT_REGULAR, str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, NOT_REGULAR, str(path))
        blocks, size = [], 0
        while size <= limit:
            block = os.read(fd, min(1 << 20, limit + 1 - size))
            if not block:
                break
            blocks.append(block)
            size += len(block)
        return b"".join(blocks)
    finally:
        os.close(fd)


def read_bytes(path: Path, what: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (read_regular), or a UserError naming the path and `what`
    it was read as: missing, a directory, a FIFO, socket or device, unreadable, too large."""
    path = Path(path)
    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a {what}") from None
    except NotRegular:
        raise UserError(f"{path}: {NOT_REGULAR}; the {what} must be a file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if len(data) > limit:
        size = max(len(data), _size(path))
        raise UserError(f"{path}: {size} bytes; a {what} is never that large")
    return data


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def read_text(path: Path, what: str) -> str:
    """The text of a regular UTF-8 file (read_bytes), or a UserError saying what is wrong with it."""
    path = Path(path)
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: the {what} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None


def _depth(value, limit: int) -> int:
    """Nesting depth of a parsed TOML value, stopping early past `limit`."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        v, d = stack.pop()
        if d > limit:
            return d
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _parsed(path: Path, what: str, text: str, parse, malformed: type[Exception], says: str, nests: str):
    """`parse(text)`, or a UserError: malformed (`says` and the parser's words), absurdly nested."""
    try:
        data = parse(text)
    except malformed as exc:
        raise UserError(says.format(path=path, exc=exc, what=what)) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a {what}") from None
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise UserError(f"{path}: {nests} nested more than {MAX_DEPTH} deep; not a {what}")
    return data


def _long_line(path: Path, what: str, text: str) -> None:
    """Refuse a line longer than MAX_LINE before the TOML parser reads it (pure Python: megabytes of one string
    take it seconds, and every check after it would quote the value)."""
    if len(text) > MAX_LINE:
        lengths = [len(line) for line in text.split("\n")]
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[longest] > MAX_LINE:
            raise UserError(f"{path}: line {longest + 1} is {lengths[longest]} characters long; no line of a {what} "
                            f"is longer than {MAX_LINE}")


def load_toml(path: Path, what: str, fix: str = "") -> dict:
    """A TOML file as a dict, or a UserError: file faults (read_text), a line longer than MAX_LINE, malformed TOML,
    absurd nesting."""
    text = read_text(path, what)
    _long_line(path, what, text)
    return _parsed(path, what, text, tomllib.loads, tomllib.TOMLDecodeError,
                   "{path}: malformed TOML: {exc}" + fix.replace("{", "{{").replace("}", "}}"), "tables or arrays")


def load_json(path: Path, what: str, text: str | None = None):
    """A JSON file (or one line of one, `text`) parsed, or a UserError: file faults (read_text), malformed JSON,
    absurd nesting."""
    import json

    return _parsed(path, what, read_text(path, what) if text is None else text, json.loads, ValueError,
                   "{path}: not JSON ({exc}); not a {what}", "objects or arrays")


def writable_dir(path: Path, what: str) -> None:
    """Refuse (UserError) an output directory that cannot be written: a file in its place or above it, a
    read-only or unwritable ancestor. Creates nothing: a probe file in the nearest existing directory is
    removed again."""
    path = Path(path)
    probe_dir = path
    while True:
        try:
            st = probe_dir.stat()
        except FileNotFoundError:
            if probe_dir.parent == probe_dir:
                raise UserError(f"{what}: {path}: no existing directory above it") from None
            probe_dir = probe_dir.parent
            continue
        except NotADirectoryError:
            probe_dir = probe_dir.parent
            continue
        except OSError as exc:
            raise UserError(f"{what}: {path}: cannot use it: {exc.strerror or exc}") from None
        break
    if not stat.S_ISDIR(st.st_mode):
        if probe_dir == path:
            raise UserError(f"{what}: {path} is a file, not a directory")
        raise UserError(f"{what}: {path} cannot be created: {probe_dir} is a file, not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".builder-write-check-", dir=probe_dir)
    except OSError as exc:
        where = path if probe_dir == path else f"{path} (in {probe_dir})"
        raise UserError(f"{what}: cannot write to {where}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(name)


@cache
def package_data(name: str) -> dict:
    """A TOML file of builder/data/, parsed once (callers copy before they change it)."""
    return tomllib.loads(resources.files("builder").joinpath("data", name).read_text())


def check_kind(path: Path, what: str, want: str = "any") -> None:
    """Refuse (UserError, one line naming `what` and the path) a path that exists but is not what a flag can use:
    a FIFO, socket or device (opening one blocks or reads forever), a symlink loop, a directory where a file goes
    (`want` "file") or a file where a directory goes ("directory"). Follows symlinks with stat, opens nothing; a
    path that does not exist (or whose parent is not a directory) is left to the check that creates or reads it."""
    import errno

    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{what}: {path}: cannot read or use it: a symlink loop ({exc.strerror})") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise UserError(f"{what}: {path}: cannot use it: {exc.strerror or exc}") from None
    mode = st.st_mode
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None)
    if kind:
        raise UserError(f"{what}: {path} is {kind}, not a {'directory' if want == 'directory' else 'regular file'}")
    if want == "file" and stat.S_ISDIR(mode):
        raise UserError(f"{what}: {path} is a directory, not a file")
    if want == "directory" and not stat.S_ISDIR(mode):
        raise UserError(f"{what}: {path} is a file, not a directory")


def sha256_file(path: Path) -> str:
    """The sha256 of a file's content, read in blocks."""
    with open(path, "rb") as fh:
        return sha256_stream(fh)


def sha256_stream(stream) -> str:
    """The sha256 of what a binary stream holds from where it stands (a file, a tar member), read in blocks."""
    h = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()
