"""Phase 2: the CMake interpreter. It walks CMakeLists.txt and every file it includes the way a CUDA configure
would (set / include / if with three-valued conditions; what cannot be decided, e.g. a compiler version, is
explored on both sides) and returns every git or URL download with the override that skips it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from .lexer import Arg, Block, Cmd, IDENT, If, lex, structure, walk, walk_ifs
from .model import (CUDA_CONTEXT, FETCH_COMMANDS, FETCHED, HEX_COMMIT, NAME_OK, ROOT, CMakeParseError,
                    ExternalSource)
from .tree import Tree

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
    cmd: Cmd
    kw: dict[str, list[str]]
    guards: list[_Guard]


class _Return(Exception):
    pass


def _cond_key(args: Sequence[Arg]) -> tuple[str, ...]:
    return tuple(a.text for a in args)


def _local_provisions(body: list) -> set[str]:
    """Names of dependencies a branch provides from a local path, without downloading."""
    names: set[str] = set()
    for cmd in walk(body):
        if cmd.name in FETCH_COMMANDS and cmd.args:
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
    def __init__(self, tree: Tree, context: Mapping[str, str], env: Mapping[str, str]):
        self.tree = tree
        self.vars: dict[str, object] = dict(context)  # str, or _Unknown
        self.assumed_unset: set[str] = set()
        self.env = dict(env)
        self.found: list[_Found] = []
        self.made_available: set[str] = set()  # MakeAvailable(name) / Populate(name) one-arg form
        self.guard_stack: list[_Guard] = []
        self.files: dict[str, list] = {}  # visited file -> structured nodes
        self.depth = 0
        for k, v in (("CMAKE_SOURCE_DIR", ROOT), ("PROJECT_SOURCE_DIR", ROOT),
                     ("CMAKE_CURRENT_SOURCE_DIR", ROOT), ("CMAKE_CURRENT_LIST_DIR", ROOT)):
            self.vars.setdefault(k, v)

    # -- files -----------------------------------------------------------------------------
    def load(self, rel: str) -> list:
        if rel not in self.files:
            text = self.tree.read(rel)
            if text is None:
                raise CMakeParseError(f"{self.tree.label}: no {rel}")
            self.files[rel] = structure(lex(text, rel), rel)
        return self.files[rel]

    def run_file(self, rel: str) -> None:
        nodes = self.load(rel)
        saved = self.vars.get("CMAKE_CURRENT_LIST_DIR")
        self.vars["CMAKE_CURRENT_LIST_DIR"] = str(PurePosixPath(ROOT, rel).parent)
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
        if path.startswith(ROOT + "/"):
            path = path[len(ROOT) + 1:]
        elif path.startswith("/") or not path:
            return None
        else:
            base = self.vars.get("CMAKE_CURRENT_SOURCE_DIR")
            base = base if isinstance(base, str) else ROOT
            full = PurePosixPath(base, path).as_posix()
            if not full.startswith(ROOT + "/"):
                return None
            path = full[len(ROOT) + 1:]
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

    def expand_args(self, args: Sequence[Arg]) -> list[tuple[str, bool, bool]]:
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
        if IDENT.fullmatch(text) and not text.upper() in _TRUE_CONSTS | _FALSE_CONSTS:
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

    def evaluate(self, args: Sequence[Arg]) -> bool | None:
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
    def _guard_of(self, cond: list[Arg], body: list, file: str, line: int) -> _Guard | None:
        provides = _local_provisions(body)
        if not provides:
            return None
        words = [a.text for a in cond]
        env_var = cmake_var = None
        if len(words) == 1 and not cond[0].quoted and IDENT.fullmatch(words[0]):
            cmake_var = words[0]
        elif len(words) == 2 and words[0] == "DEFINED":
            m = re.fullmatch(r"ENV\{([A-Za-z_][A-Za-z0-9_]*)\}", words[1])
            if m:
                env_var = m.group(1)
            elif IDENT.fullmatch(words[1]):
                cmake_var = words[1]
        if env_var:
            return _Guard(env_var, ("env",), frozenset(provides), _cond_key(cond), file, line)
        if cmake_var:
            return _Guard(cmake_var, ("cmake",), frozenset(provides), _cond_key(cond), file, line)
        return None

    def _is_default_for_unset(self, cond: list[Arg], body: list) -> bool:
        """`if(NOT DEFINED X)` whose branch sets X: a default for a variable the configure may be given with -D
        (sgl-kernel's GITHUB_ARTIFACTORY, a mirror host). The configure modelled here is builder's, which passes
        no such -D, and X was never assigned before: the default applies."""
        words = [a.text for a in cond]
        if len(words) != 3 or words[:2] != ["NOT", "DEFINED"] or any(a.quoted for a in cond):
            return False
        var = words[2]
        if not IDENT.fullmatch(var) or var in self.vars:
            return False
        return any(c.name == "set" and c.args and c.args[0].text == var for c in walk(body))

    # -- execution -------------------------------------------------------------------------
    def run(self, nodes: list, definite: bool) -> None:
        for node in nodes:
            if isinstance(node, Cmd):
                self.command(node, definite)
            elif isinstance(node, If):
                self.run_if(node, definite)
            elif isinstance(node, Block):
                if node.kind in ("foreach", "while", "block"):
                    self.run(node.body, definite=False if node.kind == "while" else definite)
                # function / macro bodies only run when called: not followed

    def run_if(self, node: If, definite: bool) -> None:
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

    def command(self, cmd: Cmd, definite: bool) -> None:
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
                self.vars["CMAKE_CURRENT_SOURCE_DIR"] = f"{ROOT}/{rel}"
                try:
                    self.run_file(f"{rel}/CMakeLists.txt")
                finally:
                    self.vars = saved
        elif name == "return":
            if definite:
                raise _Return()
        elif name in FETCH_COMMANDS:
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

    def cmd_set(self, cmd: Cmd) -> None:
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

    def cmd_unknown_outputs(self, cmd: Cmd) -> None:
        # Output variables of these commands: mark every plain identifier argument that names
        # a known variable as unknown, except inputs that are obviously keywords.
        for a in cmd.args[1:] if cmd.name in ("list", "string", "file", "math", "cmake_path") \
                else cmd.args:
            t = a.text
            if not a.quoted and IDENT.fullmatch(t) and t in self.vars \
                    and t not in CUDA_CONTEXT and t not in _SPECIAL_DIRS:
                self.vars[t] = _Unknown()

    def _populated(self, name: str) -> None:
        """FetchContent sets <lowercase name>_SOURCE_DIR once a declared download is populated; later code (a
        nested declare, include paths) refers to places inside it."""
        if any(f.name == name for f in self.found):
            self.vars.setdefault(f"{name}_SOURCE_DIR", f"{FETCHED}/{name}")

    def cmd_fetch(self, cmd: Cmd) -> None:
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
        for cmd in walk(nodes):
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
        for node in walk_ifs(nodes):
            conds = [c for c, _ in node.branches]
            if conds[0] is None or _cond_key(conds[0]) != guard.cond or len(node.branches) < 2:
                continue
            over = {c.args[0].text: c.args[1].text for c in walk(node.branches[0][1])
                    if c.name == "set" and len(c.args) >= 2}
            down = {c.args[0].text: c.args[1].text for c in walk(node.branches[-1][1])
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
    return None if text is None else text.replace(ROOT + "/", "")


def _to_source(found: _Found, interp: _Interp, feeds: Mapping[str, set[str]]) -> ExternalSource:
    kw = found.kw
    name = found.name
    if not NAME_OK.fullmatch(name):
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
        reproducible = bool(HEX_COMMIT.fullmatch(commit))
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
    if source_dir and source_dir.startswith(FETCHED + "/"):
        inside = PurePosixPath(source_dir[len(FETCHED) + 1:]).as_posix()
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


def read_plan(tree: Tree, context: Mapping[str, str] | None = None,
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
    return read_plan(Tree.from_dir(Path(root)), context)


def fetch_plan_from_sdist(path: Path, *, context: Mapping[str, str] | None = None
                          ) -> list[ExternalSource]:
    """Same as fetch_plan_from_tree, reading the sdist's members in place (no extraction)."""
    return read_plan(Tree.from_sdist(Path(path)), context)
