"""What an engine's CMake configure downloads, read from the engine's own CMake files.

vLLM's configure step fetches external sources (CUTLASS, vllm-project/flash-attention, FlashMLA,
DeepGEMM, ...) with FetchContent at pinned revisions. Each of them can be pointed at a local
checkout through an override variable (`VLLM_FLASH_ATTN_SRC_DIR`, `FLASH_MLA_SRC_DIR`, ...),
read either from the environment (`if(DEFINED ENV{X})`) or as a CMake variable (`if(X)`).
A reproducible build fetches those sources at their pinned commits in a separate, cacheable
stage and sets the variables, so the compile itself needs no network.

This module reads CMakeLists.txt and every .cmake file it includes (from an unpacked tree or
straight from the sdist tarball), walks them the way a CUDA configure would (a small CMake
interpreter: set/include/if with three-valued conditions; what cannot be decided, e.g. a compiler
version, is explored on both sides), and returns, for each git or URL download:

- the FetchContent name, repository (``${VAR}`` resolved), GIT_TAG and whether it is a commit,
  GIT_SUBMODULES / GIT_SHALLOW / GIT_PROGRESS, SOURCE_SUBDIR, URL + URL_HASH;
- the override variable that skips the download: the guard ``if(X)`` / ``if(DEFINED ENV{X})``
  whose branch provides the same dependency from a local path, and whether the environment
  (``set(X $ENV{X})``), the CMake variable, or both reach it. A download with no such guard
  that is made available by name falls back to CMake's own
  ``FETCHCONTENT_SOURCE_DIR_<NAME>`` cache variable.

``render_fetch_script`` turns a plan into a POSIX shell snippet for a Dockerfile RUN (shallow
fetch of each commit), ``override_env`` into the variables the compile step sets.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tarfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Sequence

from .errors import UserError

__all__ = [
    "CMakeParseError",
    "PlanUnusable",
    "ExternalSource",
    "CUDA_CONTEXT",
    "fetch_plan_from_tree",
    "fetch_plan_from_sdist",
    "plan_document",
    "plan_document_from_tree",
    "render_fetch_script",
    "cmake_overrides_file",
    "dockerfile_run",
    "override_env",
    "cmake_args_mode",
    "load_plan_file",
    "write_plan_file",
    "plan_from_document",
]

# What a CUDA configure of vLLM knows before its own code runs: torch's config found CUDA and no
# HIP. Everything else the interpreter does not know stays unknown.
CUDA_CONTEXT: Mapping[str, str] = {
    "VLLM_TARGET_DEVICE": "cuda",
    "CUDA_FOUND": "TRUE",
    "HIP_FOUND": "FALSE",
    "PYTORCH_FOUND_HIP": "FALSE",
    "CMAKE_SYSTEM_NAME": "Linux",
    "UNIX": "1",
    "WIN32": "",
    "APPLE": "",
    "MSVC": "",
}

_ROOT = "/__src__"  # virtual absolute path of the source tree inside the interpreter
_FETCHED = "/__fetched__"  # virtual root of the downloads: <name>_SOURCE_DIR is _FETCHED/<name> once populated
_HEX_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_NAME_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_FETCH_COMMANDS = ("fetchcontent_declare", "fetchcontent_populate", "externalproject_add")


class CMakeParseError(UserError):
    """The CMake code could not be read or a download's location could not be resolved."""


class PlanUnusable(UserError):
    """A plan that was read but cannot drive a sealed compile (a download without a hash or without an override)."""


@dataclass(frozen=True)
class ExternalSource:
    """One download of the engine's CMake configure."""

    name: str  # FetchContent name, lowercased (also the directory under the fetch destination)
    repository: str  # git URL, or the archive URL when kind == "url"
    commit: str  # GIT_TAG as written after ${} expansion (a commit when reproducible); "" for URLs
    override_var: str  # the variable that, when set, skips the download ("" when none exists)
    override_kind: str  # "env" | "cmake" ("" when none): the preferred way to set it
    subdir: str | None  # SOURCE_SUBDIR
    reproducible: bool  # GIT_TAG is a full commit id / URL has URL_HASH
    # --- details -------------------------------------------------------------------------
    kind: str = "git"  # "git" | "url"
    override_kinds: tuple[str, ...] = ()  # every way the CMake code honours the override
    override_subpath: str | None = None  # the override must point at <checkout>/<this>
    override_builtin: bool = False  # the override is CMake's FETCHCONTENT_SOURCE_DIR_<NAME>
    submodules: tuple[str, ...] | None = None  # GIT_SUBMODULES; None = not given (all, recursive)
    shallow: bool | None = None  # GIT_SHALLOW
    progress: bool | None = None  # GIT_PROGRESS
    url_hash: str | None = None  # "SHA256=..." for URL downloads
    patch_command: str | None = None  # PATCH_COMMAND, tree paths relative (skipped if overridden)
    cmake_file: str = ""  # file (relative to the tree) and line of the declare
    line: int = 0
    # SOURCE_DIR inside another download's checkout ("<other>/<path>", e.g. "repo-flashmla/csrc/cutlass"): the
    # other's CMake code reads it there, so it is fetched into that place of the other's checkout
    inside: str | None = None


# ---------------------------------------------------------------------------------------------
# Lexer and block structure
# ---------------------------------------------------------------------------------------------


@dataclass
class _Arg:
    text: str
    quoted: bool  # quoted or bracket argument


@dataclass
class _Cmd:
    name: str  # lowercased
    args: list[_Arg]
    file: str
    line: int


@dataclass
class _If:
    branches: list[tuple[list[_Arg] | None, list]]  # (condition or None for else, body)
    file: str
    line: int


@dataclass
class _Block:
    kind: str  # foreach | while | function | macro | block
    args: list[_Arg]
    body: list
    file: str
    line: int


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


def _skip_bracket(text: str, i: int, file: str, line: int) -> tuple[str, int, int]:
    """At a bracket opener `[==[`: return (content, index after the closer, line)."""
    m = _BRACKET_OPEN.match(text, i)
    assert m
    close = "]" + m.group(1) + "]"
    end = text.find(close, m.end())
    if end < 0:
        raise CMakeParseError(f"{file}:{line}: unterminated bracket argument")
    content = text[m.end():end]
    line += content.count("\n")
    if content.startswith("\r\n"):
        content = content[2:]
    elif content.startswith("\n"):
        content = content[1:]
    return content, end + len(close), line


def _skip_comment(text: str, i: int, file: str, line: int) -> tuple[int, int]:
    """At '#': skip a bracket comment or the rest of the line (not the newline)."""
    if _BRACKET_OPEN.match(text, i + 1):
        _, j, line = _skip_bracket(text, i + 1, file, line)
        return j, line
    j = text.find("\n", i)
    return (len(text) if j < 0 else j), line


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", ";": "\\;", '"': '"', "\\": "\\", " ": " ",
            "$": "$", "(": "(", ")": ")", "#": "#", "@": "@", "^": "^"}


