"""Phase 1: CMake source text → commands (the lexer: arguments, brackets, escapes, comments) → blocks
(if/elseif/else, foreach, while, function, macro), as CMake's own grammar reads them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .model import CMakeParseError

@dataclass
class Arg:
    text: str
    quoted: bool  # quoted or bracket argument


@dataclass
class Cmd:
    name: str  # lowercased
    args: list[Arg]
    file: str
    line: int


@dataclass
class If:
    branches: list[tuple[list[Arg] | None, list]]  # (condition or None for else, body)
    file: str
    line: int


@dataclass
class Block:
    kind: str  # foreach | while | function | macro | block
    args: list[Arg]
    body: list
    file: str
    line: int


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


def _lex_args(text: str, i: int, file: str, line: int) -> tuple[list[Arg], int, int]:
    args: list[Arg] = []
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
            args.append(Arg("(", False))
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
            if depth == 0:
                return args, i, line
            args.append(Arg(")", False))
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
            args.append(Arg("".join(buf), True))
        elif c == "[" and _BRACKET_OPEN.match(text, i):
            content, i, line = _skip_bracket(text, i, file, line)
            args.append(Arg(content, True))
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
            args.append(Arg("".join(buf), False))


def lex(text: str, file: str) -> list[Cmd]:
    cmds: list[Cmd] = []
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
            m = IDENT.match(text, i)
            if not m:
                raise CMakeParseError(f"{file}:{line}: unexpected character {c!r}")
            start = line
            i = m.end()
            while i < n and text[i] in " \t":
                i += 1
            if i >= n or text[i] != "(":
                raise CMakeParseError(f"{file}:{line}: expected '(' after {m.group(0)}")
            args, i, line = _lex_args(text, i + 1, file, line)
            cmds.append(Cmd(m.group(0).lower(), args, file, start))
    return cmds


_BLOCK_ENDS = {"foreach": "endforeach", "while": "endwhile", "function": "endfunction",
               "macro": "endmacro", "block": "endblock"}


def structure(cmds: list[Cmd], file: str) -> list:
    """Group flat commands into if-chains and blocks."""
    root: list = []
    stack: list[tuple[object, list]] = [(None, root)]
    for cmd in cmds:
        top, body = stack[-1]
        if cmd.name == "if":
            node = If([(cmd.args, [])], cmd.file, cmd.line)
            body.append(node)
            stack.append((node, node.branches[0][1]))
        elif cmd.name in ("elseif", "else"):
            if not isinstance(top, If):
                raise CMakeParseError(f"{file}:{cmd.line}: {cmd.name}() without if()")
            branch: tuple = (cmd.args if cmd.name == "elseif" else None, [])
            top.branches.append(branch)
            stack[-1] = (top, branch[1])
        elif cmd.name == "endif":
            if not isinstance(top, If):
                raise CMakeParseError(f"{file}:{cmd.line}: endif() without if()")
            stack.pop()
        elif cmd.name in _BLOCK_ENDS:
            node = Block(cmd.name, cmd.args, [], cmd.file, cmd.line)
            body.append(node)
            stack.append((node, node.body))
        elif cmd.name in _BLOCK_ENDS.values():
            if not (isinstance(top, Block) and _BLOCK_ENDS[top.kind] == cmd.name):
                raise CMakeParseError(f"{file}:{cmd.line}: unmatched {cmd.name}()")
            stack.pop()
        else:
            body.append(cmd)
    if len(stack) != 1:
        top = stack[-1][0]
        raise CMakeParseError(f"{file}:{getattr(top, 'line', '?')}: block not closed")
    return root


def walk(nodes: Iterable) -> Iterable[Cmd]:
    """Every command in nodes, all branches and blocks included."""
    for node in nodes:
        if isinstance(node, Cmd):
            yield node
        elif isinstance(node, If):
            for _, body in node.branches:
                yield from walk(body)
        else:
            yield from walk(node.body)


def walk_ifs(nodes: Iterable) -> Iterable[If]:
    for node in nodes:
        if isinstance(node, If):
            yield node
            for _, body in node.branches:
                yield from walk_ifs(body)
        elif isinstance(node, Block):
            yield from walk_ifs(node.body)
