"""Globs on cell ids (`--only`, `--skip`): `*`, `?`, `[...]` and `{a,b}` alternatives (nestable).

The pattern is compiled once into a small automaton and matched by simulating all its states at once, so
the time is linear in the pattern length times the id length: 22 `{a,b}` groups cost what one does (expanding
them would be 2**22 globs), and no input makes a backtracking regex explode.
"""

from __future__ import annotations

from .errors import UserError

MAX_PATTERN = 1000


class Glob:
    def __init__(self, pattern: str, where: str = "--only/--skip"):
        if len(pattern) > MAX_PATTERN:
            raise UserError(f"{where}: a pattern of {len(pattern)} characters; cell ids are short (at most {MAX_PATTERN})")
        self.pattern = pattern
        self.where = where
        # states: ("char", c) | ("any",) | ("class", negate, ranges) | ("split", a, b) | ("jump", a) | ("star",) | ("end",)
        self.ops: list = []
        self.pos = 0
        self._alternatives(top=True)
        self.ops.append(("end",))

    # -- compile -------------------------------------------------------------------------------------------
    def _fail(self, why: str):
        raise UserError(f"{self.where}: {self.pattern!r}: {why}")

    def _emit(self, op) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def _alternatives(self, top: bool) -> None:
        """Sequence (',' sequence)* up to '}' (or the end at top level), as split/jump ops."""
        jumps = []
        while True:
            split = None if top else self._emit(None)  # patched below once the branch length is known
            self._sequence(top)
            if top:
                return
            if self.pos >= len(self.pattern):
                self._fail("a '{' is never closed")
            c = self.pattern[self.pos]
            self.pos += 1
            if c == "}":
                self.ops[split] = ("jump", split + 1)  # the last branch: no alternative left
                for j in jumps:
                    self.ops[j] = ("jump", len(self.ops))
                return
            jumps.append(self._emit(None))  # c == ",": end of this branch, jump past the group
            self.ops[split] = ("split", split + 1, len(self.ops))

    def _sequence(self, top: bool) -> None:
        p = self.pattern
        while self.pos < len(p):
            c = p[self.pos]
            if not top and c in ",}":
                return
            self.pos += 1
            if c == "*":
                self._emit(("star",))
            elif c == "?":
                self._emit(("any",))
            elif c == "[":
                self._class()
            elif c == "{":
                self._alternatives(top=False)
            elif c == "}" and top:
                self._fail("a '}' without its '{'")
            else:
                self._emit(("char", c))

    def _class(self) -> None:
        p, i = self.pattern, self.pos
        negate = i < len(p) and p[i] in "!^"
        if negate:
            i += 1
        ranges = []
        first = True
        while i < len(p) and (first or p[i] != "]"):
            first = False
            lo = p[i]
            if i + 2 < len(p) and p[i + 1] == "-" and p[i + 2] != "]":
                ranges.append((lo, p[i + 2]))
                i += 3
            else:
                ranges.append((lo, lo))
                i += 1
        if i >= len(p):  # like fnmatch: an unclosed '[' is a literal '['
            self._emit(("char", "["))
            return
        self.pos = i + 1
        self._emit(("class", negate, tuple(ranges)))

    # -- match ---------------------------------------------------------------------------------------------
    def _closure(self, states: set[int], start: int) -> None:
        stack = [start]
        while stack:
            s = stack.pop()
            if s in states:
                continue
            states.add(s)
            op = self.ops[s]
            if op[0] == "split":
                stack += [op[1], op[2]]
            elif op[0] == "jump":
                stack.append(op[1])
            elif op[0] == "star":
                stack.append(s + 1)  # '*' may match nothing

    def match(self, text: str) -> bool:
        current: set[int] = set()
        self._closure(current, 0)
        for ch in text:
            nxt: set[int] = set()
            for s in current:
                op = self.ops[s]
                kind = op[0]
                if kind == "star":
                    self._closure(nxt, s)  # stay on '*'
                elif kind == "any" or (kind == "char" and op[1] == ch) or (
                        kind == "class" and op[1] != any(lo <= ch <= hi for lo, hi in op[2])):
                    self._closure(nxt, s + 1)
            if not nxt:
                return False
            current = nxt
        return any(self.ops[s][0] == "end" for s in current)