def _lex_args(text: str, i: int, file: str, line: int) -> tuple[list[_Arg], int, int]:
    args: list[_Arg] = []
    depth = 1
    n = len(text)
    while True:
        if i >= n:
            raise CMakeParseError(f"{file}:{line}: unterminated command arguments")
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            i, line = _skip_comment(text, i, file, line)
        elif c == "(":
            depth += 1
            args.append(_Arg("(", False))
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
            if depth == 0:
                return args, i, line
            args.append(_Arg(")", False))
        elif c == '"':
            i += 1
            buf = []
            while True:
                if i >= n:
                    raise CMakeParseError(f"{file}:{line}: unterminated quoted argument")
                c = text[i]
                if c == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt == "\n":  # line continuation
                        line += 1
                    else:
                        buf.append(_ESCAPES.get(nxt, nxt))
                    i += 2
                    continue
                if c == '"':
                    i += 1
                    break
                if c == "\n":
                    line += 1
                buf.append(c)
                i += 1
            args.append(_Arg("".join(buf), True))
        elif c == "[" and _BRACKET_OPEN.match(text, i):
            content, i, line = _skip_bracket(text, i, file, line)
            args.append(_Arg(content, True))
        else:
            buf = []
            while i < n:
                c = text[i]
                if c in " \t\r\n()#":
                    break
                if c == "\\" and i + 1 < n:
                    buf.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                    i += 2
                    continue
                if c == '"':  # legacy: a quoted part inside an unquoted argument
                    j = text.find('"', i + 1)
                    if j < 0:
                        raise CMakeParseError(f"{file}:{line}: unterminated quote")
                    buf.append(text[i:j + 1])
                    line += text.count("\n", i, j)
                    i = j + 1
                    continue
                buf.append(c)
                i += 1
            args.append(_Arg("".join(buf), False))


def _lex(text: str, file: str) -> list[_Cmd]:
    cmds: list[_Cmd] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r\f\ufeff":
            i += 1
        elif c == "#":
            i, line = _skip_comment(text, i, file, line)
        else:
            m = _IDENT.match(text, i)
            if not m:
                raise CMakeParseError(f"{file}:{line}: unexpected character {c!r}")
            start = line
            i = m.end()
            while i < n and text[i] in " \t":
                i += 1
            if i >= n or text[i] != "(":
                raise CMakeParseError(f"{file}:{line}: expected '(' after {m.group(0)}")
            args, i, line = _lex_args(text, i + 1, file, line)
            cmds.append(_Cmd(m.group(0).lower(), args, file, start))
    return cmds


_BLOCK_ENDS = {"foreach": "endforeach", "while": "endwhile", "function": "endfunction",
               "macro": "endmacro", "block": "endblock"}


def _structure(cmds: list[_Cmd], file: str) -> list:
    """Group flat commands into if-chains and blocks."""
    root: list = []
    stack: list[tuple[object, list]] = [(None, root)]
    for cmd in cmds:
        top, body = stack[-1]
        if cmd.name == "if":
            node = _If([(cmd.args, [])], cmd.file, cmd.line)
            body.append(node)
            stack.append((node, node.branches[0][1]))
        elif cmd.name in ("elseif", "else"):
            if not isinstance(top, _If):
                raise CMakeParseError(f"{file}:{cmd.line}: {cmd.name}() without if()")
            branch: tuple = (cmd.args if cmd.name == "elseif" else None, [])
            top.branches.append(branch)
            stack[-1] = (top, branch[1])
        elif cmd.name == "endif":
            if not isinstance(top, _If):
                raise CMakeParseError(f"{file}:{cmd.line}: endif() without if()")
            stack.pop()
        elif cmd.name in _BLOCK_ENDS:
            node = _Block(cmd.name, cmd.args, [], cmd.file, cmd.line)
            body.append(node)
            stack.append((node, node.body))
        elif cmd.name in _BLOCK_ENDS.values():
            if not (isinstance(top, _Block) and _BLOCK_ENDS[top.kind] == cmd.name):
                raise CMakeParseError(f"{file}:{cmd.line}: unmatched {cmd.name}()")
            stack.pop()
        else:
            body.append(cmd)
    if len(stack) != 1:
        top = stack[-1][0]
        raise CMakeParseError(f"{file}:{getattr(top, 'line', '?')}: block not closed")
    return root


def _walk(nodes: Iterable) -> Iterable[_Cmd]:
    """Every command in nodes, all branches and blocks included."""
    for node in nodes:
        if isinstance(node, _Cmd):
            yield node
        elif isinstance(node, _If):
            for _, body in node.branches:
                yield from _walk(body)
        else:
            yield from _walk(node.body)


def _walk_ifs(nodes: Iterable) -> Iterable[_If]:
    for node in nodes:
        if isinstance(node, _If):
            yield node
            for _, body in node.branches:
                yield from _walk_ifs(body)
        elif isinstance(node, _Block):
            yield from _walk_ifs(node.body)


# ---------------------------------------------------------------------------------------------
# Source trees: a directory or an sdist read in place
# ---------------------------------------------------------------------------------------------


