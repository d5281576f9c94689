"""What a message may say of a value: secrets redacted, long values cut short. The ground floor every message
stands on (the grammar's refusals, the network's errors, the log's filter): it imports nothing of builder.

- `redact`: a URL's user:password@ and query values, a bare user:password@host, and the value of every secret
  variable (SECRET_VARIABLES) and of every password builder read (`remember`: a docker login's), wherever they
  appear in a text;
- `describe`: a short one-line repr of a value, redacted first so that no cut leaves part of a secret.
"""

from __future__ import annotations

import os
import re
import reprlib


def remember(secret: str) -> None:
    """A password builder read (a docker login's): redacted from every later message like a secret variable."""
    _KNOWN_SECRETS.add(secret)


# What is redacted, as three rewrites applied in turn (each to the text the one before left):
# 1. scheme://user:password@host -> scheme://***@host: a scheme ([a-z][a-z0-9+.-]* starting at a word boundary),
#    ':' and one or two slashes (one: a URL joined into a path, as in "--ca-bundle: /here/https:/user:pw@host/..."),
#    then the userinfo, up to the LAST @ before the next '/', whitespace or quote (a password may hold an @);
# 2. user:password@host -> ***@host, a registry reference written with credentials and no scheme: in a run of
#    characters other than whitespace, '/', '@' and quotes that ends at an '@' a host follows (not sha256: or
#    sha512:, a digest), from the run's first character that is no ':' and that no word character, '/', '@', ':',
#    '.' or '-' precedes, when a ':' follows it;
# 3. the ?query of a URL or a registry reference (tokens, signatures, passwords travel there): after a run of
#    characters other than whitespace, '?', '#' and quotes that holds a '/', ':' or '.', each value of the query
#    that follows its '?' (up to whitespace, '#' or a quote) replaced, the names kept.
#
# Each runs in time linear in the text, whatever it holds (a value of megabytes is redacted in well under a second:
# benchmarks/redact.py): the regular expressions below never backtrack over more than one run of characters, and
# each run is read a bounded number of times. They find a rewrite from a character it must hold (the ':' of
# "://", the last ':' before the '@', a '/', ':' or '.' before the '?', or the '?' itself where those are fewer),
# and read the run before it backwards (over the reversed text) to where it starts. (Written as one regular
# expression each, the rules were quadratic or worse: every position of a long run was a new start that read
# the whole run again; 40 KB took seconds, 300 KB minutes. tests/unit/net/test_redact.py holds those expressions as the
# reference every rewrite must equal, on thousands of random texts.)
#
# The character classes are those of the rules: \s and \w are Unicode's (as re reads them in a str pattern) and a
# scheme's letters are what (?i)[a-z] matches, the 52 ASCII letters and U+0130, U+0131, U+017F, U+212A.
_LETTER = "a-zA-Z\u0130\u0131\u017f\u212a"
_SCHEME = _LETTER + "0-9+.\\-"
_USERINFO_AT = re.compile(r"://?+[^/\s'\"@]*+@(?:[^/\s'\"@]*+@)*+")  # from the ':' to the userinfo's last @
_SCHEME_RUN = re.compile(f"[{_SCHEME}]*+")  # over the reversed text: the scheme run before the ':'
_NO_SCHEME_START = re.compile(f"(?:[0-9+.\\-]|(?<=\\w)[{_LETTER}])*+")  # what in that run cannot start a scheme
_BARE_AT = re.compile(r":[^\s/@'\":]*+@(?=[\w\[])(?!sha256:|sha512:)")  # from the run's last ':' to its '@'
_BARE_RUN = re.compile(r"[^\s/@'\"]*+")  # over the reversed text: the run before that ':'
_NO_BARE_START = re.compile(r"(?:(?<=[\w/@:.-])[^\s/@'\"]|:)*+")  # what in that run cannot start credentials
_QUERY_AT = re.compile(r"([/:.][^\s?#'\"/:.]*+\?)([^\s#'\"]+)")  # from the run's last '/', ':' or '.' to the query's end
_QUERY_RUN = re.compile(r"[^\s?#'\"/:.]*+[/:.]")  # over the reversed text: a '/', ':' or '.' in the run before a '?'
_QUERY_VALUES = re.compile(r"[^\s#'\"]+")
# the environment variables whose values are secrets: never shown, wherever they would appear
SECRET_VARIABLES = ("BUILDER_REGISTRY_PASSWORD", "BUILDER_INDEX_PASSWORD", "BUILDER_COMPILE_CACHE_PASSWORD",
                    "BUILDER_SCCACHE_DIST_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN",
                    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "TWINE_PASSWORD", "NPM_TOKEN",
                    "BUILDER_LEDGER_SIGNING_KEY")
_KNOWN_SECRETS: set[str] = set()  # passwords read from a docker login (net.registry_credentials)
_SHORTEST_SECRET = 6  # shorter values would mask ordinary words; a password that short is no secret anyway


def _query_values(query: str) -> str:
    return "&".join(f.split("=", 1)[0] + "=***" if "=" in f else "***" for f in query.split("&") if f)


