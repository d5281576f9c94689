"""builder/redact.py's rules as they were written, one regular expression each: the reference the linear rewrites
must equal (tests/unit/net/test_redact.py), and what benchmarks/redact.py times against them. Quadratic or worse on a long
run of characters: keep the texts given to it short."""

from __future__ import annotations

import re

from builder import redact

REF_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*:/{1,2})[^/\s'\"]*@")
REF_BARE_USERINFO = re.compile(r"(?<![\w/@:.-])[^\s/@'\":]+:[^\s/@'\"]*@(?=[\w\[])(?!sha256:|sha512:)")
REF_QUERY = re.compile(r"([^\s?#'\"]*[/:.][^\s?#'\"]*\?)([^\s#'\"]+)")


def _ref_query_values(m: re.Match) -> str:
    fields = [f.split("=", 1)[0] + "=***" if "=" in f else "***" for f in m.group(2).split("&") if f]
    return m.group(1) + "&".join(fields)


def ref_userinfo(text: str) -> str:
    return REF_USERINFO.sub(r"\1***@", text)


def ref_bare_userinfo(text: str) -> str:
    return REF_BARE_USERINFO.sub("***@", text)


def ref_query(text: str) -> str:
    return REF_QUERY.sub(_ref_query_values, text)


def reference(text: str) -> str:
    """builder.redact.redact as it was: the three expressions in turn, then the secrets."""
    text = ref_query(ref_bare_userinfo(ref_userinfo(text)))
    for secret in redact._secrets():
        text = text.replace(secret, "***")
    return text