def _wanted(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (
        name == "CMakeLists.txt"
        or name.endswith(".cmake")
        or rel in ("setup.py", "pyproject.toml", "rust-toolchain.toml", "rust-toolchain", "Cargo.lock",
                   "rust/Cargo.lock")
    )


class _Tree:
    def __init__(self, files: dict[str, str], label: str):
        self.files = files  # relative posix path -> text
        self.label = label

    def read(self, rel: str) -> str | None:
        return self.files.get(rel)

    @classmethod
    def from_dir(cls, root: Path) -> "_Tree":
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
    def from_sdist(cls, path: Path) -> "_Tree":
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


# ---------------------------------------------------------------------------------------------
# The interpreter
# ---------------------------------------------------------------------------------------------

_TRUE_CONSTS = {"1", "ON", "YES", "TRUE", "Y"}
_FALSE_CONSTS = {"0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND", ""}
_UNARY = {"EXISTS", "COMMAND", "DEFINED", "POLICY", "TARGET", "TEST", "IS_DIRECTORY",
          "IS_SYMLINK", "IS_ABSOLUTE", "IS_READABLE", "IS_WRITABLE", "IS_EXECUTABLE"}
_BINARY = {"LESS", "GREATER", "EQUAL", "LESS_EQUAL", "GREATER_EQUAL", "STRLESS", "STRGREATER",
           "STREQUAL", "STRLESS_EQUAL", "STRGREATER_EQUAL", "VERSION_LESS", "VERSION_GREATER",
           "VERSION_EQUAL", "VERSION_LESS_EQUAL", "VERSION_GREATER_EQUAL", "MATCHES", "IN_LIST",
           "PATH_EQUAL"}
_FETCH_KEYWORDS = {
    "GIT_REPOSITORY", "GIT_TAG", "GIT_SHALLOW", "GIT_PROGRESS", "GIT_SUBMODULES",
    "GIT_SUBMODULES_RECURSE", "GIT_REMOTE_NAME", "GIT_CONFIG", "GIT_REMOTE_UPDATE_STRATEGY",
    "URL", "URL_HASH", "URL_MD5", "DOWNLOAD_NAME", "DOWNLOAD_EXTRACT_TIMESTAMP",
    "DOWNLOAD_NO_EXTRACT", "DOWNLOAD_NO_PROGRESS", "DOWNLOAD_COMMAND", "SOURCE_DIR", "BINARY_DIR",
    "SOURCE_SUBDIR", "SUBBUILD_DIR", "CONFIGURE_COMMAND", "BUILD_COMMAND", "INSTALL_COMMAND",
    "TEST_COMMAND", "UPDATE_COMMAND", "PATCH_COMMAND", "UPDATE_DISCONNECTED", "PREFIX", "TMP_DIR",
    "STAMP_DIR", "LOG_DIR", "DOWNLOAD_DIR", "INSTALL_DIR", "EXCLUDE_FROM_ALL", "SYSTEM",
    "OVERRIDE_FIND_PACKAGE", "FIND_PACKAGE_ARGS", "QUIET", "CMAKE_ARGS", "CMAKE_CACHE_ARGS",
    "CMAKE_GENERATOR", "DEPENDS", "LIST_SEPARATOR", "TLS_VERIFY", "TLS_CAINFO", "HTTP_USERNAME",
    "HTTP_PASSWORD", "HTTP_HEADER", "NETRC", "NETRC_FILE", "INACTIVITY_TIMEOUT", "TIMEOUT",
    "LOG_DOWNLOAD", "LOG_UPDATE", "LOG_PATCH", "LOG_CONFIGURE", "LOG_BUILD", "LOG_INSTALL",
    "USES_TERMINAL_DOWNLOAD", "BUILD_IN_SOURCE", "BUILD_ALWAYS", "BUILD_BYPRODUCTS",
    "STEP_TARGETS", "INDEPENDENT_STEP_TARGETS", "EXCLUDE_FROM_ALL",
}
_NO_OUTPUTS = {"message", "install", "project", "cmake_minimum_required", "cmake_policy",
               "add_custom_target", "add_custom_command", "add_library", "add_executable",
               "add_dependencies", "target_compile_definitions", "target_compile_options",
               "target_include_directories", "target_link_libraries", "target_link_options",
               "set_target_properties", "set_source_files_properties", "add_compile_options",
               "add_compile_definitions", "include_directories", "link_directories",
               "enable_language", "include_guard", "mark_as_advanced"}
_SPECIAL_DIRS = {"CMAKE_CURRENT_LIST_DIR", "CMAKE_SOURCE_DIR", "CMAKE_CURRENT_SOURCE_DIR",
                 "PROJECT_SOURCE_DIR"}
_VAR_REF = re.compile(r"\$(ENV|CACHE)?\{([^${}]*)\}")


class _Unknown:
    """A value the interpreter cannot know (compiler version, a path under the build dir...)."""


@dataclass
class _Guard:
    var: str
    kinds: tuple[str, ...]  # "env", "cmake"
    provides: frozenset[str]  # lowercased dependency names the guarded branch provides locally
    cond: tuple[str, ...]  # normalised condition text (to find later branches on it)
    file: str
    line: int


@dataclass
class _Found:
    name: str
    cmd: _Cmd
    kw: dict[str, list[str]]
    guards: list[_Guard]


class _Return(Exception):
    pass


def _cond_key(args: Sequence[_Arg]) -> tuple[str, ...]:
    return tuple(a.text for a in args)


def _local_provisions(body: list) -> set[str]:
    """Names of dependencies a branch provides from a local path, without downloading."""
    names: set[str] = set()
    for cmd in _walk(body):
        if cmd.name in _FETCH_COMMANDS and cmd.args:
            words = {a.text for a in cmd.args if not a.quoted}
            if "SOURCE_DIR" in words and not words & {"GIT_REPOSITORY", "URL", "SVN_REPOSITORY",
                                                      "HG_REPOSITORY", "DOWNLOAD_COMMAND"}:
                names.add(cmd.args[0].text.lower())
        elif cmd.name == "set" and cmd.args:
            m = re.fullmatch(r"([A-Za-z0-9_.+-]+)_SOURCE_DIR", cmd.args[0].text)
            if m and len(cmd.args) > 1 and not m.group(1).startswith(("CMAKE_", "PROJECT")):
                names.add(m.group(1).lower())
    return names


class _Interp:
    def __init__(self, tree: _Tree, context: Mapping[str, str], env: Mapping[str, str]):
        self.tree = tree
        self.vars: dict[str, object] = dict(context)  # str, or _Unknown
        self.assumed_unset: set[str] = set()
        self.env = dict(env)
        self.found: list[_Found] = []
        self.made_available: set[str] = set()  # MakeAvailable(name) / Populate(name) one-arg form
        self.guard_stack: list[_Guard] = []
        self.files: dict[str, list] = {}  # visited file -> structured nodes
        self.depth = 0
        for k, v in (("CMAKE_SOURCE_DIR", _ROOT), ("PROJECT_SOURCE_DIR", _ROOT),
                     ("CMAKE_CURRENT_SOURCE_DIR", _ROOT), ("CMAKE_CURRENT_LIST_DIR", _ROOT)):
            self.vars.setdefault(k, v)

    # -- files -----------------------------------------------------------------------------
    def load(self, rel: str) -> list:
        if rel not in self.files:
            text = self.tree.read(rel)
            if text is None:
                raise CMakeParseError(f"{self.tree.label}: no {rel}")
            self.files[rel] = _structure(_lex(text, rel), rel)
        return self.files[rel]

    def run_file(self, rel: str) -> None:
        nodes = self.load(rel)
        saved = self.vars.get("CMAKE_CURRENT_LIST_DIR")
        self.vars["CMAKE_CURRENT_LIST_DIR"] = str(PurePosixPath(_ROOT, rel).parent)
        self.depth += 1
        if self.depth > 40:
            raise CMakeParseError(f"{rel}: include nesting too deep")
        try:
            self.run(nodes, definite=True)
        except _Return:
            pass
        finally:
            self.depth -= 1
            self.vars["CMAKE_CURRENT_LIST_DIR"] = saved

    def _rel(self, path: str) -> str | None:
        """A virtual absolute or source-relative path -> path relative to the tree."""
        if path.startswith(_ROOT + "/"):
            path = path[len(_ROOT) + 1:]
        elif path.startswith("/") or not path:
            return None
        else:
            base = self.vars.get("CMAKE_CURRENT_SOURCE_DIR")
            base = base if isinstance(base, str) else _ROOT
            full = PurePosixPath(base, path).as_posix()
            if not full.startswith(_ROOT + "/"):
                return None
            path = full[len(_ROOT) + 1:]
        parts: list[str] = []
        for p in path.split("/"):
            if p in ("", "."):
                continue
            if p == "..":
                if not parts:
                    return None
                parts.pop()
            else:
                parts.append(p)
        return "/".join(parts)

    # -- values ----------------------------------------------------------------------------
    def expand(self, text: str) -> tuple[str, bool]:
        """Expand ${} / $ENV{} / $CACHE{} references; returns (text, fully_known)."""
        known = True

        def sub(m: re.Match) -> str:
            nonlocal known
            kind, name = m.group(1), m.group(2)
            if kind == "ENV":
                return self.env.get(name, "")
            v = self.vars.get(name)
            if isinstance(v, str):
                return v
            if v is None and name in self.assumed_unset:
                return ""
            known = False
            return ""

        for _ in range(50):
            new = _VAR_REF.sub(sub, text)
            if new == text:
                break
            text = new
        return text, known

    def expand_args(self, args: Sequence[_Arg]) -> list[tuple[str, bool, bool]]:
        """-> [(text, quoted, known)]; unquoted arguments split on ';' like CMake does."""
        out: list[tuple[str, bool, bool]] = []
        for a in args:
            text, known = self.expand(a.text)
            if a.quoted:
                out.append((text, True, known))
            else:
                had_ref = "${" in a.text or "$ENV{" in a.text
                pieces = [p for p in re.split(r"(?<!\\);", text)] if had_ref else [text]
                if had_ref:
                    pieces = [p for p in pieces if p != ""]
                out.extend((p, False, known) for p in pieces)
        return out

    # -- conditions (three-valued: True / False / None = unknown) ---------------------------
    def _operand(self, tok: tuple[str, bool, bool]) -> str | None:
        text, quoted, known = tok
        if not known:
            return None
        if quoted:
            return text
        v = self.vars.get(text)
        if isinstance(v, str):
            return v
        if isinstance(v, _Unknown):
            return None
        if text in self.assumed_unset:
            return text
        if _IDENT.fullmatch(text) and not text.upper() in _TRUE_CONSTS | _FALSE_CONSTS:
            return None  # a variable the interpreter never saw assigned
        return text

    def _truth(self, tok: tuple[str, bool, bool]) -> bool | None:
        text, quoted, known = tok
        if not known:
            return None
        up = text.upper()
        if up in _TRUE_CONSTS or re.fullmatch(r"-?[0-9]*\.?[0-9]+", text) and float(text) != 0:
            return True
        if up in _FALSE_CONSTS or up.endswith("-NOTFOUND"):
            return False
        if quoted:
            return False
        v = self.vars.get(text)
        if isinstance(v, str):
            vu = v.upper()
            return not (vu in _FALSE_CONSTS or vu.endswith("-NOTFOUND"))
        if isinstance(v, _Unknown):
            return None
        if text in self.assumed_unset:
            return False
        return None

    def _defined(self, text: str) -> bool | None:
        m = re.fullmatch(r"ENV\{(.*)\}", text)
        if m:
            return m.group(1) in self.env
        m = re.fullmatch(r"CACHE\{(.*)\}", text)
        name = m.group(1) if m else text
        if name in self.vars:
            return True if isinstance(self.vars[name], str) else None
        if name in self.assumed_unset:
            return False
        return None

    def evaluate(self, args: Sequence[_Arg]) -> bool | None:
        toks = self.expand_args(args)
        # Keep "(" and ")" from the raw arguments as grouping tokens.
        pos = 0

        def peek() -> tuple[str, bool, bool] | None:
            return toks[pos] if pos < len(toks) else None

        def take() -> tuple[str, bool, bool]:
            nonlocal pos
            pos += 1
            return toks[pos - 1]

        def is_kw(tok, words) -> bool:
            return tok is not None and not tok[1] and tok[0] in words

        def or_expr() -> bool | None:
            v = and_expr()
            while is_kw(peek(), {"OR"}):
                take()
                w = and_expr()
                v = True if (v is True or w is True) else (None if None in (v, w) else False)
            return v

        def and_expr() -> bool | None:
            v = not_expr()
            while is_kw(peek(), {"AND"}):
                take()
                w = not_expr()
                v = False if (v is False or w is False) else (None if None in (v, w) else True)
            return v

        def not_expr() -> bool | None:
            if is_kw(peek(), {"NOT"}):
                take()
                v = not_expr()
                return None if v is None else not v
            return primary()

        def primary() -> bool | None:
            tok = peek()
            if tok is None:
                return None
            if is_kw(tok, {"("}):
                take()
                v = or_expr()
                if is_kw(peek(), {")"}):
                    take()
                return v
            if is_kw(tok, _UNARY):
                op = take()[0]
                arg = take() if peek() is not None else ("", True, True)
                if op == "DEFINED":
                    return self._defined(arg[0]) if arg[2] else None
                if op == "IS_ABSOLUTE":
                    return arg[0].startswith("/") if arg[2] else None
                return None  # EXISTS, TARGET, COMMAND, ...: facts of a real configure
            left = take()
            if is_kw(peek(), _BINARY):
                op = take()[0]
                right = take() if peek() is not None else ("", True, True)
                return self._compare(op, left, right)
            return self._truth(left)

        try:
            result = or_expr()
        except (IndexError, ValueError):
            return None
        return result if pos == len(toks) else None

    def _compare(self, op: str, left, right) -> bool | None:
        if op == "IN_LIST":
            lv = self._operand(left)
            rv = self.vars.get(right[0]) if right[2] else None
            if lv is None or not isinstance(rv, str):
                return None
            return lv in rv.split(";")
        a, b = self._operand(left), self._operand(right)
        if a is None or b is None:
            return None
        if op == "STREQUAL":
            return a == b
        if op == "MATCHES":
            try:
                return re.search(b, a) is not None
            except re.error:
                return None
        if op.startswith("VERSION_"):
            va, vb = _version_tuple(a), _version_tuple(b)
            rel = op[len("VERSION_"):]
        elif op.startswith("STR"):
            va, vb, rel = a, b, op[3:]
        else:
            try:
                va, vb = float(a), float(b)
            except ValueError:
                return False
            rel = op
        return {"LESS": va < vb, "GREATER": va > vb, "EQUAL": va == vb,
                "LESS_EQUAL": va <= vb, "GREATER_EQUAL": va >= vb}.get(rel)

    # -- guards ----------------------------------------------------------------------------
    def _guard_of(self, cond: list[_Arg], body: list, file: str, line: int) -> _Guard | None:
        provides = _local_provisions(body)
        if not provides:
            return None
        words = [a.text for a in cond]
        env_var = cmake_var = None
        if len(words) == 1 and not cond[0].quoted and _IDENT.fullmatch(words[0]):
            cmake_var = words[0]
        elif len(words) == 2 and words[0] == "DEFINED":
            m = re.fullmatch(r"ENV\{([A-Za-z_][A-Za-z0-9_]*)\}", words[1])
            if m:
                env_var = m.group(1)
            elif _IDENT.fullmatch(words[1]):
                cmake_var = words[1]
        if env_var:
            return _Guard(env_var, ("env",), frozenset(provides), _cond_key(cond), file, line)
        if cmake_var:
            return _Guard(cmake_var, ("cmake",), frozenset(provides), _cond_key(cond), file, line)
        return None

    def _is_default_for_unset(self, cond: list[_Arg], body: list) -> bool:
        """`if(NOT DEFINED X)` whose branch sets X: a default for a variable the configure may be given with -D
        (sgl-kernel's GITHUB_ARTIFACTORY, a mirror host). The configure modelled here is builder's, which passes
        no such -D, and X was never assigned before: the default applies."""
        words = [a.text for a in cond]
        if len(words) != 3 or words[:2] != ["NOT", "DEFINED"] or any(a.quoted for a in cond):
            return False
        var = words[2]
        if not _IDENT.fullmatch(var) or var in self.vars:
            return False
        return any(c.name == "set" and c.args and c.args[0].text == var for c in _walk(body))

    # -- execution -------------------------------------------------------------------------
    def run(self, nodes: list, definite: bool) -> None:
        for node in nodes:
            if isinstance(node, _Cmd):
                self.command(node, definite)
            elif isinstance(node, _If):
                self.run_if(node, definite)
            elif isinstance(node, _Block):
                if node.kind in ("foreach", "while", "block"):
                    self.run(node.body, definite=False if node.kind == "while" else definite)
                # function / macro bodies only run when called: not followed

    def run_if(self, node: _If, definite: bool) -> None:
        """Run the branch that is taken; when that cannot be decided, every branch that may be.

        Variables set in branches that may or may not run end up unknown afterwards unless all
        the possible outcomes agree.
        """
        before = dict(self.vars)
        outcomes: list[dict[str, object]] = []
        fall_through = True  # no branch taken is still possible
        still_definite = definite
        pending_guards: list[_Guard] = []
        for cond, body in node.branches:
            if cond is None:
                value: bool | None = True
            else:
                guard = self._guard_of(cond, body, node.file, node.line)
                if guard is not None:
                    # The fetch path: the override is not set.
                    self.assumed_unset.add(guard.var)
                    before.pop(guard.var, None)
                    if "env" in guard.kinds:
                        self.env.pop(guard.var, None)
                    pending_guards.append(guard)
                    continue
                self.vars = dict(before)
                value = self.evaluate(cond)
                if value is None and self._is_default_for_unset(cond, body):
                    value = True
            if value is False:
                continue
            self.vars = dict(before)
            self.guard_stack.extend(pending_guards)
            try:
                self.run(body, definite=still_definite and value is True)
            finally:
                del self.guard_stack[len(self.guard_stack) - len(pending_guards):]
            outcomes.append(self.vars)
            if value is True:
                fall_through = False
                break
            still_definite = False  # an unknown branch may or may not have been taken
        if not outcomes:
            self.vars = before
            return
        if len(outcomes) == 1 and not fall_through:
            self.vars = outcomes[0]
            return
        states = outcomes + ([before] if fall_through else [])
        missing = object()
        merged: dict[str, object] = {}
        for key in set().union(*states):
            values = [st.get(key, missing) for st in states]
            first = values[0]
            if all(isinstance(v, str) and v == first for v in values):
                merged[key] = first
            elif all(v is missing for v in values):
                continue
            else:
                merged[key] = _Unknown()
        self.vars = merged

    def command(self, cmd: _Cmd, definite: bool) -> None:
        name = cmd.name
        if name in ("set", "option"):
            self.cmd_set(cmd)
        elif name == "unset" and cmd.args:
            var, _ = self.expand(cmd.args[0].text)
            self.vars.pop(var, None)
        elif name == "include" and cmd.args:
            target, known = self.expand(cmd.args[0].text)
            if not known:
                return
            rel = self._rel(target)
            if rel is not None and self.tree.read(rel) is not None:
                self.run_file(rel)
            # else: a CMake module (FetchContent, CheckCXXCompilerFlag, ...) or a generated file
        elif name == "add_subdirectory" and cmd.args:
            sub, known = self.expand(cmd.args[0].text)
            rel = self._rel(sub) if known else None
            if rel is not None and self.tree.read(f"{rel}/CMakeLists.txt") is not None:
                saved = dict(self.vars)
                self.vars["CMAKE_CURRENT_SOURCE_DIR"] = f"{_ROOT}/{rel}"
                try:
                    self.run_file(f"{rel}/CMakeLists.txt")
                finally:
                    self.vars = saved
        elif name == "return":
            if definite:
                raise _Return()
        elif name in _FETCH_COMMANDS:
            self.cmd_fetch(cmd)
        elif name == "fetchcontent_makeavailable":
            for a in cmd.args:
                text, _ = self.expand(a.text)
                self.made_available.add(text.lower())
                self._populated(text.lower())
        elif name in ("list", "string", "math", "get_filename_component", "cmake_path",
                      "file", "execute_process", "find_program", "find_package", "find_path",
                      "find_library", "get_property", "get_target_property"):
            self.cmd_unknown_outputs(cmd)
        elif name not in _NO_OUTPUTS:
            # An unmodelled command (a function of the project, ...) may set variables: the
            # ones whose names it takes as arguments become unknown.
            self.cmd_unknown_outputs(cmd)

    def cmd_set(self, cmd: _Cmd) -> None:
        toks = self.expand_args(cmd.args)
        if not toks:
            return
        var, _, known_name = toks[0]
        if not known_name:
            return
        rest = toks[1:]
        if cmd.name == "option":
            if var not in self.vars:
                default = rest[1][0] if len(rest) > 1 else "OFF"
                self.vars[var] = default
            return
        words = [t[0] for t in rest]
        cache = False
        if "CACHE" in words:
            i = words.index("CACHE")
            rest = rest[:i]
            cache = True
            force = "FORCE" in words[i:]
        if rest and rest[-1][0] == "PARENT_SCOPE" and not rest[-1][1]:
            rest = rest[:-1]
        if cache and not force and var in self.vars:
            return  # a cache set never overrides a value that is already there
        if not rest:
            self.vars.pop(var, None)
            return
        if all(t[2] for t in rest):
            self.vars[var] = ";".join(t[0] for t in rest)
            self.assumed_unset.discard(var)
        else:
            self.vars[var] = _Unknown()

    def cmd_unknown_outputs(self, cmd: _Cmd) -> None:
        # Output variables of these commands: mark every plain identifier argument that names
        # a known variable as unknown, except inputs that are obviously keywords.
        for a in cmd.args[1:] if cmd.name in ("list", "string", "file", "math", "cmake_path") \
                else cmd.args:
            t = a.text
            if not a.quoted and _IDENT.fullmatch(t) and t in self.vars \
                    and t not in CUDA_CONTEXT and t not in _SPECIAL_DIRS:
                self.vars[t] = _Unknown()

    def _populated(self, name: str) -> None:
        """FetchContent sets <lowercase name>_SOURCE_DIR once a declared download is populated; later code (a
        nested declare, include paths) refers to places inside it."""
        if any(f.name == name for f in self.found):
            self.vars.setdefault(f"{name}_SOURCE_DIR", f"{_FETCHED}/{name}")

    def cmd_fetch(self, cmd: _Cmd) -> None:
        if not cmd.args:
            return
        name_text, _ = self.expand(cmd.args[0].text)
        name = name_text.lower()
        if cmd.name == "fetchcontent_populate" and len(cmd.args) == 1:
            self.made_available.add(name)
            self._populated(name)
            return
        kw: dict[str, list[str]] = {}
        current: str | None = None
        unknown_in: set[str] = set()
        for a in cmd.args[1:]:
            if not a.quoted and a.text in _FETCH_KEYWORDS:
                current = a.text
                kw.setdefault(current, [])
                continue
            if current is None:
                continue
            text, known = self.expand(a.text)
            if not known:
                unknown_in.add(current)
            if a.quoted:
                kw[current].append(text)
            else:
                kw[current].extend(p for p in text.split(";") if p)
        if "GIT_REPOSITORY" not in kw and "URL" not in kw:
            return  # a local SOURCE_DIR declare: not a download
        for key in ("GIT_REPOSITORY", "GIT_TAG", "URL", "URL_HASH"):
            if key in unknown_in:
                raise CMakeParseError(
                    f"{cmd.file}:{cmd.line}: {name}: cannot resolve {key} "
                    f"({' '.join(a.text for a in cmd.args)})")
        guards = [g for g in self.guard_stack if name in g.provides]
        self.found.append(_Found(name, cmd, kw, guards))


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for p in v.split("."):
        m = re.match(r"\d+", p)
        out.append(int(m.group(0)) if m else 0)
    while len(out) < 4:
        out.append(0)
    return tuple(out)


def _bool_kw(values: list[str] | None) -> bool | None:
    if values is None:
        return None
    v = (values[0] if values else "").upper()
    return v in _TRUE_CONSTS


def _env_feeds(files: Mapping[str, list]) -> dict[str, set[str]]:
    """CMake variable -> environment variables copied into it by set(V $ENV{E})."""
    feeds: dict[str, set[str]] = {}
    for nodes in files.values():
        for cmd in _walk(nodes):
            if cmd.name == "set" and len(cmd.args) >= 2:
                for a in cmd.args[1:]:
                    for m in re.finditer(r"\$ENV\{([A-Za-z_][A-Za-z0-9_]*)\}", a.text):
                        feeds.setdefault(cmd.args[0].text, set()).add(m.group(1))
    return feeds


def _override_subpath(files: Mapping[str, list], guard: _Guard, name: str) -> str | None:
    """Where inside the checkout the override has to point.

    Found from an if-chain on the same condition that derives one path from
    ``${<name>_SOURCE_DIR}`` on the override side and another on the download side, e.g. vLLM's
    triton_kernels: "${triton_kernels_SOURCE_DIR}/" vs
    "${triton_kernels_SOURCE_DIR}/python/triton_kernels/triton_kernels/" -> the override must
    name <checkout>/python/triton_kernels/triton_kernels.
    """
    ref = "${" + name + "_SOURCE_DIR}"
    for nodes in files.values():
        for node in _walk_ifs(nodes):
            conds = [c for c, _ in node.branches]
            if conds[0] is None or _cond_key(conds[0]) != guard.cond or len(node.branches) < 2:
                continue
            over = {c.args[0].text: c.args[1].text for c in _walk(node.branches[0][1])
                    if c.name == "set" and len(c.args) >= 2}
            down = {c.args[0].text: c.args[1].text for c in _walk(node.branches[-1][1])
                    if c.name == "set" and len(c.args) >= 2}
            for var, over_val in over.items():
                down_val = down.get(var)
                if not down_val or not over_val.startswith(ref) or not down_val.startswith(ref):
                    continue
                o = over_val[len(ref):].strip("/")
                d = down_val[len(ref):].strip("/")
                if o == d:
                    continue
                if not o:
                    return d
                if d.startswith(o + "/"):
                    return d[len(o) + 1:]
    return None


def _relative(text: str | None) -> str | None:
    """Paths into the engine's tree are written relative to it."""
    return None if text is None else text.replace(_ROOT + "/", "")


def _to_source(found: _Found, interp: _Interp, feeds: Mapping[str, set[str]]) -> ExternalSource:
    kw = found.kw
    name = found.name
    if not _NAME_OK.fullmatch(name):
        raise CMakeParseError(f"{found.cmd.file}:{found.cmd.line}: unusable name {name!r}")
    if "URL" in kw:
        kind = "url"
        repository = kw["URL"][0] if kw["URL"] else ""
        commit = ""
        url_hash = (kw.get("URL_HASH") or [None])[0]
        if url_hash is None and kw.get("URL_MD5"):
            url_hash = "MD5=" + kw["URL_MD5"][0]
        reproducible = bool(url_hash)
    else:
        kind = "git"
        repository = (kw.get("GIT_REPOSITORY") or [""])[0]
        commit = (kw.get("GIT_TAG") or [""])[0]
        url_hash = None
        reproducible = bool(_HEX_COMMIT.fullmatch(commit))
    submodules = tuple(s for s in kw["GIT_SUBMODULES"] if s) if "GIT_SUBMODULES" in kw else None

    override_var, override_kind, kinds, builtin, subpath = "", "", (), False, None
    if found.guards:
        g = found.guards[-1]  # innermost guard that provides this name
        if g.kinds == ("env",):
            override_var, kinds = g.var, ("env",)
        else:
            env_names = feeds.get(g.var, set())
            if g.var in env_names:
                override_var, kinds = g.var, ("env", "cmake")
            elif env_names:
                override_var, kinds = sorted(env_names)[0], ("env",)
            else:
                override_var, kinds = g.var, ("cmake",)
        override_kind = kinds[0]
        subpath = _override_subpath(interp.files, g, name)
    elif name in interp.made_available:
        override_var = "FETCHCONTENT_SOURCE_DIR_" + name.upper()
        override_kind, kinds, builtin = "cmake", ("cmake",), True

    inside = None
    source_dir = (kw.get("SOURCE_DIR") or [None])[0]
    if source_dir and source_dir.startswith(_FETCHED + "/"):
        inside = PurePosixPath(source_dir[len(_FETCHED) + 1:]).as_posix()
        parent = inside.split("/", 1)[0]
        if "/" not in inside or ".." in inside.split("/"):
            raise CMakeParseError(f"{found.cmd.file}:{found.cmd.line}: {name}: SOURCE_DIR {source_dir!r} is not a "
                                  f"directory inside the checkout of {parent}")
        if not override_var:  # the nested download is made available by name only through its parent's code
            override_var = "FETCHCONTENT_SOURCE_DIR_" + name.upper()
            override_kind, kinds, builtin = "cmake", ("cmake",), True

    patch = kw.get("PATCH_COMMAND")
    return ExternalSource(
        name=name,
        repository=repository,
        commit=commit,
        override_var=override_var,
        override_kind=override_kind,
        subdir=_relative((kw.get("SOURCE_SUBDIR") or [None])[0]),
        reproducible=reproducible,
        kind=kind,
        override_kinds=kinds,
        override_subpath=subpath,
        override_builtin=builtin,
        submodules=submodules,
        shallow=_bool_kw(kw.get("GIT_SHALLOW")),
        progress=_bool_kw(kw.get("GIT_PROGRESS")),
        url_hash=url_hash,
        patch_command=_relative(" ".join(patch)) if patch else None,
        cmake_file=found.cmd.file,
        line=found.cmd.line,
        inside=inside,
    )


def _plan(tree: _Tree, context: Mapping[str, str] | None = None,
          env: Mapping[str, str] | None = None) -> list[ExternalSource]:
    if tree.read("CMakeLists.txt") is None:
        return []
    interp = _Interp(tree, CUDA_CONTEXT if context is None else context, env or {})
    interp.run_file("CMakeLists.txt")
    feeds = _env_feeds(interp.files)
    plan: list[ExternalSource] = []
    seen: dict[str, ExternalSource] = {}
    for f in interp.found:
        src = _to_source(f, interp, feeds)
        prev = seen.get(src.name)
        if prev is not None:
            if (prev.repository, prev.commit) != (src.repository, src.commit):
                raise CMakeParseError(
                    f"{src.name}: two different downloads may run in one configure "
                    f"({prev.cmake_file}:{prev.line} {prev.repository}@{prev.commit} and "
                    f"{src.cmake_file}:{src.line} {src.repository}@{src.commit})")
            continue
        seen[src.name] = src
        plan.append(src)
    return plan


def fetch_plan_from_tree(root: Path, *, context: Mapping[str, str] | None = None
                         ) -> list[ExternalSource]:
    """The downloads of a CUDA configure of the source tree at root (empty without CMake)."""
    return _plan(_Tree.from_dir(Path(root)), context)


def fetch_plan_from_sdist(path: Path, *, context: Mapping[str, str] | None = None
                          ) -> list[ExternalSource]:
    """Same as fetch_plan_from_tree, reading the sdist's members in place (no extraction)."""
    return _plan(_Tree.from_sdist(Path(path)), context)


# ---------------------------------------------------------------------------------------------
# Around the plan: setup.py's CMAKE_ARGS handling, Rust, the committed plan files
# ---------------------------------------------------------------------------------------------


def cmake_args_mode(setup_py: str | None, pyproject: str | None = None) -> str:
    """How the engine's setup.py passes $CMAKE_ARGS to cmake.

    "ignored": setup.py never reads it (vLLM up to 0.11), so -D cache variables cannot reach
    the configure; "split-on-whitespace": appended after str.split() (vLLM 0.12+), no shell
    quoting; "unknown": mentioned in a way this check does not recognise; "no-setup.py".
    Without a setup.py, a pyproject.toml whose build backend is scikit-build-core gives
    "scikit-build-core": defines reach cmake as pip's -Ccmake.define.NAME=VALUE.
    """
    if setup_py is None:
        if pyproject and re.search(r"""build-backend\s*=\s*["']scikit_build_core\.build["']""", pyproject):
            return "scikit-build-core"
        return "no-setup.py"
    if "CMAKE_ARGS" not in setup_py:
        return "ignored"
    if re.search(r"""environ\.get\(\s*["']CMAKE_ARGS["']\s*\)""", setup_py) and \
            re.search(r"\+=\s*\w+\.split\(\)", setup_py):
        return "split-on-whitespace"
    return "unknown"


def _rust_toolchain(tree: _Tree) -> str | None:
    text = tree.read("rust-toolchain.toml")
    if text is not None:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise CMakeParseError(f"rust-toolchain.toml: {e}") from e
        channel = data.get("toolchain", {}).get("channel")
        return str(channel) if channel is not None else None
    text = tree.read("rust-toolchain")
    if text is not None:
        return text.strip() or None
    return None


def _cargo_git_sources(tree: _Tree) -> list[dict[str, str]]:
    """Git dependencies pinned in Cargo.lock (cargo fetches them from their hosts)."""
    for rel in ("rust/Cargo.lock", "Cargo.lock"):
        text = tree.read(rel)
        if text is None:
            continue
        import tomllib

        out = []
        for pkg in tomllib.loads(text).get("package", []):
            src = pkg.get("source", "")
            if src.startswith("git+"):
                url, _, commit = src[4:].partition("#")
                out.append({"name": pkg["name"], "version": pkg.get("version", ""),
                            "repository": url.split("?", 1)[0], "commit": commit,
                            "lockfile": rel})
        return sorted(out, key=lambda d: d["name"])
    return []


def _notes(plan: Sequence[ExternalSource], mode: str) -> list[str]:
    notes = []
    for s in plan:
        if s.kind == "git" and not s.reproducible:
            notes.append(
                f"{s.name}: GIT_TAG {s.commit!r} is a tag or branch, not a commit: what it names "
                f"can move; pin the commit it resolves to when locking")
        if not s.override_var:
            notes.append(f"{s.name}: no override variable: the compile downloads it itself")
        if s.override_builtin:
            line = (f"{s.name}: the engine's CMake has no override of its own; CMake's "
                    f"FetchContent honours the cache variable {s.override_var}, which reaches "
                    f"cmake only as -D")
            if mode == "ignored":
                line += (" — and this version's setup.py ignores CMAKE_ARGS, so -D cannot pass "
                         "it; a file that sets it as a cache entry, named by the environment "
                         "variable CMAKE_TOOLCHAIN_FILE (CMake >= 3.21), does")
            notes.append(line)
        elif s.override_kind == "cmake" and mode == "ignored":
            notes.append(f"{s.name}: {s.override_var} is read only as a CMake variable and "
                         f"this version's setup.py ignores CMAKE_ARGS: pass it through a "
                         f"CMAKE_TOOLCHAIN_FILE that sets it as a cache entry")
        if s.override_subpath:
            notes.append(f"{s.name}: {s.override_var} must point at "
                         f"<checkout>/{s.override_subpath}, not at the checkout")
        if s.patch_command:
            notes.append(f"{s.name}: PATCH_COMMAND is skipped when the override is set; "
                         f"apply it in the fetch step: {s.patch_command}")
    return notes


def _jsonable(src: ExternalSource) -> dict:
    d = asdict(src)
    if d["inside"] is None:  # only nested downloads carry it (plan files written before it existed stay the same)
        del d["inside"]
    for k, v in d.items():
        if isinstance(v, tuple):
            d[k] = list(v)
    return d


def plan_document(sdist: Path, *, engine: str, version: str) -> dict:
    """Everything the fetch stage needs to know about one engine release, as plain data."""
    sdist = Path(sdist)
    return _document(_Tree.from_sdist(sdist), engine, version,
                     {"sdist": {"filename": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}})


def plan_document_from_tree(root: Path, *, engine: str, version: str, repository: str, commit: str,
                            subdir: str = ".", cuda: str = "") -> dict:
    """The same for a git source: `root` is the checkout of `commit`, the package lives in `subdir` of it.
    `cuda` ("13.0") is the toolkit the configure runs with: CMake code that picks a repository by CUDA_VERSION
    (sgl-kernel: DeepGEMM from one fork on 12.8, another elsewhere) takes that branch."""
    tree = _Tree.from_dir(Path(root) / subdir if subdir not in ("", ".") else Path(root))
    return _document(tree, engine, version,
                     {"git": {"repository": repository, "commit": commit, "subdir": subdir}}, cuda)


def cuda_context(cuda: str) -> dict[str, str]:
    """CUDA_CONTEXT plus the toolkit version find_package(CUDAToolkit) reports (major.minor of `cuda`)."""
    if not cuda:
        return dict(CUDA_CONTEXT)
    short = ".".join(cuda.split(".")[:2])
    return {**CUDA_CONTEXT, "CUDA_VERSION": short, "CUDAToolkit_VERSION": short}


def _document(tree: _Tree, engine: str, version: str, origin: dict, cuda: str = "") -> dict:
    """The plan document; a CMake form the reader cannot resolve makes a document that says so ("unresolved",
    with the file and line), so one package is UNPINNED and every other is still planned."""
    mode = cmake_args_mode(tree.read("setup.py"), tree.read("pyproject.toml"))
    head = {"engine": engine, "version": version, **origin, "target": "cuda", **({"cuda": cuda} if cuda else {})}
    try:
        plan = _plan(tree, cuda_context(cuda) if cuda else None)
        rust = _rust_toolchain(tree)
    except CMakeParseError as exc:
        return {**head, "cmake_args": mode, "unresolved": str(exc), "sources": [], "rust_toolchain": None,
                "cargo_git_sources": [], "notes": []}
    return {
        **head,
        "cmake_args": mode,
        "sources": [_jsonable(s) for s in plan],
        "rust_toolchain": rust,
        "cargo_git_sources": _cargo_git_sources(tree),
        "notes": _notes(plan, mode),
    }


def plan_from_document(doc: Mapping) -> list[ExternalSource]:
    out = []
    for d in doc.get("sources", []):
        d = dict(d)
        for k in ("override_kinds", "submodules"):
            if isinstance(d.get(k), list):
                d[k] = tuple(d[k])
        out.append(ExternalSource(**d))
    return out


def write_plan_file(doc: Mapping, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def load_plan_file(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise UserError(f"no fetch plan file {path}") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e}") from e


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

_HASH_TOOLS = {"SHA256": "sha256sum", "SHA512": "sha512sum", "SHA1": "sha1sum", "MD5": "md5sum",
               "SHA224": "sha224sum", "SHA384": "sha384sum"}


def _check_dest(dest: str) -> str:
    if not dest.startswith("/") or re.search(r"\s", dest):
        raise UserError(f"fetch destination must be an absolute path without spaces: {dest!r}")
    return dest.rstrip("/") or "/"


def cmake_overrides_file(plan: Sequence[ExternalSource], dest: str = "/opt/vllm-deps") -> str:
    """CMake code that sets every CMake-only override as a cache entry.

    For engines whose setup.py ignores CMAKE_ARGS: point the environment variable
    CMAKE_TOOLCHAIN_FILE (read by CMake >= 3.21 on a first configure) at a file with this content;
    CMake loads it during project(), before any FetchContent call.
    """
    dest = _check_dest(dest)
    lines = ["# Written by builder: local checkouts for the FetchContent downloads"]
    for s in plan:
        if s.override_var and s.override_kind == "cmake":
            path = _override_path(s, dest)
            lines.append(f'set({s.override_var} "{path}" CACHE PATH "" FORCE)')
    return "\n".join(lines) + "\n"


def _checkout_dir(s: ExternalSource, dest: str) -> str:
    return f"{dest}/{s.inside}" if s.inside else f"{dest}/{s.name}"


def _override_path(s: ExternalSource, dest: str) -> str:
    path = _checkout_dir(s, dest)
    if s.override_subpath:
        path += "/" + s.override_subpath.strip("/")
    return path


def render_fetch_script(plan: Sequence[ExternalSource], dest: str = "/opt/vllm-deps", *,
                        pins: Mapping[str, str] | None = None,
                        cmake_overrides: str | None = None) -> str:
    """A POSIX sh snippet (for a Dockerfile RUN) that fetches every source into dest/<name>.

    Git sources: `git init` + `git fetch --depth 1 origin <commit>` + `git checkout FETCH_HEAD`,
    then the commit is verified and submodules are fetched the way FetchContent would (all,
    recursively, unless GIT_SUBMODULES names some). A tag or branch (not reproducible) is
    fetched by name unless `pins` maps the source name to a commit; the resolved commit is
    printed. URL sources are downloaded, checked against URL_HASH and unpacked. With
    `cmake_overrides` (a path), the script also writes cmake_overrides_file() there.

    Every line is one complete command or a comment, so the snippet works as a heredoc RUN, a
    script file, or joined by dockerfile_run().
    """
    dest = _check_dest(dest)
    pins = dict(pins or {})
    q = shlex.quote
    lines = ["set -eu", f"mkdir -p {q(dest)}"]
    for s in plan:
        if not _NAME_OK.fullmatch(s.name):
            raise UserError(f"unusable source name {s.name!r}")
        d = _checkout_dir(s, dest)
        lines.append(f"# {s.name}: {s.repository} @ {s.commit or s.url_hash}"
                     + ("" if s.reproducible or s.name in pins else "  (NOT a commit)"))
        lines.append(f"rm -rf {q(d)} && mkdir -p {q(d)}")
        if s.kind == "url":
            algo, _, digest = (s.url_hash or "").partition("=")
            tool = _HASH_TOOLS.get(algo.upper())
            if not tool or not re.fullmatch(r"[0-9a-fA-F]+", digest):
                raise PlanUnusable(f"{s.name}: URL download without a usable URL_HASH "
                                f"({s.url_hash!r}): not reproducible")
            archive = f"{dest}/.{s.name}.archive"
            lines += [
                f"curl -fsSL --retry 3 -o {q(archive)} {q(s.repository)}",
                f"echo {q(digest.lower() + '  ' + archive)} | {tool} -c -",
                f"tar -xf {q(archive)} -C {q(d)} --strip-components=1",
                f"rm -f {q(archive)}",
            ]
            continue
        ref = pins.get(s.name, s.commit)
        exact = bool(_HEX_COMMIT.fullmatch(ref))
        g = f"git -C {q(d)}"
        lines += [
            f"{g} init -q",
            f"{g} remote add origin {q(s.repository)}",
            f"{g} fetch -q --depth 1 origin {q(ref)}",
            f"{g} -c advice.detachedHead=false checkout -q FETCH_HEAD",
        ]
        if exact:
            lines.append(f'if [ "$({g} rev-parse HEAD)" != {q(ref)} ]; then '
                         f'echo "{s.name}: fetched commit is not {ref}" >&2; exit 1; fi')
        else:
            lines.append(f'echo "{s.name}: {ref} resolved to $({g} rev-parse HEAD)"')
        if s.submodules is None:
            lines.append(f"{g} submodule update -q --init --recursive --depth 1")
        elif s.submodules:
            paths = " ".join(q(p) for p in s.submodules)
            lines.append(f"{g} submodule update -q --init --recursive --depth 1 -- {paths}")
    if cmake_overrides:
        body = cmake_overrides_file(plan, dest).splitlines()
        lines.append(f"printf '%s\\n' {' '.join(q(b) for b in body)} > {q(cmake_overrides)}")
    return "\n".join(lines) + "\n"


def dockerfile_run(script: str) -> str:
    """One Dockerfile RUN instruction executing a render_fetch_script() snippet."""
    cmds = [ln for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return "RUN " + " \\\n && ".join(cmds) + "\n"


def override_env(plan: Sequence[ExternalSource], dest: str = "/opt/vllm-deps", *,
                 cmake_args: str = "split-on-whitespace",
                 cmake_overrides: str | None = None) -> dict[str, str]:
    """The variables that point the compile at the fetched sources.

    Environment overrides come back as NAME -> path (set them with ENV). CMake-only overrides
    are collected into one "CMAKE_ARGS" entry of -D flags (join it with any CMAKE_ARGS of your
    own). `cmake_args` is the engine's setup.py behaviour (see cmake_args_mode): with "ignored"
    -D flags cannot reach cmake; then, if `cmake_overrides` names the file that
    render_fetch_script wrote, CMAKE_TOOLCHAIN_FILE points at it, else a UserError says which
    sources cannot be redirected. A source with no override at all is an error too: the
    compile would download it.
    """
    dest = _check_dest(dest)
    env: dict[str, str] = {}
    dflags: list[str] = []
    blocked: list[str] = []
    for s in plan:
        if not s.override_var:
            blocked.append(f"{s.name} (no override variable in the CMake code)")
            continue
        path = _override_path(s, dest)
        if s.override_kind == "env":
            env[s.override_var] = path
        elif cmake_args == "split-on-whitespace":
            dflags.append(f"-D{s.override_var}={path}")
        elif cmake_overrides:
            env["CMAKE_TOOLCHAIN_FILE"] = cmake_overrides
        else:
            blocked.append(f"{s.name} ({s.override_var} is a CMake variable and setup.py "
                           f"{'ignores' if cmake_args == 'ignored' else 'may not pass'} "
                           f"CMAKE_ARGS)")
    if blocked:
        raise PlanUnusable("these sources cannot be redirected to a local checkout: "
                        + "; ".join(blocked))
    if dflags:
        env["CMAKE_ARGS"] = " ".join(dflags)
    return env