def _userinfo(text: str) -> str:
    """Rewrite 1: scheme://user:password@host -> scheme://***@host."""
    out, pos, back, n = [], 0, None, len(text)
    for m in _USERINFO_AT.finditer(text) if "@" in text else ():
        colon = m.start()
        back = text[::-1] if back is None else back
        run = colon - (_SCHEME_RUN.match(back, n - colon).end() - (n - colon))
        if _NO_SCHEME_START.match(text, run, colon).end() < colon:  # a letter at a word boundary starts the scheme
            out += (text[pos:colon + (3 if text.startswith("//", colon + 1) else 2)], "***@")
            pos = m.end()
    return "".join(out) + text[pos:] if out else text


def _bare_userinfo(text: str) -> str:
    """Rewrite 2: user:password@host -> ***@host."""
    out, pos, back, n = [], 0, None, len(text)
    for m in _BARE_AT.finditer(text) if "@" in text else ():
        colon = m.start()
        back = text[::-1] if back is None else back
        run = colon - (_BARE_RUN.match(back, n - colon).end() - (n - colon))
        start = _NO_BARE_START.match(text, run, colon).end()
        if start < colon:
            out += (text[pos:start], "***@")
            pos = m.end()
    return "".join(out) + text[pos:] if out else text


def _query(text: str, from_marks: bool | None = None) -> str:
    """Rewrite 3: each value of a ?query -> ***. Found from the '/', ':' and '.' before a '?' (a regular expression
    the engine runs alone), or where '?' are few (`from_marks`: chosen by counting, the cheaper way), from each '?'."""
    marks = text.count("?")
    if not marks:
        return text
    if from_marks is None:
        from_marks = marks * 16 < len(text) // 8 + text.count("/") + text.count(":") + text.count(".")
    if not from_marks:
        return _QUERY_AT.sub(lambda m: m.group(1) + _query_values(m.group(2)), text)
    out, pos, back, n = [], 0, text[::-1], len(text)
    mark = text.find("?")
    while mark >= 0:
        values = _QUERY_VALUES.match(text, mark + 1) if _QUERY_RUN.match(back, n - mark) else None
        if values:
            out += (text[pos:mark + 1], _query_values(values.group()))
            pos = values.end()
        mark = text.find("?", values.end() if values else mark + 1)
    return "".join(out) + text[pos:] if out else text


def _secrets() -> list[str]:
    found = {os.environ.get(v, "") for v in SECRET_VARIABLES} | _KNOWN_SECRETS
    return sorted((s for s in found if len(s) >= _SHORTEST_SECRET), key=len, reverse=True)


def redact(text: str) -> str:
    """`scheme://user:password@host` → `scheme://***@host` (and `user:password@host` → `***@host`), a URL's
    `?name=value` → `?name=***`, and the value of every secret variable (SECRET_VARIABLES, a docker login's
    password) → `***`, wherever it appears in text. Whatever shortens a value for a message redacts it first
    (`describe`): a cut could leave part of a secret that no pattern recognises any more."""
    text = _query(_bare_userinfo(_userinfo(text)))
    for secret in _secrets():
        text = text.replace(secret, "***")
    return text


class RedactingFilter:
    """A logging filter that redacts every record's message (see `redact`)."""

    def filter(self, record) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


def _redacted(value, depth: int = 0):
    """`value` with every string in it redacted (`redact`), as deep as a short repr shows."""
    if isinstance(value, str):
        return redact(value)
    if depth > 6:  # deeper than reprlib.Repr's maxlevel: never shown
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_redacted(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {_redacted(k, depth + 1): _redacted(v, depth + 1) for k, v in value.items()}
    return value


LINE_WIDTH = 990  # the most characters of one line of a message builder prints (clip): with `error: `, under 1,000
MESSAGE_LINES = 100  # and the most lines of it


def clip(message: str, width: int = LINE_WIDTH, lines: int = MESSAGE_LINES) -> str:
    """A message of bounded size, whatever a value it quotes held: a line longer than `width` keeps its head and its
    tail (what to do is said last), the middle replaced by `…[N characters cut]…`; more than `lines` lines keep the
    first and the last ones. The last net under every message the CLI prints (builder/cli/app.py): the checks quote
    a value through `describe`, which says more of it. Redact before clipping (a cut could leave part of a secret
    that no rule recognises any more); clipping a redacted text reveals nothing."""
    count = message.count("\n") + 1
    if len(message) <= width and count <= lines:
        return message
    if count <= lines:
        parts = message.split("\n")
    else:  # the first lines, a mark, the last tenth
        last = max(1, lines // 10)
        parts = [*message.split("\n", lines - last - 1)[:-1], f"…[{count - lines + 1} lines cut]…",
                 *message.rsplit("\n", last)[1:]]
    head, tail = width * 2 // 3, width // 3 - 24
    return "\n".join(p if len(p) <= width else f"{p[:head]}…[{len(p) - head - tail} characters cut]…{p[len(p) - tail:]}"
                     for p in parts)


def describe(value, width: int = 80) -> str:
    """A short, one-line repr for messages: credentials and URL queries redacted first (`redact`), so that no
    cut leaves part of a secret; then long or deeply nested values cut to about `width` characters."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = width
    return short.repr(_redacted(value))
