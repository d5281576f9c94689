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


# scheme://user:password@host (a password may hold an @: the userinfo ends at the last @ before the path; one
# slash: a URL joined into a path, as in "--ca-bundle: /here/https:/user:password@host/...")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:/{1,2})[^/\s'\"]*@")
# a registry reference written with credentials and no scheme: user:password@host/...
_BARE_USERINFO = re.compile(r"(?<![\w/@:.-])[^\s/@'\":]+:[^\s/@'\"]*@(?=[\w\[])(?!sha256:|sha512:)")
# the ?query of a URL or a registry reference (tokens, signatures, passwords travel there): each value
# replaced, the names kept
_QUERY = re.compile(r"([^\s?#'\"]*[/:.][^\s?#'\"]*\?)([^\s#'\"]+)")
# the environment variables whose values are secrets: never shown, wherever they would appear
SECRET_VARIABLES = ("BUILDER_REGISTRY_PASSWORD", "BUILDER_INDEX_PASSWORD", "BUILDER_COMPILE_CACHE_PASSWORD",
                    "BUILDER_SCCACHE_DIST_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN",
                    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "TWINE_PASSWORD", "NPM_TOKEN",
                    "BUILDER_LEDGER_SIGNING_KEY")
_KNOWN_SECRETS: set[str] = set()  # passwords read from a docker login (net.registry_credentials)
_SHORTEST_SECRET = 6  # shorter values would mask ordinary words; a password that short is no secret anyway


def _query_values(m: re.Match) -> str:
    fields = [f.split("=", 1)[0] + "=***" if "=" in f else "***" for f in m.group(2).split("&") if f]
    return m.group(1) + "&".join(fields)


def _secrets() -> list[str]:
    found = {os.environ.get(v, "") for v in SECRET_VARIABLES} | _KNOWN_SECRETS
    return sorted((s for s in found if len(s) >= _SHORTEST_SECRET), key=len, reverse=True)


def redact(text: str) -> str:
    """`scheme://user:password@host` → `scheme://***@host` (and `user:password@host` → `***@host`), a URL's
    `?name=value` → `?name=***`, and the value of every secret variable (SECRET_VARIABLES, a docker login's
    password) → `***`, wherever it appears in text. Whatever shortens a value for a message redacts it first
    (`describe`): a cut could leave part of a secret that no pattern recognises any more."""
    text = _QUERY.sub(_query_values, _BARE_USERINFO.sub("***@", _USERINFO.sub(r"\1***@", text)))
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


def describe(value, width: int = 80) -> str:
    """A short, one-line repr for messages: credentials and URL queries redacted first (`redact`), so that no
    cut leaves part of a secret; then long or deeply nested values cut to about `width` characters."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = width
    return short.repr(_redacted(value))
