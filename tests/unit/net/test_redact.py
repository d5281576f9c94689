"""Redaction in linear time (builder/redact.py): what a message may say of a value, whatever its length.

The rules were three regular expressions; on a long run of characters each backtracked quadratically or worse (a
refused 300 KB matrix value ran past 120 s, a 40 KB flag value 7 s, a 50 KB engine-data value 38 s). The rewrites
that replace them must say exactly what those expressions said: they are kept as the reference
(tests/redact_reference.py), and every rewrite is compared with it on thousands of random texts drawn from the
characters the rules turn on, and on every case the other tests name. Then 10 MB of each hostile shape is
redacted in seconds (benchmarks/redact.py prints the figures).
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import sys
import time

import pytest

from builder import redact

from tests.redact_reference import ref_bare_userinfo, ref_query, ref_userinfo, reference

REWRITES = [(ref_userinfo, lambda t: redact._userinfo(t)), (ref_bare_userinfo, lambda t: redact._bare_userinfo(t)),
            (ref_query, lambda t: redact._query(t, from_marks=False)), (ref_query, lambda t: redact._query(t, from_marks=True)),
            (reference, redact.redact)]
REWRITE_IDS = ["userinfo", "bare-userinfo", "query-from-separators", "query-from-marks", "redact"]

# every text the other tests redact or describe, and the shapes the rules were written for
CASES = [
    "GET http://user:s3cret@127.0.0.1:8080/simple failed", "--registry 'bob:s3cret@ghcr.io/acme'",
    "debian:12@sha256:" + "a" * 64, "docker.io/x@sha256:aa and a@b.c", "redis://h:6379/0?password=s3cret&db=1",
    "'127.0.0.1:9/cache?token=s3cret' is not", "it takes no ?query or #fragment; is this a registry?",
    "/here/https:/bob:s3cret@h/ca.pem", "https://bob:p@ss@h/x", "bob:s3cr3t-marker-pw@127.0.0.1:5000/builder-test",
    "https://bob:" + "s3cr3t-marker-pw" * 4 + "@mirror.example/simple/x/y", "redis://127.0.0.1:6379/0?password=s3cr3t",
    "https://:s3cr3t@h", "registry:bob:s3cr3t@127.0.0.1:5000/w", "index:http://bob:s3cr3t@127.0.0.1:8080/simple",
    "webdav+https://bob:pw@dav.example/cache", "s3://bucket/prefix?secret=x&region=y", "ftp://cache.example/?token=t",
    "127.0.0.1:5000/builder-test?token=t", "oops: https://u:p@h/x?a=1&b&=c&&d= and bob:pw@[::1]:5000/x",
    "Https://U:P@H/x", "a.b-c+d://u@h", "9x://u@h", "_x://u@h", "é://u@h", "x://a@b@c/d@e", "x:///u@h", "x:/u@h",
    "'x://u@h'", '"bob:pw@h"', "a b:c@d e", "-b:c@d", ".b:c@d", "?b:c@d", "b::c@d", ":b:c@d", "b:c@sha256:x", "b:c@sha512:x",
    "b:c@sha256x", "b:c@-x", "b:c@[x", "u\u212a://p@h", "\u0130\u0131\u017f:c@d", "x.y?z", "x?y.z?w", "a/b?c d?e",
    "a.b?#c", "a.b?'c", "a.b? c", "?", "@", ":", ":/", "://@", "", " ", "\n", "a:/@b",
]

ALPHABET = ":/@?#&=.-+_ '\"\t\nabAB01Ks\u212a\u017f\u0131\u0130\u00e9\u00a0["


def _random_texts(count: int, longest: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest)))
        texts.append(text.replace("s", "sha256:") if rng.random() < 0.1 else text)
    return texts


@contextlib.contextmanager
def within(seconds: float, what: str):
    """Fail (not hang) when the block runs past `seconds`: the old expressions took minutes on these inputs
    (the regular expression engine checks for signals while it backtracks)."""

    def expired(*_):
        raise AssertionError(f"{what}: still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.pure
@pytest.mark.parametrize("ref, new", REWRITES, ids=REWRITE_IDS)
def test_each_rewrite_says_what_the_old_expression_said_on_every_case(ref, new):
    for text in CASES:
        assert new(text) == ref(text), text


@pytest.mark.pure
@pytest.mark.parametrize("ref, new", REWRITES, ids=REWRITE_IDS)
def test_each_rewrite_says_what_the_old_expression_said_on_thousands_of_random_texts(ref, new):
    """Short texts over the characters the rules turn on (and the letters case-folding adds): 6,000 of up to 24
    characters, 1,500 of up to 80, and texts of the cases joined with random separators."""
    texts = _random_texts(6000, 24, seed=1) + _random_texts(1500, 80, seed=2)
    rng = random.Random(3)
    texts += [rng.choice(" /:@?.x'").join(rng.sample(CASES, 4)) for _ in range(500)]
    wrong = [(t, ref(t), new(t)) for t in texts if ref(t) != new(t)]
    assert not wrong, wrong[:5]


@pytest.mark.pure
def test_a_scheme_letter_is_what_the_case_blind_expression_matched_in_all_of_unicode():
    """The rewrites name the letters of (?i)[a-z] one by one (no case folding per character: it is slow): the same
    characters, in all of Unicode."""
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    for folded, named in ((r"(?i)[a-z0-9+.-]", f"[{redact._SCHEME}]"), (r"(?i)[a-z]", f"[{redact._LETTER}]")):
        assert [m.start() for m in re.finditer(folded, everything)] == [m.start() for m in re.finditer(named, everything)]


TAIL = " see x://u:s3cr3t@h/?token=s3cr3t and bob:s3cr3t@127.0.0.1:5000/x "
SHAPES = {  # name -> what is repeated to 10 MB
    "letters": "a", "a-dot": "a.", "a-colon": "a:", "at": "@", "x-mark": "x?", "a-colon-slash": "a:/",
    "spaced": "ab ", "scheme-runs": "h://u", "mixed": "a.b:c/d?e=f@g",
}
MB10 = 10 << 20


@pytest.mark.pure
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_ten_megabytes_of_a_hostile_shape_are_redacted_in_seconds(shape):
    """10 MB of a shape that made the old expressions backtrack, with credentials after it: redacted within 5 s
    (well under 1 s on a quiet machine; the bound leaves room for a loaded one), the credentials gone. The old
    expressions took minutes on 40 KB of most of these."""
    text = shape * (MB10 // len(shape)) + TAIL
    t0 = time.perf_counter()
    with within(5, f"redacting 10 MB of {shape!r}"):
        out = redact.redact(text)
    took = time.perf_counter() - t0
    assert "s3cr3t" not in out, out[-200:]
    assert out.endswith(" see x://***@h/?token=*** and ***@127.0.0.1:5000/x ") and took < 5


@pytest.mark.pure
def test_a_secret_is_still_replaced_wherever_it_stands_in_a_long_value(monkeypatch):
    secret = "plain-s3cr3t-marker"
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", secret)
    monkeypatch.setattr(redact, "_KNOWN_SECRETS", set())
    redact.remember("remembered-pw-0123")
    text = ("a." * (1 << 20)) + secret + ("x?" * (1 << 20)) + "remembered-pw-0123" + "@" * 1000 + secret
    with within(5, "redacting 4 MB holding secrets"):
        out = redact.redact(text)
    assert secret not in out and "remembered-pw-0123" not in out
    plain = "-" * (4 << 20) + secret + " " + "b" * (4 << 20) + " remembered-pw-0123"  # no rule but the secrets
    with within(5, "redacting 8 MB holding secrets"):
        assert redact.redact(plain) == "-" * (4 << 20) + "*** " + "b" * (4 << 20) + " ***"
        assert "***" in redact.describe(secret + "b" * (1 << 20)) and secret not in redact.describe(secret + "b" * (1 << 20))
